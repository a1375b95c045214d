"""Challenge derivation: range, determinism, uniformity (no modulo bias), forced steps, ids; the
per-block step of protocol v2 with its spacing rule, committees and re-challenge ids."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import challenges.derive as derive
from challenges.derive import (
    DeriveError,
    challenge_id,
    challenge_step,
    challenge_step_at,
    challenge_steps,
    dispute_seats,
    draw_committee,
    rechallenge_id,
)

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


# --- one step per block (protocol v2) -------------------------------------------------------------


def _blocks(n):
    return [i.to_bytes(32, "big") for i in range(n)]


def test_step_at_is_deterministic_in_range_and_moves_with_the_block():
    steps = [challenge_step_at(b, R, ROOT, 100, 0) for b in _blocks(50)]
    assert all(1 <= t <= 99 for t in steps) and len(set(steps)) > 10
    assert steps == [challenge_step_at(b, R, ROOT, 100, 0) for b in _blocks(50)]
    # With nothing taken it is the block's first draw, as challenge_step draws it.
    assert steps == [challenge_step(b, R, ROOT, 100, 0) for b in _blocks(50)]


def test_step_at_never_repeats_nor_neighbours_a_taken_step_while_there_is_room():
    taken = [10, 50]
    for b in _blocks(400):
        t = challenge_step_at(b, R, ROOT, 100, 2, taken)
        # The opening of step t+1 holds the state after step t: no challenged step next to another.
        assert t not in (9, 10, 11, 49, 50, 51)


def test_step_at_allows_neighbours_once_the_run_is_too_small():
    # 4 steps, one taken: 4 > 3 * 2 fails, so only the taken step itself is redrawn.
    seen = {challenge_step_at(b, R, ROOT, 5, 1, [2]) for b in _blocks(200)}
    assert seen == {1, 3, 4}
    seen = {challenge_step_at(b, R, ROOT, 5, 3, [1, 2, 4]) for b in _blocks(20)}
    assert seen == {3}
    with pytest.raises(DeriveError, match="every step of the run is taken"):
        challenge_step_at(B, R, ROOT, 5, 4, [1, 2, 3, 4])


def test_step_at_takes_forced_steps_first_in_order():
    forced = (7, 7, 42, 0, 3)  # duplicates and steps outside [1, 9] are dropped
    assert [challenge_step_at(B, R, ROOT, 10, i, [], forced) for i in range(2)] == [7, 3]
    drawn = challenge_step_at(B, R, ROOT, 10, 2, [7, 3], forced)  # past the forced steps: drawn
    assert drawn not in (7, 3) and 1 <= drawn <= 9


# --- committees ---------------------------------------------------------------------------------


ELIGIBLE = [("a", 300), ("b", 100), ("c", 100), ("d", 100)]


def _cids(n):
    return [challenge_id(R, ROOT, 9, i, B) for i in range(n)]


def test_committee_is_deterministic_with_replacement_and_ignores_list_order():
    repeats = 0
    for cid in _cids(40):
        c = draw_committee(B, cid, ELIGIBLE, 3)
        assert len(c) == 3 and set(c) <= {"a", "b", "c", "d"}
        assert c == draw_committee(B, cid, list(reversed(ELIGIBLE)), 3)
        repeats += len(set(c)) < 3
    assert repeats > 0  # with replacement: an account drawn twice holds two seats
    a = [draw_committee(B, cid, ELIGIBLE, 2) for cid in _cids(40)]
    assert a != [draw_committee(b"\x09" * 32, cid, ELIGIBLE, 2) for cid in _cids(40)]  # the block enters it


def test_committee_edge_cases():
    assert len(draw_committee(B, R, ELIGIBLE, 100)) == 100  # seats, not accounts
    assert draw_committee(B, R, [("a", 5), ("z", 0)], 3) == ["a", "a", "a"]  # no bond, no seat
    assert draw_committee(B, R, [], 5) == []
    with pytest.raises(DeriveError, match="listed twice"):
        draw_committee(B, R, [("a", 1), ("a", 2)], 1)
    # the protocol seats everyone when the accounts are no more than the seats (dispute_seats)
    assert dispute_seats(ELIGIBLE, 100, 4096) == ["a", "a", "a", "b", "c", "d"]


def test_one_seat_follows_the_bond():
    # 3x the bond, ~3x the seats: 6000 single-seat draws, a's share within 5 sigma of 1/2 and
    # each of the others' within 5 sigma of 1/6.
    n = 6000
    counts = Counter(draw_committee(B, cid, ELIGIBLE, 1)[0] for cid in _cids(n))
    for account, p in (("a", 0.5), ("b", 1 / 6), ("c", 1 / 6), ("d", 1 / 6)):
        assert abs(counts[account] - n * p) < 5 * (n * p * (1 - p)) ** 0.5, counts
    assert 2.6 < counts["a"] / counts["b"] < 3.4


def test_several_seats_are_binomial_in_the_bond_share():
    """Drawn with replacement, an account's seats among `seats` are Binomial(seats, bond share)."""
    n, seats = 3000, 2
    share = {"a": 0.5, "b": 1 / 6, "c": 1 / 6, "d": 1 / 6}
    counts = Counter(a for cid in _cids(n) for a in draw_committee(B, cid, ELIGIBLE, seats))
    for account, p in share.items():
        mean, var = n * seats * p, n * seats * p * (1 - p)
        assert abs(counts[account] - mean) < 5 * var ** 0.5, (account, counts)


def test_splitting_a_bond_buys_no_more_single_seats():
    # a's 300 as three accounts of 100: together they sit as often as a alone (1/2 of the draws).
    split = [("a1", 100), ("a2", 100), ("a3", 100), ("b", 100), ("c", 100), ("d", 100)]
    n = 6000
    counts = Counter(draw_committee(B, cid, split, 1)[0] for cid in _cids(n))
    together = counts["a1"] + counts["a2"] + counts["a3"]
    assert abs(together - n / 2) < 5 * (n / 4) ** 0.5


# --- re-challenge ids ---------------------------------------------------------------------------


def test_rechallenge_ids_are_deterministic_and_differ_by_every_input():
    first = challenge_id(R, ROOT, 9, 0, B)
    base = rechallenge_id(first, 2, B)
    assert len(base) == 32 and base == rechallenge_id(first, 2, B)
    others = {rechallenge_id(b"\x09" * 32, 2, B), rechallenge_id(first, 3, B), rechallenge_id(first, 2, b"\x09" * 32)}
    assert base not in others and len(others) == 3
    assert base != first and base not in {challenge_id(R, ROOT, 9, i, B) for i in range(4)}
    with pytest.raises(DeriveError, match="block_hash must be 32 bytes"):
        rechallenge_id(first, 2, b"short")
