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
        raise DeriveError(f"a run needs at least 2 leaves (initial state + one step) to be challenged, got size {size!r}")


def challenge_step(block_hash: bytes, run_id: bytes, root: bytes, size: int, index: int) -> int:
    """The index-th challenged step of the tree (root, size), uniform over [1, size-1]."""
    _check(block_hash, run_id, root, size)
    return _draw(bytes(block_hash), bytes(run_id), bytes(root), size, index, 0)[0]


def _draw(block_hash: bytes, run_id: bytes, root: bytes, size: int, index: int, counter: int) -> tuple[int, int]:
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
