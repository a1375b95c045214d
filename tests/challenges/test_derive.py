"""Challenge derivation: range, determinism, uniformity (no modulo bias), forced steps, ids."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import challenges.derive as derive
from challenges.derive import DeriveError, challenge_id, challenge_step, challenge_steps

B, R, ROOT = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
h32 = st.binary(min_size=32, max_size=32)


@given(h32, h32, h32, st.integers(2, 10**9), st.integers(0, 100))
def test_step_in_range_and_deterministic(b, r, root, size, index):
    t = challenge_step(b, r, root, size, index)
    assert 1 <= t <= size - 1
    assert t == challenge_step(b, r, root, size, index)


def test_every_input_moves_the_step():
    base = [challenge_step(B, R, ROOT, 1000, i) for i in range(8)]
    assert len(set(base)) > 1
    for args in ((b"\x09" * 32, R, ROOT), (B, b"\x09" * 32, ROOT), (B, R, b"\x09" * 32)):
        assert [challenge_step(*args, 1000, i) for i in range(8)] != base


def test_size_two_has_one_step():
    assert {challenge_step(bytes([i]) * 32, R, ROOT, 2, 0) for i in range(20)} == {1}


def test_uniform_over_steps():
    # 3 steps, 3000 draws: each step's share is within 5 standard deviations of 1/3.
    counts = Counter(challenge_step(i.to_bytes(32, "big"), R, ROOT, 4, 0) for i in range(3000))
    assert set(counts) == {1, 2, 3}
    for c in counts.values():
        assert abs(c - 1000) < 5 * (3000 * (1 / 3) * (2 / 3)) ** 0.5


def test_rejection_sampling_redraws_biased_values(monkeypatch):
    # Force the first draw into the biased tail [limit, 2^64): it must be rejected, not folded.
    calls = []
    n = 3  # size 4
    limit = 2**64 - (2**64 % n)

    def fake_digest(domain, *fields):
        counter = fields[-1]
        calls.append(counter)
        x = limit if counter == 0 else 5  # 5 % 3 = 2 -> step 3
        return x.to_bytes(8, "big") + bytes(24)

    monkeypatch.setattr(derive, "digest", fake_digest)
    assert challenge_step(B, R, ROOT, 4, 0) == 3
    assert calls == [0, 1]


def test_steps_distinct_and_forced_first():
    steps = challenge_steps(B, R, ROOT, 10, 5)
    assert len(steps) == 5 == len(set(steps))
    assert all(1 <= t <= 9 for t in steps)
    forced = challenge_steps(B, R, ROOT, 10, 3, forced=(7, 7, 42, 0))
    assert forced[0] == 7 and len(forced) == 3 == len(set(forced))
    assert challenge_steps(B, R, ROOT, 10, 1, forced=(7,)) == [7]
    assert sorted(challenge_steps(B, R, ROOT, 4, 10)) == [1, 2, 3]  # capped at size - 1


def test_challenge_ids_differ_by_every_input():
    base = challenge_id(R, ROOT, 9, 0, B)
    assert len(base) == 32
    others = {
        challenge_id(b"\x09" * 32, ROOT, 9, 0, B),
        challenge_id(R, b"\x09" * 32, 9, 0, B),
        challenge_id(R, ROOT, 10, 0, B),
        challenge_id(R, ROOT, 9, 1, B),
        challenge_id(R, ROOT, 9, 0, b"\x09" * 32),
    }
    assert base not in others and len(others) == 5


@pytest.mark.parametrize(
    "args, reason",
    [
        ((b"short", R, ROOT, 10, 0), "block_hash must be 32 bytes"),
        ((B, R, ROOT, 1, 0), "at least 2 leaves"),
        ((B, R, ROOT, True, 0), "at least 2 leaves"),
    ],
)
def test_bad_inputs_refused(args, reason):
    with pytest.raises(DeriveError, match=reason):
        challenge_step(*args)
    with pytest.raises(DeriveError):
        challenge_steps(B, R, ROOT, 10, -1)
