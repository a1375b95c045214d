"""The sample schedule: the ordered dataset indices of every training step t = 1..T.

Batch leaf t = CBOR(["pot/batch/v1", t, indices]) at Merkle leaf index t-1; the schedule
commitment is the Merkle root over the T batch leaves.

Derivation from a seed (`derive_schedule`) uses our own counter-based generator, so every
machine derives the same schedule whatever its numpy or torch. Index j (0-based) of step t is:

    for counter = 0, 1, 2, ...:
        x = first 8 bytes, little-endian, of BLAKE3(CBOR(["pot/schedule-rng/v1", seed, t, j, counter]))
        if x < 2**64 - (2**64 mod num_samples): return x mod num_samples

Rejecting the top `2**64 mod n` values removes modulo bias, so each index is uniform on
[0, num_samples) and independent of every other (sampling with replacement).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

from commitments import cbor, merkle
from commitments.errors import CommitmentError
from commitments.hashing import h, structure_bytes

BATCH_DOMAIN = "pot/batch/v1"
RNG_DOMAIN = "pot/schedule-rng/v1"
_U64 = 1 << 64


class ScheduleError(CommitmentError):
    """A schedule request or batch that cannot be used, with the reason."""


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ScheduleError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_indices(indices: Sequence[int]) -> list[int]:
    if isinstance(indices, (str, bytes)):
        raise ScheduleError(f"a batch is a sequence of sample indices, got {type(indices).__name__}")
    out = []
    for k, i in enumerate(indices):
        # operator.index takes numpy and torch integers too, and refuses floats and strings.
        try:
            value = operator.index(i) if not isinstance(i, bool) else -1
        except TypeError:
            value = -1
        if value < 0:
            raise ScheduleError(f"batch index {k} must be a non-negative int, got {i!r}")
        out.append(value)
    return out


def _check_seed(seed: int | bytes) -> int | bytes:
    if isinstance(seed, bool) or not isinstance(seed, (int, bytes)):
        raise ScheduleError(f"seed must be an int in [0, 2**64) or bytes, got {type(seed).__name__}")
    if isinstance(seed, int) and not 0 <= seed < _U64:
        raise ScheduleError(f"seed {seed} is outside [0, 2**64)")
    return seed


def batch_leaf(t: int, indices: Sequence[int]) -> bytes:
    """The leaf data of step t: CBOR(["pot/batch/v1", t, indices])."""
    _positive_int("step t", t)
    return structure_bytes(BATCH_DOMAIN, t, _check_indices(indices))


def draw_index(seed: int | bytes, t: int, j: int, num_samples: int) -> int:
    """Index j of step t under the documented rejection-sampling rule."""
    _check_seed(seed)
    _positive_int("num_samples", num_samples)
    return _draw(cbor.encode(RNG_DOMAIN) + cbor.encode(seed), t, j, num_samples)


def _draw(prefix: bytes, t: int, j: int, n: int) -> int:
    return _draw_from(b"\x85" + prefix + cbor.encode(t) + cbor.encode(j), _U64 - (_U64 % n), n)


def _draw_from(stem: bytes, limit: int, n: int) -> int:
    # stem = the CBOR array head and every field but the counter; counter 0 encodes as 0x00.
    x = int.from_bytes(h(stem + b"\x00")[:8], "little")
    counter = 0
    while x >= limit:
        counter += 1
        x = int.from_bytes(h(stem + cbor.encode(counter))[:8], "little")
    return x % n


class Schedule:
    """The batches of steps 1..steps; batches are produced lazily, leaf hashes once when needed."""

    def __init__(self, steps: int, batch_fn: Callable[[int], list[int]], *, batch_size: int | None = None,
                 num_samples: int | None = None, seed: int | bytes | None = None) -> None:
        self.steps = _positive_int("steps", steps)
        self.batch_size = batch_size
        self.num_samples = num_samples
        self.seed = seed
        self._batch_fn = batch_fn
        self._tree: merkle.MerkleTree | None = None

    @classmethod
    def from_batches(cls, batches: Sequence[Sequence[int]]) -> Schedule:
        """An explicit schedule: `batches[t-1]` is the batch of step t."""
        fixed = [_check_indices(b) for b in batches]
        if not fixed:
            raise ScheduleError("a schedule needs at least one step")
        sizes = {len(b) for b in fixed}
        return cls(len(fixed), lambda t: list(fixed[t - 1]),
                   batch_size=sizes.pop() if len(sizes) == 1 else None)

    def _check_step(self, t: int) -> int:
        if not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= self.steps:
            raise ScheduleError(f"step {t!r} is outside the schedule's steps 1..{self.steps}")
        return t

    def batch(self, t: int) -> list[int]:
        """The ordered sample indices of step t (1-based)."""
        return self._batch_fn(self._check_step(t))

    def leaf(self, t: int) -> bytes:
        return batch_leaf(t, self.batch(t))

    @property
    def tree(self) -> merkle.MerkleTree:
        """The tree over the batch leaves, built once on first use."""
        if self._tree is None:
            self._tree = merkle.MerkleTree([merkle.leaf_hash(self.leaf(t)) for t in range(1, self.steps + 1)])
        return self._tree

    @property
    def commitment(self) -> bytes:
        """Merkle root over the batch leaves of steps 1..steps."""
        return self.tree.root()

    def proof(self, t: int) -> list[bytes]:
        """Inclusion proof of batch t (leaf index t-1) under `commitment`."""
        return self.tree.inclusion_proof(self._check_step(t) - 1)


def derive_schedule(seed: int | bytes, num_samples: int, steps: int, batch_size: int) -> Schedule:
    """The seeded schedule: `batch_size` indices per step drawn uniformly from [0, num_samples)."""
    _check_seed(seed)
    n = _positive_int("num_samples", num_samples)
    _positive_int("steps", steps)
    b = _positive_int("batch_size", batch_size)
    prefix = b"\x85" + cbor.encode(RNG_DOMAIN) + cbor.encode(seed)
    limit = _U64 - (_U64 % n)
    j_codes = [cbor.encode(j) for j in range(b)]

    def batch_fn(t: int) -> list[int]:
        stem_t = prefix + cbor.encode(t)
        return [_draw_from(stem_t + jc, limit, n) for jc in j_codes]

    return Schedule(steps, batch_fn, batch_size=b, num_samples=n, seed=seed)


def verify_batch(
    t: int, indices: Sequence[int], steps: int, proof: Sequence[bytes], commitment: bytes
) -> bool:
    """True iff `indices` is the batch of step t in the schedule with this commitment and length."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not isinstance(t, int) or isinstance(t, bool):
        return False
    if not 1 <= t <= steps:
        return False
    try:
        leaf = batch_leaf(t, indices)
    except (ScheduleError, TypeError):
        return False
    return merkle.verify_inclusion(leaf, t - 1, steps, list(proof), commitment)


__all__ = [
    "BATCH_DOMAIN",
    "RNG_DOMAIN",
    "Schedule",
    "ScheduleError",
    "batch_leaf",
    "derive_schedule",
    "draw_index",
    "verify_batch",
]
