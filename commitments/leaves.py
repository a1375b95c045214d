"""Step leaves: what the checkpoint tree commits to after every training step.

Leaf t = CBOR(["pot/step/v1", t, state_digest_t, loss_bits_t]), at Merkle leaf index t. Leaf 0 is
the initial state (before any step); it has no loss, so its loss_bits is 0 by convention. A
step's loss is committed as the IEEE-754 float32 bit pattern read as an unsigned int, so the
leaf never depends on how a float prints or rounds.
"""

from __future__ import annotations

import math
import struct
from typing import Any, NamedTuple

import numpy as np

from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import DIGEST_SIZE, h, structure_bytes

STEP_DOMAIN = "pot/step/v1"
INITIAL_LOSS_BITS = 0


class LeafError(CommitmentError):
    """A step leaf or loss value that is malformed, with the reason."""


class StepLeaf(NamedTuple):
    t: int
    state_digest: bytes
    loss_bits: int

    @property
    def loss(self) -> float:
        return loss_from_bits(self.loss_bits)

    def to_bytes(self) -> bytes:
        return step_leaf(self.t, self.state_digest, self.loss_bits)


def _check_fields(t: Any, state_digest: Any, loss_bits: Any) -> None:
    if not isinstance(t, int) or isinstance(t, bool) or t < 0:
        raise LeafError(f"step leaf: t must be a non-negative int, got {t!r}")
    if not isinstance(state_digest, bytes) or len(state_digest) != DIGEST_SIZE:
        got = f"{len(state_digest)} bytes" if isinstance(state_digest, bytes) else type(state_digest).__name__
        raise LeafError(f"step leaf {t}: state_digest must be {DIGEST_SIZE} bytes, got {got}")
    if not isinstance(loss_bits, int) or isinstance(loss_bits, bool) or not 0 <= loss_bits < 1 << 32:
        raise LeafError(f"step leaf {t}: loss_bits must be an unsigned 32-bit int, got {loss_bits!r}")
    if t == 0 and loss_bits != INITIAL_LOSS_BITS:
        raise LeafError(f"step leaf 0 is the initial state and carries loss_bits 0, got {loss_bits}")


def step_leaf(t: int, state_digest: bytes, loss_bits: int) -> bytes:
    """The leaf data for step t (t = 0: the initial state, loss_bits 0)."""
    _check_fields(t, state_digest, loss_bits)
    return structure_bytes(STEP_DOMAIN, t, state_digest, loss_bits)


def initial_leaf(state_digest: bytes) -> bytes:
    """Leaf 0: the initial state."""
    return step_leaf(0, state_digest, INITIAL_LOSS_BITS)


def parse_step_leaf(data: bytes) -> StepLeaf:
    """Decode and validate leaf bytes; refuses anything but a canonical step leaf."""
    try:
        obj = cbor.decode(data)
    except CommitmentError as exc:
        raise LeafError(f"step leaf is not canonical CBOR: {exc}") from None
    if not isinstance(obj, list) or len(obj) != 4:
        shape = f"a list of {len(obj)}" if isinstance(obj, list) else type(obj).__name__
        raise LeafError(f"step leaf must be [domain, t, state_digest, loss_bits], got {shape}")
    domain, t, state_digest, loss_bits = obj
    if domain != STEP_DOMAIN:
        raise LeafError(f"step leaf domain must be {STEP_DOMAIN!r}, got {domain!r}")
    _check_fields(t, state_digest, loss_bits)
    return StepLeaf(t, state_digest, loss_bits)


def witness_value_hash(leaf_bytes: bytes) -> bytes:
    """The value a verifier reveals for an exact profile: BLAKE3 of the recomputed leaf bytes."""
    if not isinstance(leaf_bytes, (bytes, bytearray)):
        raise LeafError(f"leaf bytes expected, got {type(leaf_bytes).__name__}")
    return h(bytes(leaf_bytes))


def loss_bits(loss: Any) -> int:
    """The float32 bit pattern of a loss, as an unsigned int.

    Accepts a one-element float32 torch tensor or numpy array/scalar, or a Python float that is
    exactly representable in float32 (anything else would be a silent rounding).
    """
    if isinstance(loss, bool):
        raise LeafError("loss must be a float32 value, got bool")
    # np.float64 subclasses float; numpy values take the dtype-checked path below.
    if isinstance(loss, float) and not isinstance(loss, np.generic):
        try:
            packed = struct.pack("<f", loss)
        except OverflowError:
            raise LeafError(f"loss {loss!r} overflows float32") from None
        if not math.isnan(loss) and struct.unpack("<f", packed)[0] != loss:
            raise LeafError(f"loss {loss!r} is not exactly a float32; pass the float32 tensor itself")
        return int.from_bytes(packed, "little")
    if type(loss).__module__.startswith("torch"):
        import torch

        if not isinstance(loss, torch.Tensor):
            raise LeafError(f"loss must be a tensor or float, got {type(loss).__name__}")
        if loss.dtype != torch.float32:
            raise LeafError(f"loss tensor must be float32, got {loss.dtype}")
        if loss.numel() != 1:
            raise LeafError(f"loss tensor must hold one element, got shape {tuple(loss.shape)}")
        arr = loss.detach().to("cpu").reshape(1).numpy()
    else:
        arr = np.asarray(loss)
        if arr.dtype != np.float32:
            raise LeafError(f"loss must be float32, got {arr.dtype}")
        if arr.size != 1:
            raise LeafError(f"loss must hold one element, got shape {arr.shape}")
    return int(arr.reshape(1).view(np.uint32)[0])


def loss_from_bits(bits: int) -> float:
    """The float32 value (as a Python float) with this bit pattern."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 0 <= bits < 1 << 32:
        raise LeafError(f"loss_bits must be an unsigned 32-bit int, got {bits!r}")
    return struct.unpack("<f", bits.to_bytes(4, "little"))[0]


__all__ = [
    "INITIAL_LOSS_BITS",
    "LeafError",
    "STEP_DOMAIN",
    "StepLeaf",
    "initial_leaf",
    "loss_bits",
    "loss_from_bits",
    "parse_step_leaf",
    "step_leaf",
    "witness_value_hash",
]
