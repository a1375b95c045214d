"""The exact-v1 optimizers follow torch.optim's algorithms (to float32 rounding) in a fixed order."""

from __future__ import annotations

import math

import pytest
import torch

from commitments.spec import OptimizerSpec, Spec
from oracle import native, optim


def _problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    names = ["w", "b"]
    params = [torch.randn(6, 5, generator=g), torch.randn(5, generator=g)]
    grads = [[torch.randn(6, 5, generator=g), torch.randn(5, generator=g)] for _ in range(5)]
    return names, params, grads


def test_pow_int_is_square_and_multiply():
    assert optim.pow_int(0.9, 0) == 1.0
    assert optim.pow_int(0.9, 1) == 0.9
    assert optim.pow_int(0.9, 5) == ((0.9 * 0.9) * (0.9 * 0.9)) * 0.9
    assert abs(optim.pow_int(0.999, 1000) - 0.999**1000) < 1e-14


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_tracks_torch(wd):
    spec = OptimizerSpec(kind="adamw", lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=wd)
    names, params, grads = _problem()
    ref = [p.clone().requires_grad_(True) for p in params]
    topt = torch.optim.AdamW(
        [{"params": [ref[0]], "weight_decay": wd}, {"params": [ref[1]], "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    cur = [p.clone() for p in params]
    moments = {
        "exp_avg": [torch.zeros_like(p) for p in params],
        "exp_avg_sq": [torch.zeros_like(p) for p in params],
    }
    for t, g in enumerate(grads, start=1):
        for r, gi in zip(ref, g, strict=True):
            r.grad = gi.clone()
        topt.step()
        cur, moments = optim.update(spec, t, names, cur, g, moments)
    for a, r in zip(cur, ref, strict=True):
        assert torch.allclose(a, r.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(cur[0], params[0])


def test_sgd_tracks_torch():
    spec = OptimizerSpec(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01)
    names, params, grads = _problem(1)
    ref = [p.clone().requires_grad_(True) for p in params]
    topt = torch.optim.SGD(
        [{"params": [ref[0]], "weight_decay": 0.01}, {"params": [ref[1]], "weight_decay": 0.0}],
        lr=0.05,
        momentum=0.9,
    )
    cur = [p.clone() for p in params]
    moments = {"momentum": [torch.zeros_like(p) for p in params]}
    for t, g in enumerate(grads, start=1):
        for r, gi in zip(ref, g, strict=True):
            r.grad = gi.clone()
        topt.step()
        cur, moments = optim.update(spec, t, names, cur, g, moments)
    for a, r in zip(cur, ref, strict=True):
        assert torch.allclose(a, r.detach(), rtol=1e-5, atol=1e-6)


def test_adamw_order_of_operations_is_the_documented_one():
    # One step written out with float32 numpy-free torch ops, line by line as in docs/exact-v1.md.
    spec = OptimizerSpec(kind="adamw", lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.5)
    p = torch.tensor([[0.5, -1.25], [3.0, 1e-3]])
    g = torch.tensor([[0.1, -0.2], [7.0, -1e-4]])
    m = torch.tensor([[0.01, 0.02], [-0.03, 0.0]])
    v = torch.tensor([[1e-4, 2e-4], [3e-4, 0.0]])
    t = 3
    f = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    pw = p * f(1 - 3e-3 * 0.5)
    m2 = f(0.8) * m + f(1 - 0.8) * g
    v2 = f(0.99) * v + f(1 - 0.99) * (g * g)
    bc1 = 1 - 0.8 * 0.8 * 0.8
    bc2 = 1 - 0.99 * 0.99 * 0.99
    d = torch.sqrt(v2) / f(math.sqrt(bc2)) + f(1e-6)
    want = pw - (m2 / d) * f(3e-3 / bc1)
    (got,), mom = optim.update(spec, t, ["w"], [p], [g], {"exp_avg": [m], "exp_avg_sq": [v]})
    assert torch.equal(got, want)
    assert torch.equal(mom["exp_avg"][0], m2) and torch.equal(mom["exp_avg_sq"][0], v2)


def test_clip_matches_torch_clip_grad_norm():
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(10, 10, generator=g) * 3, torch.randn(7, generator=g)]
    clipped, norm = optim.clip(native, [x.clone() for x in grads], 1.0)
    ps = [torch.zeros_like(x, requires_grad=True) for x in grads]
    for p, x in zip(ps, grads, strict=True):
        p.grad = x.clone()
    ref_norm = torch.nn.utils.clip_grad_norm_(ps, 1.0)
    assert torch.allclose(norm, ref_norm, rtol=1e-6)
    for c, p in zip(clipped, ps, strict=True):
        assert torch.allclose(c, p.grad, rtol=1e-6, atol=1e-7)
    small = [x * 1e-3 for x in grads]
    same, _ = optim.clip(native, small, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(same, small, strict=True))  # coef is exactly 1
    untouched, _ = optim.clip(native, grads, 0.0)
    assert all(a is b for a, b in zip(untouched, grads, strict=True))


@pytest.mark.parametrize("which", ["exact", "native"])
def test_owned_clip_scales_in_place_to_the_same_bytes(which):
    from oracle.exact import ops as exact_ops
    ops = exact_ops if which == "exact" else native
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(64, 33, generator=g) * 7, torch.randn(5, generator=g),
             torch.randn(3, 4, generator=g).t()]  # the last one is not contiguous
    want, want_norm = optim.clip(ops, [x.clone() for x in grads], 1.0)
    mine = [x.clone() for x in grads]
    got, norm = optim.clip(ops, mine, 1.0, owned=True)
    assert torch.equal(norm, want_norm) and bool(norm > 1.0)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert got[0] is mine[0] and got[1] is mine[1]  # scaled in place
    assert got[2] is not mine[2] and torch.equal(mine[2], grads[2])  # a strided one is copied


def test_nonfinite_gradient_poisons_the_update():
    grads = [torch.tensor([1.0, float("inf")])]
    clipped, norm = optim.clip(native, grads, 1.0)
    assert torch.isinf(norm)
    assert torch.isnan(clipped[0]).all()


def test_refusals():
    with pytest.raises(optim.OptimError, match="step must be >= 1"):
        optim.update(OptimizerSpec(), 0, ["w"], [torch.zeros(1)], [torch.zeros(1)],
                     {"exp_avg": [torch.zeros(1)], "exp_avg_sq": [torch.zeros(1)]})
    with pytest.raises(optim.OptimError, match="needs moments"):
        optim.update(
            OptimizerSpec(), 1, ["w"], [torch.zeros(1)], [torch.zeros(1)], {"momentum": [torch.zeros(1)]}
        )


def _gpt_problem(seed=3):
    from oracle import models

    cfg = Spec().model.model_copy(update={"vocab_size": 32, "block_size": 8, "n_layer": 1, "n_head": 2,
                                          "n_embd": 8, "tie_weights": False})
    specs = models.build(cfg).param_specs()
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(p.shape, generator=g) * 0.1 for p in specs]
    grads = [[torch.randn(p.shape, generator=g) for p in specs] for _ in range(14)]
    return specs, params, grads


def test_gpt_roles_mask_decay_to_matrices_and_embeddings():
    specs, _, _ = _gpt_problem()
    assert all(p.role is not None for p in specs)
    decayed = {p.name for p in specs if optim.decays(p.role, p.shape)}
    assert {"wte", "wpe", "lm_head.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_proj.weight"} <= decayed
    assert not any(n.endswith(".bias") or ".ln_" in n or n.startswith("ln_f") for n in decayed)
    # for these models the role rule and the rule of earlier specs (>= 2 dims) agree: same digests
    assert all(optim.decays(p.role, p.shape) == (len(p.shape) >= 2) for p in specs)
    with pytest.raises(optim.OptimError, match="role"):
        optim.decays("gain", (4,))


def test_llama_declares_a_role_for_every_parameter():
    from oracle import models

    cfg = Spec.from_dict({"model": {"kind": "llama", "vocab_size": 32, "block_size": 8, "n_layer": 1,
                                    "n_head": 2, "n_kv_head": 1, "n_embd": 8, "intermediate_size": 12,
                                    "tie_weights": False}, "batch": {"seq_len": 8}}).model
    specs = models.build(cfg).param_specs()
    assert all(p.role is not None for p in specs)
    assert {p.name for p in specs if not optim.decays(p.role, p.shape)} == {
        "layers.0.input_layernorm.weight", "layers.0.post_attention_layernorm.weight", "norm.weight"}


def test_a_role_overrides_the_shape_rule():
    spec = OptimizerSpec(kind="sgd", lr=0.5, momentum=0.0, weight_decay=0.5, grad_clip=0.0)
    p, g = torch.ones(2, 2), torch.zeros(2, 2)
    (kept,), _ = optim.update(spec, 1, ["w"], [p], [g], {"momentum": [torch.zeros(2, 2)]}, ["norm"])
    (decayed,), _ = optim.update(spec, 1, ["w"], [p], [g], {"momentum": [torch.zeros(2, 2)]}, ["matrix"])
    assert torch.equal(kept, p) and torch.equal(decayed, torch.full((2, 2), 0.75))
    with pytest.raises(optim.OptimError, match="roles"):
        optim.update(spec, 1, ["w"], [p], [g], {"momentum": [g]}, [])


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_scheduled_adamw_with_masked_decay_tracks_torch_lambdalr(kind):
    """The update both profiles run, with a warm-up, a decay to a floor and decay masked by role,
    against torch.optim.AdamW in two parameter groups driven by a LambdaLR (math.cos inside)."""
    lr, floor, w, d, wd = 1e-2, 1e-3, 4, 12, 0.1
    spec = OptimizerSpec(kind="adamw", lr=lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=wd,
                         schedule=kind, warmup_steps=w, decay_steps=d, min_lr=floor)

    def factor(epoch: int) -> float:  # LambdaLR counts from 0 before the first step
        t = epoch + 1
        if t <= w:
            return t / w
        if t >= d:
            return floor / lr
        r = (t - w) / (d - w)
        c = 0.5 * (1 + math.cos(math.pi * r)) if kind == "cosine" else 1 - r
        return (floor + c * (lr - floor)) / lr

    specs, params, grads = _gpt_problem()
    roles = [p.role for p in specs]
    ref = [p.clone().requires_grad_(True) for p in params]
    dec = [r for r, p in zip(ref, specs, strict=True) if optim.decays(p.role, p.shape)]
    nodec = [r for r, p in zip(ref, specs, strict=True) if not optim.decays(p.role, p.shape)]
    topt = torch.optim.AdamW([{"params": dec, "weight_decay": wd}, {"params": nodec, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(topt, factor)
    names = [p.name for p in specs]
    cur = [p.clone() for p in params]
    moments = {
        "exp_avg": [torch.zeros_like(p) for p in params],
        "exp_avg_sq": [torch.zeros_like(p) for p in params],
    }
    for t, g in enumerate(grads, start=1):
        assert topt.param_groups[0]["lr"] == pytest.approx(optim.lr_at(spec, t), rel=1e-14)
        for r, gi in zip(ref, g, strict=True):
            r.grad = gi.clone()
        topt.step()
        sched.step()
        cur, moments = optim.update(spec, t, names, cur, g, moments, roles)
    for a, r, p in zip(cur, ref, specs, strict=True):
        assert torch.allclose(a, r.detach(), rtol=1e-5, atol=1e-6), p.name
    norms = [i for i, p in enumerate(specs) if p.role == "norm"]
    # a norm gain moved by Adam alone: decay would have shrunk it by a further factor
    assert norms and all(not torch.equal(cur[i], params[i]) for i in norms)
