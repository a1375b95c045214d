"""Secondary loss checks: honest-looking sequences pass; each kind of fabrication is flagged."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from challenges.losschecks import (
    LossCheckConfig,
    check_backward_jumps,
    check_decrease,
    check_plateau,
    check_rate,
    losses_from_leaves,
    run_loss_checks,
)
from commitments.leaves import initial_leaf, loss_bits, step_leaf


def honest(n: int = 30, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [4.0 * math.exp(-t / 20) + 0.5 + rng.gauss(0, 0.03) for t in range(n)]


def test_noisy_decreasing_sequence_passes():
    report = run_loss_checks(honest())
    assert report.ok, report.findings
    assert report.to_dict() == {"steps": 30, "ok": True, "findings": []}


def test_rising_loss_is_flagged_as_no_decrease():
    xs = [2.0 + 0.1 * t for t in range(10)]
    (f,) = check_decrease(xs)
    assert f.check == "no_decrease" and f.step == 10


def test_flat_noisy_loss_is_within_noise():
    rng = random.Random(3)
    assert check_decrease([3.0 + rng.gauss(0, 0.1) for _ in range(20)]) == []


def test_collapse_in_one_step_is_implausible():
    xs = honest(10)
    xs[6] = 0.01
    found = check_rate(xs)
    assert [f.step for f in found] == [7]
    assert "fell from" in found[0].detail


def test_plateau_of_identical_losses():
    xs = honest(12)
    xs[3:8] = [xs[3]] * 5
    (f,) = check_plateau(xs, plateau_steps=4)
    assert (f.check, f.step) == ("plateau", 4)
    assert "5 consecutive" in f.detail
    assert check_plateau(xs, plateau_steps=6) == []


def test_backward_jump():
    xs = honest(10)
    xs[4] = xs[3] * 3
    assert [f.step for f in check_backward_jumps(xs)] == [5]


def test_non_finite_losses_are_named():
    xs = honest(8)
    xs[2] = float("nan")
    report = run_loss_checks(xs)
    assert [(f.check, f.step) for f in report.findings] == [("non_finite", 3)]


def test_short_sequences_only_get_pointwise_checks():
    assert run_loss_checks([5.0]).ok
    assert run_loss_checks([]).ok


def test_config_refuses_nonsense():
    with pytest.raises(ValueError, match="max_drop_factor"):
        LossCheckConfig(max_drop_factor=1.0)
    with pytest.raises(ValueError, match="noise_sigmas"):
        LossCheckConfig(noise_sigmas=float("nan"))


def test_losses_from_leaves_skips_leaf_zero_and_checks_order():
    d = bytes(32)
    leaves = [initial_leaf(d)] + [step_leaf(t, d, loss_bits(float(t) / 2)) for t in range(1, 4)]
    assert losses_from_leaves(leaves) == [0.5, 1.0, 1.5]
    with pytest.raises(ValueError, match="index 1 says step 2"):
        losses_from_leaves([leaves[0], leaves[2]])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.125, max_value=8.0, width=32), min_size=0, max_size=40))
def test_checks_are_pure_and_total(xs):
    a, b = run_loss_checks(xs), run_loss_checks(list(xs))
    assert a == b
    assert all(1 <= f.step <= max(len(xs), 1) for f in a.findings)
