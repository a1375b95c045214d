"""Challenge derivation: range, determinism, uniformity (no modulo bias), forced steps, ids; the
per-block step with its spacing rule, seat units, committees drawn without replacement, the dispute
round's proportional seats and their lottery, and re-challenge ids."""

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
    seat_units,
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


# --- committees (protocol v3: seat units of free bond, drawn without replacement) ---------------


UNITS = [("a", 3), ("b", 1), ("c", 1), ("d", 1)]  # seat units: a's free bond backs three seats


def _cids(n):
    return [challenge_id(R, ROOT, 9, i, B) for i in range(n)]


def test_seat_units_are_one_per_unit_of_free_bond():
    assert seat_units([("b", 100), ("a", 399), ("c", 99), ("d", 0)], 100) == [("a", 3), ("b", 1)]
    assert seat_units([], 100) == []
    with pytest.raises(DeriveError, match="listed twice"):
        seat_units([("a", 100), ("a", 200)], 100)
    with pytest.raises(DeriveError, match="a seat unit must be at least 1"):
        seat_units([("a", 100)], 0)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=8), st.integers(1, 1000))
def test_splitting_a_bond_over_accounts_never_adds_a_unit(parts, unit):
    whole = seat_units([("w", sum(parts))], unit)
    split = seat_units([(f"p{i}", b) for i, b in enumerate(parts)], unit)
    assert sum(k for _, k in split) <= sum(k for _, k in whole)


def test_committee_is_deterministic_without_replacement_and_ignores_list_order():
    repeats = 0
    for cid in _cids(40):
        c = draw_committee(B, cid, UNITS, 3)
        assert len(c) == 3 and set(c) <= {"a", "b", "c", "d"}
        # without replacement: an account holds at most as many seats as it has units
        assert all(c.count(a) <= k for a, k in UNITS)
        assert c == draw_committee(B, cid, list(reversed(UNITS)), 3)
        repeats += len(set(c)) < 3
    assert repeats > 0  # an account of several units may hold several seats
    a = [draw_committee(B, cid, UNITS, 2) for cid in _cids(40)]
    assert a != [draw_committee(b"\x09" * 32, cid, UNITS, 2) for cid in _cids(40)]  # the block enters it


def test_committee_edge_cases():
    # no more units than seats: every unit is a seat, in account order
    assert draw_committee(B, R, UNITS, 100) == ["a", "a", "a", "b", "c", "d"]
    assert draw_committee(B, R, UNITS, 6) == ["a", "a", "a", "b", "c", "d"]
    assert sorted(draw_committee(B, R, UNITS, 5)) != ["a", "a", "a", "b", "c", "d"]
    assert draw_committee(B, R, [("a", 5), ("z", 0)], 3) == ["a", "a", "a"]  # no unit, no seat
    assert draw_committee(B, R, [], 5) == []
    with pytest.raises(DeriveError, match="listed twice"):
        draw_committee(B, R, [("a", 1), ("a", 2)], 1)
    # the dispute round seats every unit when there are at most the cap
    assert dispute_seats(B, R, UNITS, 4096) == ["a", "a", "a", "b", "c", "d"]
    assert dispute_seats(B, R, UNITS, 6) == ["a", "a", "a", "b", "c", "d"]
    assert dispute_seats(B, R, [], 4096) == []
    with pytest.raises(DeriveError, match="listed twice"):
        dispute_seats(B, R, [("a", 1), ("a", 2)], 1)


def test_draw_j_takes_the_unit_at_a_uniform_point_of_the_units_left(monkeypatch):
    # Force the points: draw 0 lands on b's unit (a's three units are 0..2), draw 1 on unit 0 of
    # what is left (a, b's unit gone), draw 2 on the last unit left (d).
    points = {0: 3, 1: 0, 2: 3}
    monkeypatch.setattr(derive, "_uniform", lambda seed, j, bound: points[j])
    assert draw_committee(B, R, UNITS, 3) == ["b", "a", "d"]


def test_one_seat_follows_the_units():
    # 3x the units, ~3x the seats: 6000 single-seat draws, a's share within 5 sigma of 1/2 and
    # each of the others' within 5 sigma of 1/6.
    n = 6000
    counts = Counter(draw_committee(B, cid, UNITS, 1)[0] for cid in _cids(n))
    for account, p in (("a", 0.5), ("b", 1 / 6), ("c", 1 / 6), ("d", 1 / 6)):
        assert abs(counts[account] - n * p) < 5 * (n * p * (1 - p)) ** 0.5, counts
    assert 2.6 < counts["a"] / counts["b"] < 3.4


def test_several_seats_are_hypergeometric_in_the_units():
    """Drawn without replacement, an account's seats among `seats` follow the hypergeometric law:
    a's 3 of the 6 units give it 0, 1 or 2 of 2 seats with probability 3/15, 9/15, 3/15, and each
    account's expected seats are exactly seats x its share of the units."""
    n, seats = 3000, 2
    held = Counter(draw_committee(B, cid, UNITS, seats).count("a") for cid in _cids(n))
    for k, p in ((0, 3 / 15), (1, 9 / 15), (2, 3 / 15)):
        assert abs(held[k] - n * p) < 5 * (n * p * (1 - p)) ** 0.5, held
    counts = Counter(a for cid in _cids(n) for a in draw_committee(B, cid, UNITS, seats))
    for account, k in UNITS:
        mean = n * seats * k / 6
        assert abs(counts[account] - mean) < 5 * (n * seats * (k / 6) * (1 - k / 6)) ** 0.5, (account, counts)


def test_splitting_a_bond_buys_no_more_single_seats():
    # a's 3 units as three accounts of one: together they sit as often as a alone (1/2 of the draws).
    split = [("a1", 1), ("a2", 1), ("a3", 1), ("b", 1), ("c", 1), ("d", 1)]
    n = 6000
    counts = Counter(draw_committee(B, cid, split, 1)[0] for cid in _cids(n))
    together = counts["a1"] + counts["a2"] + counts["a3"]
    assert abs(together - n / 2) < 5 * (n / 4) ** 0.5


def test_dispute_seats_past_the_cap_are_proportional_with_a_systematic_lottery():
    """7 units, 4 seats: each account gets floor(k * 4 / 7) = 1 seat, and the one seat left goes
    to a with probability 5/7 (its remainder 12 mod 7), to b or c with 1/7 each; exactly 4 seats
    every time, at most one extra an account, so the expected seats are exactly k * 4 / 7."""
    units = [("a", 3), ("b", 2), ("c", 2)]
    n = 4000
    extra = Counter()
    for cid in _cids(n):
        seats = dispute_seats(B, cid, units, 4)
        assert len(seats) == 4 and seats == sorted(seats)  # in account order
        got = Counter(seats)
        assert all(got[a] in (1, 2) for a, _ in units) and sum(got[a] == 2 for a, _ in units) == 1
        extra.update(a for a, _ in units if got[a] == 2)
    for account, p in (("a", 5 / 7), ("b", 1 / 7), ("c", 1 / 7)):
        assert abs(extra[account] - n * p) < 5 * (n * p * (1 - p)) ** 0.5, extra
    assert dispute_seats(B, R, units, 4) == dispute_seats(B, R, list(reversed(units)), 4)
    assert [dispute_seats(B, cid, units, 4) for cid in _cids(40)] != [
        dispute_seats(b"\x09" * 32, cid, units, 4) for cid in _cids(40)]  # the block enters the lottery


def test_dispute_seats_several_points_of_the_lottery(monkeypatch):
    # 10 units, cap 6: floors 4*6//10 = 2, 3*6//10 = 1, 3*6//10 = 1 (4 seats), 2 left over the
    # remainders 4, 8, 8 (ranges [0,4), [4,12), [12,20)); offset 3: points 3 and 13 seat a and c.
    units = [("a", 4), ("b", 3), ("c", 3)]
    monkeypatch.setattr(derive, "_uniform", lambda seed, j, bound: 3)
    assert dispute_seats(B, R, units, 6) == ["a", "a", "a", "b", "c", "c"]
    monkeypatch.setattr(derive, "_uniform", lambda seed, j, bound: 5)  # points 5, 15: b and c
    assert dispute_seats(B, R, units, 6) == ["a", "a", "b", "b", "c", "c"]


@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(1, 64), h32)
def test_dispute_seats_are_exactly_the_cap_within_one_of_proportional(ks, cap, cid):
    units = [(f"v{i:02d}", k) for i, k in enumerate(ks)]
    total = sum(ks)
    seats = Counter(dispute_seats(B, cid, units, cap))
    assert sum(seats.values()) == min(cap, total)
    for a, k in units:
        if total <= cap:
            assert seats[a] == k
        else:
            assert k * cap // total <= seats[a] <= k * cap // total + 1


def test_the_uniform_draw_refuses_a_weight_outside_its_range():
    with pytest.raises(DeriveError, match="total weight must be in 1..2\\^63"):
        derive._uniform(B + R, 0, 0)
    with pytest.raises(DeriveError, match="total weight must be in 1..2\\^63"):
        derive._uniform(B + R, 0, (1 << 63) + 1)


# --- re-challenge ids ---------------------------------------------------------------------------


def test_rechallenge_ids_are_deterministic_and_differ_by_every_input():
    first = challenge_id(R, ROOT, 9, 0, B)
    base = rechallenge_id(first, 2, B)
    assert len(base) == 32 and base == rechallenge_id(first, 2, B)
    others = {
        rechallenge_id(b"\x09" * 32, 2, B),
        rechallenge_id(first, 3, B),
        rechallenge_id(first, 2, b"\x09" * 32),
    }
    assert base not in others and len(others) == 3
    assert base != first and base not in {challenge_id(R, ROOT, 9, i, B) for i in range(4)}
    with pytest.raises(DeriveError, match="block_hash must be 32 bytes"):
        rechallenge_id(first, 2, b"short")
