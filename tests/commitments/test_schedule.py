"""Sample schedules: the documented sampling rule, commitment, proofs and refusals."""

from __future__ import annotations

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitments import cbor, merkle
from commitments.schedule import (
    Schedule,
    ScheduleError,
    batch_leaf,
    derive_schedule,
    draw_index,
    verify_batch,
)


def _rule(seed, t, j, n):
    """The module docstring's rule, written out independently; returns (index, counter used)."""
    counter = 0
    while True:
        block = blake3.blake3(cbor.encode(["pot/schedule-rng/v1", seed, t, j, counter])).digest()
        x = int.from_bytes(block[:8], "little")
        if x < 2**64 - (2**64 % n):
            return x % n, counter
        counter += 1


def test_batches_follow_the_documented_rule():
    s = derive_schedule(12345, 1000, 4, 3)
    for t in range(1, 5):
        assert s.batch(t) == [_rule(12345, t, j, 1000)[0] for j in range(3)]
    assert derive_schedule(b"\x01" * 32, 50, 2, 2).batch(2) == [
        _rule(b"\x01" * 32, 2, j, 50)[0] for j in range(2)
    ]


def test_rejection_sampling_redraws_instead_of_taking_a_biased_value():
    # With n = 2**63 + 1 almost half of all 64-bit values are rejected, so some draws need counter > 0.
    n = 2**63 + 1
    redrawn = 0
    for j in range(40):
        index, counter = _rule(9, 1, j, n)
        assert draw_index(9, 1, j, n) == index
        redrawn += counter > 0
    assert redrawn > 0
    assert derive_schedule(9, n, 1, 40).batch(1) == [_rule(9, 1, j, n)[0] for j in range(40)]


def test_indices_are_roughly_uniform():
    s = derive_schedule(3, 10, 2000, 10)
    counts = [0] * 10
    for t in range(1, 2001):
        for i in s.batch(t):
            counts[i] += 1
    # 20000 draws over 10 values: expected 2000 each, sd about 42; 300 is more than 7 sd.
    assert all(abs(c - 2000) < 300 for c in counts), counts


def test_same_seed_same_schedule_other_seed_other_schedule():
    a = derive_schedule(1, 500, 20, 4)
    b = derive_schedule(1, 500, 20, 4)
    c = derive_schedule(2, 500, 20, 4)
    assert [a.batch(t) for t in range(1, 21)] == [b.batch(t) for t in range(1, 21)]
    assert a.commitment == b.commitment != c.commitment
    assert derive_schedule(1, 501, 20, 4).commitment != a.commitment


def test_shape_and_range_of_batches():
    s = derive_schedule(0, 7, 30, 5)
    assert s.steps == 30 and s.batch_size == 5 and s.num_samples == 7
    for t in range(1, 31):
        b = s.batch(t)
        assert len(b) == 5 and all(0 <= i < 7 for i in b)


def test_batch_leaf_format_and_commitment_is_the_root_over_batch_leaves():
    assert batch_leaf(3, [5, 1]) == cbor.encode(["pot/batch/v1", 3, [5, 1]])
    s = derive_schedule(77, 100, 9, 2)
    assert s.commitment == merkle.root([batch_leaf(t, s.batch(t)) for t in range(1, 10)])
    assert Schedule.from_batches([s.batch(t) for t in range(1, 10)]).commitment == s.commitment


@settings(max_examples=25, deadline=None)
@given(steps=st.integers(1, 70), batch_size=st.integers(1, 4), seed=st.integers(0, 2**64 - 1))
def test_every_batch_proof_verifies(steps, batch_size, seed):
    s = derive_schedule(seed, 1000, steps, batch_size)
    for t in range(1, steps + 1):
        assert verify_batch(t, s.batch(t), steps, s.proof(t), s.commitment)


def test_tampered_batches_and_proofs_are_rejected():
    s = derive_schedule(5, 1000, 13, 3)
    c = s.commitment
    for t in range(1, 14):
        b, p = s.batch(t), s.proof(t)
        assert verify_batch(t, b, 13, p, c)
        assert not verify_batch(t, [b[0] + 1, *b[1:]], 13, p, c)
        assert not verify_batch(t, list(reversed(b)), 13, p, c) or b == list(reversed(b))
        assert not verify_batch(t, b[:-1], 13, p, c)
        assert not verify_batch(t % 13 + 1, b, 13, p, c)
        assert not verify_batch(t, b, 13, p, bytes(32))
        assert not verify_batch(t, b, 13, [bytes(32)] + p[1:], c)
    assert not verify_batch(0, s.batch(1), 13, s.proof(1), c)
    assert not verify_batch(14, s.batch(13), 13, s.proof(13), c)
    assert not verify_batch(1, [-1, 2, 3], 13, s.proof(1), c)
    assert not verify_batch(1, ["1", 2, 3], 13, s.proof(1), c)


def test_numpy_integers_are_plain_indices_but_floats_and_strings_are_not():
    import numpy as np

    assert batch_leaf(2, np.array([4, 5], dtype=np.int64)) == batch_leaf(2, [4, 5])
    for bad in ([1.0], ["3"], [True], "12"):
        with pytest.raises(ScheduleError):
            batch_leaf(2, bad)


def test_explicit_schedules_allow_any_batches():
    s = Schedule.from_batches([[0, 1], [2, 3, 4], [9]])
    assert s.steps == 3 and s.batch_size is None
    assert s.batch(2) == [2, 3, 4]
    assert verify_batch(3, [9], 3, s.proof(3), s.commitment)
    assert Schedule.from_batches([[1], [2]]).batch_size == 1


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ((0, 10, 0, 1), "steps"),
        ((0, 10, 5, 0), "batch_size"),
        ((0, 0, 5, 1), "num_samples"),
        ((-1, 10, 5, 1), "outside"),
        ((2**64, 10, 5, 1), "outside"),
        ((True, 10, 5, 1), "seed"),
        (("seed", 10, 5, 1), "seed"),
        ((0, 10, 2.0, 1), "steps"),
    ],
)
def test_bad_derivation_arguments_are_refused(args, reason):
    with pytest.raises(ScheduleError, match=reason):
        derive_schedule(*args)


def test_bad_steps_and_batches_are_refused():
    s = derive_schedule(0, 10, 5, 1)
    for t in (0, 6, -1, "1", True):
        with pytest.raises(ScheduleError, match="outside the schedule's steps 1..5"):
            s.batch(t)
        with pytest.raises(ScheduleError):
            s.proof(t)
    with pytest.raises(ScheduleError, match="batch index 1"):
        batch_leaf(1, [0, -2])
    with pytest.raises(ScheduleError, match="step t"):
        batch_leaf(0, [0])
    with pytest.raises(ScheduleError, match="at least one step"):
        Schedule.from_batches([])
