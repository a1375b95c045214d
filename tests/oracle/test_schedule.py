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
