"""The norm bucket: exact, monotone, and sensitive to the update of a step."""

from __future__ import annotations

import math

import pytest
import torch

from commitments.spec import Spec
from oracle.norm_bucket import (
    NONFINITE_BUCKET,
    RESOLUTION,
    ZERO_BUCKET,
    NormBucketError,
    bucket_of,
    norm_bucket,
    update_sq_norm,
)
from oracle.step import init_state, step

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = Spec.from_dict({
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 8, "vocab_size": 32},
    "batch": {"batch_size": 2, "seq_len": 8},
})


def test_bucket_values():
    R = 64
    assert bucket_of(1.0, R) == 0
    assert bucket_of(2.0, R) == R
    assert bucket_of(1.5, R) == R // 2
    assert bucket_of(0.75, R) == -R + R // 2
    assert bucket_of(math.nextafter(2.0, 0), R) == R - 1
    assert bucket_of(2.0**-149, R) == -149 * R  # the smallest float32 subnormal
    assert bucket_of(0.0, R) == ZERO_BUCKET
    assert bucket_of(math.inf, R) == bucket_of(math.nan, R) == NONFINITE_BUCKET


def test_bucket_is_monotone_and_about_log2():
    g = torch.Generator().manual_seed(1)
    xs = sorted(torch.exp(torch.randn(2000, generator=g, dtype=torch.float64) * 20).tolist())
    bs = [bucket_of(x) for x in xs]
    assert bs == sorted(bs)
    for x, b in zip(xs, bs, strict=True):
        # the piecewise-linear log2 is within 0.0861 of log2, and flooring loses under 1/R
        assert abs(b / RESOLUTION - math.log2(x)) < 0.0861 + 1 / RESOLUTION


def test_resolution_must_be_a_power_of_two():
    with pytest.raises(NormBucketError, match="power of two"):
        bucket_of(1.0, 3)
    with pytest.raises(NormBucketError, match="power of two"):
        bucket_of(1.0, 0)


def test_norm_bucket_of_a_step():
    before = init_state(SPEC)
    batch = torch.arange(2 * 9).reshape(2, 9) % 32
    after, _ = step(before, batch, SPEC, 1)
    s = update_sq_norm(before.params(), after.params())
    ref = sum(
        float(((after.params()[n].double() - p.double()) ** 2).sum()) for n, p in before.params().items()
    )
    assert s.dtype == torch.float32
    assert abs(float(s) - ref) <= 1e-6 * ref
    b = norm_bucket(before, after)
    assert b == bucket_of(float(s))
    assert norm_bucket(before, before) == ZERO_BUCKET
    other, _ = step(before, (batch + 1) % 32, SPEC, 1)
    assert update_sq_norm(before.params(), other.params()) != s


def test_mismatched_states_are_refused():
    a = init_state(SPEC).params()
    b = dict(a)
    b.pop("wte")
    with pytest.raises(NormBucketError, match="different parameters"):
        update_sq_norm(a, b)
    c = dict(a)
    c["wte"] = a["wte"].double()
    with pytest.raises(NormBucketError, match="float32"):
        update_sq_norm(a, c)
