"""Which steps of a run get challenged, derived from chain randomness the miner could not know.

A challenged step is f(BLAKE3(block hash, run_id, root, size, index, counter)) mapped uniformly onto
[1, size-1] by rejection sampling (no modulo bias): leaf 0 is the initial state, so it is never a
step to replay. The block must be newer than the root it challenges; the protocol sees to that.
"""

from __future__ import annotations

from collections.abc import Iterable

from commitments.hashing import digest

STEP_DOMAIN = "pot/challenge-step/v1"
ID_DOMAIN = "pot/challenge-id/v1"
_SPACE = 1 << 64  # each draw reads 64 bits of the digest


class DeriveError(ValueError):
    """Inputs from which no challenge can be derived, with the reason."""


def _check_hashes(block_hash: bytes, run_id: bytes, root: bytes) -> None:
    for name, v in (("block_hash", block_hash), ("run_id", run_id), ("root", root)):
        if not isinstance(v, (bytes, bytearray)) or len(v) != 32:
            raise DeriveError(f"{name} must be 32 bytes")


def _check(block_hash: bytes, run_id: bytes, root: bytes, size: int) -> None:
    _check_hashes(block_hash, run_id, root)
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise DeriveError(
            f"a run needs at least 2 leaves (initial state + one step) to be challenged, got size {size!r}"
        )


def challenge_step(block_hash: bytes, run_id: bytes, root: bytes, size: int, index: int) -> int:
    """The index-th challenged step of the tree (root, size), uniform over [1, size-1]."""
    _check(block_hash, run_id, root, size)
    return _draw(bytes(block_hash), bytes(run_id), bytes(root), size, index, 0)[0]


def _draw(
    block_hash: bytes, run_id: bytes, root: bytes, size: int, index: int, counter: int
) -> tuple[int, int]:
    """(step, next counter): the first accepted draw at or after `counter`."""
    n = size - 1
    limit = _SPACE - (_SPACE % n)  # accept only draws below a multiple of n: every step equally likely
    while True:
        d = digest(STEP_DOMAIN, block_hash, run_id, root, size, index, counter)
        x = int.from_bytes(d[:8], "big")
        counter += 1
        if x < limit:
            return 1 + x % n, counter


def challenge_steps(
    block_hash: bytes,
    run_id: bytes,
    root: bytes,
    size: int,
    count: int,
    forced: Iterable[int] = (),
) -> list[int]:
    """`count` distinct challenged steps (fewer if the run has fewer steps).

    `forced` steps (a demo and test parameter) come first, in their order, if they lie in
    [1, size-1]; the rest are drawn. A drawn duplicate is redrawn with the next counter.
    """
    _check(block_hash, run_id, root, size)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise DeriveError(f"count must be a non-negative integer, got {count!r}")
    count = min(count, size - 1)
    steps: list[int] = []
    for t in forced:
        if isinstance(t, int) and 1 <= t <= size - 1 and t not in steps and len(steps) < count:
            steps.append(t)
    index = len(steps)
    while len(steps) < count:
        counter = 0
        while True:
            t, counter = _draw(bytes(block_hash), bytes(run_id), bytes(root), size, index, counter)
            if t not in steps:
                break
        steps.append(t)
        index += 1
    return steps


def challenge_id(run_id: bytes, root: bytes, size: int, index: int, block_hash: bytes) -> bytes:
    """The identifier of the index-th challenge issued for (run, root) at a block."""
    _check_hashes(block_hash, run_id, root)
    return digest(ID_DOMAIN, bytes(run_id), bytes(root), size, index, bytes(block_hash))


COMMITTEE_DOMAIN = "pot/committee/v3"
DISPUTE_LOTTERY = 1 << 62  # the draw index of the dispute lottery (no committee draw reaches it)
RECHALLENGE_DOMAIN = "pot/rechallenge-id/v2"


def _uniform(seed: bytes, j: int, bound: int) -> int:
    """An integer uniform in [0, bound) from digest(COMMITTEE_DOMAIN, seed, j, counter), by
    rejection sampling over 64-bit draws (no modulo bias). `bound` is at most 2^63 (the protocol
    caps bonds so that their total stays below it), so at least half of all draws are accepted."""
    if not 1 <= bound <= _SPACE >> 1:
        raise DeriveError(f"a committee draw's total weight must be in 1..2^63, got {bound}")
    limit = _SPACE - (_SPACE % bound)
    counter = 0
    while True:
        x = int.from_bytes(digest(COMMITTEE_DOMAIN, seed, j, counter)[:8], "big")
        counter += 1
        if x < limit:
            return x % bound


def seat_units(eligible: list[tuple[str, int]], unit: int) -> list[tuple[str, int]]:
    """[(account, units)] in account order: how many seats each account's free bond backs, one per
    `unit` (verifier_stake) of it, accounts with none left out. floor(a/u) + floor(b/u) <= floor((a+b)/u),
    so splitting a bond over accounts never adds a unit."""
    if unit < 1:
        raise DeriveError(f"a seat unit must be at least 1, got {unit}")
    pool = sorted((a, w // unit) for a, w in eligible if w >= unit)
    if len({a for a, _ in pool}) != len(pool):
        raise DeriveError("an eligible account is listed twice")
    return pool


def draw_committee(
    block_hash: bytes, challenge_id: bytes, units: list[tuple[str, int]], seats: int
) -> list[str]:
    """`seats` seats drawn WITHOUT replacement from the seat units [(account, units)], in draw
    order: each draw takes one unit, uniform over the units left, so an account with k units holds
    at most k seats and its expected seats are exactly seats x its share of the units, however its
    bond is split (splitting only loses the remainders). Every seat is backed by a unit of free
    bond, which the round reserves.

    Draw j picks x = _uniform(seed, j, units left) and the account whose range of the cumulative
    units (in account order) holds x. seed = block_hash || challenge_id. Fewer units than seats:
    every unit is a seat."""
    _check_hashes(block_hash, challenge_id, challenge_id)
    pool = [[a, k] for a, k in sorted(units) if k > 0]
    if len({a for a, _ in pool}) != len(pool):
        raise DeriveError("an eligible account is listed twice")
    total = sum(k for _, k in pool)
    if total <= seats:
        return [a for a, k in pool for _ in range(k)]
    seed = bytes(block_hash) + bytes(challenge_id)
    chosen: list[str] = []
    for j in range(seats):
        x = _uniform(seed, j, total)
        for entry in pool:
            if x < entry[1]:
                chosen.append(entry[0])
                entry[1] -= 1
                total -= 1
                break
            x -= entry[1]
    return chosen


def dispute_seats(
    block_hash: bytes, challenge_id: bytes, units: list[tuple[str, int]], cap: int
) -> list[str]:
    """The dispute round's seats, in account order: every seat unit when there are at most `cap`;
    otherwise exactly proportional to units. Each account gets floor(k * cap / U) seats, and the R
    seats left (R = cap - the floors) go by one systematic lottery over the remainders r = k * cap
    mod U (they sum to R * U): an offset o uniform in [0, U), and the points o, o + U, ..., o + (R-1) U
    laid over the remainders' cumulative ranges, in account order, give a seat each. Each account
    gets its extra seat with probability exactly r / U, at most one (r < U), so its expected seats
    are exactly k * cap / U: no account's seats depend on another's name, and splitting a bond
    never gains a seat in expectation (the floors of the parts sum to at most the floor of the whole)."""
    _check_hashes(block_hash, challenge_id, challenge_id)
    pool = [(a, k) for a, k in sorted(units) if k > 0]
    if len({a for a, _ in pool}) != len(pool):
        raise DeriveError("an eligible account is listed twice")
    total = sum(k for _, k in pool)
    if total <= cap:
        return [a for a, k in pool for _ in range(k)]
    floors = [k * cap // total for _, k in pool]
    left = cap - sum(floors)
    extra = [0] * len(pool)
    if left:
        point = _uniform(bytes(block_hash) + bytes(challenge_id), DISPUTE_LOTTERY, total)
        start = 0
        for i, (_, k) in enumerate(pool):
            end = start + k * cap % total
            if start <= point < end:  # the next point of the lottery lies in this account's range
                extra[i] = 1
                point += total
            start = end
    out: list[str] = []
    for (account, _), f, e in zip(pool, floors, extra, strict=True):
        out += [account] * (f + e)
    return out


def challenge_step_at(block_hash: bytes, run_id: bytes, root: bytes, size: int, index: int,
                      taken: Iterable[int] = (), forced: Iterable[int] = ()) -> int:
    """The index-th challenged step of (root, size), drawn from the hash of the index-th
    challenge's own block (protocol v2: one block per challenge).

    Forced steps (demo/test knob) in [1, size-1] come first, in order. A drawn step already
    taken is redrawn with the next counter, and so is one next to a taken step while the run has
    room (size - 1 > 3 x draws): the opening of step t+1 holds the state after step t, which
    would let a verifier of step t skip its replay."""
    _check(block_hash, run_id, root, size)
    taken = sorted(set(taken))
    valid_forced = [t for t in dict.fromkeys(forced) if isinstance(t, int) and 1 <= t <= size - 1]
    if index < len(valid_forced):
        return valid_forced[index]
    spaced = size - 1 > 3 * (len(taken) + 1)
    counter = 0
    while True:
        t, counter = _draw(bytes(block_hash), bytes(run_id), bytes(root), size, index, counter)
        if t in taken or (spaced and (t - 1 in taken or t + 1 in taken)):
            if len(taken) >= size - 1:
                raise DeriveError(f"every step of the run is taken ({size - 1} steps)")
            continue
        return t


def rechallenge_id(first: bytes, round_: int, block_hash: bytes) -> bytes:
    """The id of round `round_` (>= 2) of the challenge whose first round is `first`."""
    _check_hashes(block_hash, first, first)
    return digest(RECHALLENGE_DOMAIN, bytes(first), round_, bytes(block_hash))
