"""Learning-rate schedules: conformance vectors, the shape of each schedule, the spec's checks."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from commitments.spec import OptimizerSpec, Spec, SpecError
from oracle.schedule import PI, ScheduleError, cos64, lr_at
from tests.oracle.vectors.make_schedule_vectors import PATH, build

VECTORS = json.loads(Path(PATH).read_text())


def f64(h: str) -> float:
    return struct.unpack(">d", bytes.fromhex(h))[0]


def h64(v: float) -> str:
    return struct.pack(">d", v).hex()


def test_cos64_reproduces_its_conformance_vectors():
    got = [h64(cos64(f64(x))) for x in VECTORS["cos64"]["x"]]
    assert got == VECTORS["cos64"]["y"]


def test_schedules_reproduce_their_conformance_vectors():
    for case in VECTORS["schedules"]:
        opt = OptimizerSpec(**case["optimizer"])
        assert [h64(lr_at(opt, t)) for t in case["steps"]] == case["lr"], case["optimizer"]


def test_the_vector_file_is_what_the_definitions_write():
    assert build() == VECTORS


def test_cos64_is_accurate_on_the_schedules_range():
    worst = max(abs(cos64(PI * k / 4096) - math.cos(PI * k / 4096)) for k in range(4097))
    assert worst <= 2.3e-16
    assert cos64(0.0) == 1.0 and cos64(PI) == -1.0 and cos64(-1.25) == cos64(1.25)
    assert math.isnan(cos64(math.inf)) and math.isnan(cos64(math.nan))


def test_constant_schedule_is_the_spec_lr_bit_for_bit():
    opt = OptimizerSpec(lr=3e-4)
    assert all(lr_at(opt, t) == 3e-4 for t in (1, 2, 77, 2**32 - 1))


def test_warmup_ramps_linearly_to_the_peak():
    opt = OptimizerSpec(lr=1e-3, warmup_steps=8)
    rates = [lr_at(opt, t) for t in range(1, 12)]
    assert rates[0] == 1e-3 * (1 / 8) and rates[7] == 1e-3 and rates[8:] == [1e-3] * 3
    assert all(a < b for a, b in zip(rates[:7], rates[1:8], strict=True))


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_follows_its_closed_form_to_the_floor(kind):
    w, d, lr, floor = 10, 110, 6e-4, 6e-5
    opt = OptimizerSpec(lr=lr, schedule=kind, warmup_steps=w, decay_steps=d, min_lr=floor)
    for t in range(w + 1, d):
        r = (t - w) / (d - w)
        c = 0.5 * (1 + math.cos(math.pi * r)) if kind == "cosine" else 1 - r
        assert lr_at(opt, t) == pytest.approx(floor + c * (lr - floor), rel=1e-15, abs=1e-20)
    decay = [lr_at(opt, t) for t in range(w, d + 1)]
    assert decay[0] == lr and decay[-1] == floor
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False))
    assert lr_at(opt, d + 1) == lr_at(opt, 10**9) == floor
    mid = lr_at(opt, (w + d) // 2)
    assert mid == pytest.approx((lr + floor) / 2, rel=1e-15)


def test_bad_steps_are_refused():
    opt = OptimizerSpec()
    for t in (0, -1, 1.0, True):
        with pytest.raises(ScheduleError, match="step"):
            lr_at(opt, t)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"schedule": "cosine"}, "decay_steps"),
    ({"schedule": "linear", "warmup_steps": 10, "decay_steps": 10}, "decay_steps"),
    ({"schedule": "cosine", "decay_steps": 10, "min_lr": 1.0}, "min_lr"),
    ({"decay_steps": 100}, "no effect"),
    ({"min_lr": 1e-5}, "no effect"),
    ({"schedule": "step"}, "schedule"),
    ({"warmup_steps": -1}, "warmup_steps"),
])
def test_inconsistent_schedules_are_refused(fields, reason):
    with pytest.raises(SpecError, match=reason):
        Spec.from_dict({"optimizer": fields})


def test_a_schedule_is_committed_by_the_spec():
    plain = Spec()
    cos = Spec.from_dict({"optimizer": {"schedule": "cosine", "decay_steps": 100}})
    assert cos.digest() != plain.digest()
    assert cos.canonical()["optimizer"]["schedule"] == "cosine"
    assert Spec.from_cbor(cos.to_cbor()) == cos


@pytest.mark.usefixtures("single_thread")
def test_a_torch_native_walk_with_schedule_and_masked_decay_tracks_torch_adamw_and_lambdalr():
    """Ten torch-native steps of the MLP model (warm-up, cosine decay to a floor, decay masked by
    role, clipping) against the same model in plain torch with torch.optim.AdamW and a LambdaLR."""
    import torch
    import torch.nn.functional as F

    from oracle import models
    from oracle.step import init_state, step

    lr, floor, w, d, wd = 1e-2, 1e-3, 3, 9, 0.1
    spec = Spec.from_dict({
        "profile": "torch-native", "hardware": {"device": "cpu"},
        "model": {"kind": "mlp", "vocab_size": 32, "block_size": 8, "n_embd": 16, "hidden": [24]},
        "optimizer": {"lr": lr, "weight_decay": wd, "grad_clip": 1.0, "schedule": "cosine",
                      "warmup_steps": w, "decay_steps": d, "min_lr": floor},
        "batch": {"batch_size": 4, "seq_len": 8}})

    def factor(epoch: int) -> float:
        t = epoch + 1
        if t <= w:
            return t / w
        if t >= d:
            return floor / lr
        return (floor + 0.5 * (1 + math.cos(math.pi * (t - w) / (d - w))) * (lr - floor)) / lr

    st = init_state(spec)
    roles = {p.name: p.role for p in models.build(spec.model).param_specs()}
    ref = {n: p.clone().requires_grad_(True) for n, p in st.params().items()}
    topt = torch.optim.AdamW(
        [{"params": [ref[n] for n in ref if roles[n] in ("matrix", "embedding")], "weight_decay": wd},
         {"params": [ref[n] for n in ref if roles[n] in ("bias", "norm")], "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(topt, factor)
    g = torch.Generator().manual_seed(11)  # test data only
    for t in range(1, 11):
        batch = torch.randint(0, 32, (4, 9), generator=g)
        st, loss = step(st, batch, spec, t)
        x = F.gelu(F.linear(F.embedding(batch[:, :-1], ref["wte"]), ref["fc.0.weight"], ref["fc.0.bias"]),
                   approximate="tanh")
        logits = F.linear(x, ref["head.weight"], ref["head.bias"])
        ref_loss = F.cross_entropy(logits.reshape(-1, 32), batch[:, 1:].reshape(-1))
        topt.zero_grad()
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ref.values()), 1.0)
        topt.step()
        sched.step()
        assert float(loss) == pytest.approx(float(ref_loss.detach()), rel=1e-5)
    for n, p in st.params().items():
        assert torch.allclose(p, ref[n].detach(), rtol=1e-4, atol=1e-6), n
