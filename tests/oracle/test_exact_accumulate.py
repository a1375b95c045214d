"""Micro-batch accumulation: 1, 2 and 4 micro-batches give the same gradient and loss bytes."""

from __future__ import annotations

import pytest
import torch

from oracle.exact import ExactError, ExactGradAccumulator, ops
from oracle.exact.accumulate import Fold
from oracle.exact.grads import micro_batch_grads
from tests.oracle.vectors.edge import bits

B, T, C, V, H = 8, 6, 16, 20, 2


def _params(seed: int, tied: bool):
    g = torch.Generator().manual_seed(seed)

    def n(*shape, std=0.3):
        return (torch.randn(shape, generator=g) * std).float()
    p = {
        "wte": n(V, C), "wpe": n(T, C),
        "ln1.w": 1 + n(C, std=0.1), "ln1.b": n(C, std=0.1),
        "qkv.w": n(3 * C, C), "qkv.b": n(3 * C, std=0.1),
        "fc.w": n(4 * C, C), "fc.b": n(4 * C, std=0.1),
        "proj.w": n(C, 4 * C), "proj.b": n(C, std=0.1),
        "lnf.w": 1 + n(C, std=0.1), "lnf.b": n(C, std=0.1),
    }
    if not tied:
        p["head.w"] = n(V, C)
    return {k: v.requires_grad_(True) for k, v in p.items()}


def _forward(P, idx, variant, drop_mask=None):
    b, t = idx.shape
    pos = torch.arange(t).expand(b, t)
    x = ops.add(ops.embedding(idx, P["wte"]), ops.embedding(pos, P["wpe"]))
    h = ops.layer_norm(x, P["ln1.w"], P["ln1.b"])
    qkv = ops.linear(h, P["qkv.w"], P["qkv.b"], variant=variant)
    q, k, v = (z.reshape(b, t, H, C // H).transpose(1, 2) for z in qkv.split(C, dim=2))
    if drop_mask is None:
        y = ops.causal_attention(q, k, v, variant=variant)
    else:
        y = ops.causal_attention(q, k, v, variant=variant, dropout_p=0.25, dropout_mask=drop_mask)
    x = ops.add(x, y.transpose(1, 2).reshape(b, t, C))
    h = ops.gelu(ops.linear(x, P["fc.w"], P["fc.b"], variant=variant), "tanh")
    x = ops.add(x, ops.linear(h, P["proj.w"], P["proj.b"], variant=variant))
    x = ops.layer_norm(x, P["lnf.w"], P["lnf.b"])
    head = P.get("head.w", P["wte"])
    return ops.linear(x, head, None, variant=variant)


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (B, T), generator=g)
    tgt = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, H, T, T, generator=g) > 0.25
    return idx, tgt, mask


def _step(P, idx, tgt, n_micro, variant, mask=None):
    for p in P.values():
        p.grad = None
    names = list(P)
    acc = ExactGradAccumulator([P[n] for n in names])
    per = B // n_micro
    for i in range(n_micro):
        lo, hi = i * per, (i + 1) * per
        with acc.micro_batch():
            logits = _forward(P, idx[lo:hi], variant, None if mask is None else mask[lo:hi])
            loss = ops.cross_entropy(logits, tgt[lo:hi], total_count=B * T)
            loss.backward()
    return acc.loss(), dict(zip(names, acc.grads(), strict=True)), acc


@pytest.mark.parametrize("variant", ["single", "hilo"])
@pytest.mark.parametrize("tied", [True, False])
def test_micro_batches_give_identical_bytes(variant, tied):
    P = _params(1, tied)
    idx, tgt, mask = _data(2)
    results = [_step(P, idx, tgt, m, variant, mask) for m in (1, 2, 4)]
    loss0, grads0, acc0 = results[0]
    assert acc0.inexact_count == 0
    assert all(p.grad is None for p in P.values())
    for loss, grads, acc in results[1:]:
        assert bits(loss) == bits(loss0)
        assert acc.inexact_count == 0
        for n in grads0:
            assert torch.equal(bits(grads[n]), bits(grads0[n])), n
    # every parameter got a (non-zero) gradient
    assert all(bool((g != 0).any()) for g in grads0.values())


def test_accumulated_gradients_match_autograd_path_and_float64():
    # Without an accumulator, parameters used once get the same bytes from plain autograd.
    P = _params(3, tied=False)
    idx, tgt, _ = _data(4)
    loss_acc, grads, _ = _step(P, idx, tgt, 2, "single")
    for p in P.values():
        p.grad = None
    loss = ops.cross_entropy(_forward(P, idx, "single"), tgt)
    loss.backward()
    assert bits(loss) == bits(loss_acc)
    for n, p in P.items():
        assert torch.equal(bits(p.grad), bits(grads[n])), n
    # and the gradients are close to a float64 autograd reference of the same network
    P64 = {n: p.detach().double().requires_grad_(True) for n, p in P.items()}
    logits = _ref_forward(P64, idx)
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    ref.backward()
    assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item())
    for n, p in P64.items():
        err = (grads[n].double() - p.grad).abs().max().item()
        assert err <= 1e-5 * p.grad.abs().max().item() + 1e-9, (n, err)


def _ref_forward(P, idx):
    import torch.nn.functional as F
    b, t = idx.shape
    x = P["wte"][idx] + P["wpe"][torch.arange(t)].expand(b, t, C)
    h = F.layer_norm(x, (C,), P["ln1.w"], P["ln1.b"], 1e-5)
    qkv = F.linear(h, P["qkv.w"], P["qkv.b"])
    q, k, v = (z.reshape(b, t, H, C // H).transpose(1, 2) for z in qkv.split(C, dim=2))
    att = (q @ k.transpose(-2, -1)) / (C // H) ** 0.5
    att = att.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    x = x + (att @ v).transpose(1, 2).reshape(b, t, C)
    x = x + F.linear(F.gelu(F.linear(x, P["fc.w"], P["fc.b"]), approximate="tanh"), P["proj.w"], P["proj.b"])
    x = F.layer_norm(x, (C,), P["lnf.w"], P["lnf.b"], 1e-5)
    return F.linear(x, P["head.w"])


def test_micro_batch_grads_helper_and_uneven_splits():
    P = _params(5, tied=True)
    idx, tgt, mask = _data(6)

    def fwd(leaves, lo, hi):
        return _forward(leaves, idx[lo:hi], "single", mask[lo:hi])
    loss1, g1 = micro_batch_grads(fwd, P, tgt, [(0, B)])
    loss3, g3 = micro_batch_grads(fwd, P, tgt, [(0, 3), (3, 4), (4, B)])  # uneven
    assert bits(loss1) == bits(loss3)
    for a, b in zip(g1, g3, strict=True):
        assert torch.equal(bits(a), bits(b))
    ref_loss, ref_grads, _ = _step(P, idx, tgt, 1, "single", mask)
    assert bits(loss1) == bits(ref_loss)
    assert all(torch.equal(bits(a), bits(ref_grads[n])) for a, n in zip(g1, P, strict=True))
    with pytest.raises(ExactError, match="consecutive"):
        micro_batch_grads(fwd, P, tgt, [(0, 3), (4, B)])
    with pytest.raises(ExactError, match="cover"):
        micro_batch_grads(fwd, P, tgt, [(0, 3)])


def test_gradient_outside_exact_ops_is_refused():
    w = torch.randn(4, 3, requires_grad=True)
    acc = ExactGradAccumulator([w])
    with acc.micro_batch():
        (w * 2).sum().backward()
    with pytest.raises(ExactError, match="outside the exact ops"):
        acc.grads()


def test_nested_micro_batches_and_bad_params_are_refused():
    w = torch.randn(2, 2, requires_grad=True)
    acc = ExactGradAccumulator([w])
    with acc.micro_batch(), pytest.raises(ExactError, match="already open"):
        with acc.micro_batch():
            pass
    with pytest.raises(ExactError, match="float32"):
        ExactGradAccumulator([torch.zeros(2, dtype=torch.float64)])
    with pytest.raises(ExactError, match="no cross_entropy"):
        acc.loss()


def test_fold_is_exact_across_magnitudes_and_rounds_once():
    # 1 + 2^-60 - 1 folded in order: the small term survives in lo and decides nothing here,
    # but 2^24 + 1 + 2^-40 rounds up only if the tiny term is kept.
    f = Fold((), "cpu")
    for v in (2.0**24, 1.0, 2.0**-40):
        f.add(torch.tensor(v, dtype=torch.float64))
    assert f.result().item() == 2.0**24 + 2
    assert f.inexact == 0
    g = Fold((), "cpu")
    for v in (1e30, 1.0, -1e30):
        g.add(torch.tensor(v, dtype=torch.float64))
    assert g.result().item() == 1.0
    h = Fold((2,), "cpu")
    h.add(torch.tensor([float("inf"), 1.0], dtype=torch.float64))
    h.add(torch.tensor([1.0, float("nan")], dtype=torch.float64))
    r = h.result()
    assert r[0].item() == float("inf") and bits(r[1:]).item() == 0x7FC00000
