"""The protocol's calls as typed values, and their one wire format.

A call travels as b"pot1" + canonical CBOR([call_name, {field: value}]) — in a dev-chain
transaction, a Substrate remark or a pallet argument alike. `decode_call` refuses anything that is
not exactly one of our calls (foreign remarks, bad CBOR, wrong fields) with `CallDecodeError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from commitments import cbor
from commitments.errors import CommitmentError

PREFIX = b"pot1"
# A call is small; the largest field is the spec. Remarks beyond this are not ours.
MAX_CALL_BYTES = 128 * 1024
MAX_SPEC_BYTES = 64 * 1024
MAX_TEXT = 2048  # uri, endpoint
MAX_LEAF_BYTES = 4096
MAX_PROOF_LEN = 64  # a Merkle proof over 2^64 leaves has at most 64 hashes
INT_MAX = 2**64 - 1
BUCKET_MIN, BUCKET_MAX = -(2**31), 2**31 - 1
SALT_MIN, SALT_MAX = 16, 64


class CallError(ValueError):
    """A call whose fields cannot be what the protocol expects, with the field and the reason."""


class CallDecodeError(CallError):
    """Bytes that are not a well-formed pot1 call (foreign remark, bad CBOR, unknown call, ...)."""


# --- field kinds: each checks one value and returns it normalised ----------------------------


def _bytes32(name: str, v: Any) -> bytes:
    if not isinstance(v, (bytes, bytearray)) or len(v) != 32:
        raise CallError(f"{name} must be 32 bytes, got {_describe(v)}")
    return bytes(v)


def _blob(limit: int, minimum: int = 0):
    def check(name: str, v: Any) -> bytes:
        if not isinstance(v, (bytes, bytearray)):
            raise CallError(f"{name} must be bytes, got {_describe(v)}")
        if not minimum <= len(v) <= limit:
            raise CallError(f"{name} must be {minimum}..{limit} bytes long, got {len(v)}")
        return bytes(v)

    return check


def _uint(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise CallError(f"{name} must be an integer, got {_describe(v)}")
    if not 0 <= v <= INT_MAX:
        raise CallError(f"{name} must be in 0..2^64-1, got {v}")
    return v


def _bucket(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise CallError(f"{name} must be an integer, got {_describe(v)}")
    if not BUCKET_MIN <= v <= BUCKET_MAX:
        raise CallError(f"{name} must be a 32-bit signed integer, got {v}")
    return v


def _text(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise CallError(f"{name} must be text, got {_describe(v)}")
    if len(v.encode("utf-8")) > MAX_TEXT:
        raise CallError(f"{name} is longer than {MAX_TEXT} bytes")
    return v


def _proof(name: str, v: Any) -> tuple[bytes, ...]:
    if not isinstance(v, (list, tuple)):
        raise CallError(f"{name} must be a list of 32-byte hashes, got {_describe(v)}")
    if len(v) > MAX_PROOF_LEN:
        raise CallError(f"{name} has {len(v)} hashes; a Merkle proof has at most {MAX_PROOF_LEN}")
    return tuple(_bytes32(f"{name}[{i}]", x) for i, x in enumerate(v))


def _describe(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        return f"{len(v)} bytes"
    return type(v).__name__


_SALT = _blob(SALT_MAX, SALT_MIN)
_SPEC = _blob(MAX_SPEC_BYTES, 1)
_LEAF = _blob(MAX_LEAF_BYTES, 1)


class Call:
    """Base of every protocol call: validates its fields on construction."""

    NAME: ClassVar[str]
    FIELDS: ClassVar[dict[str, Any]]

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, self.FIELDS[f.name](f.name, getattr(self, f.name)))

    def to_wire(self) -> dict[str, Any]:
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }


@dataclass(frozen=True)
class StartTrainingCommitment(Call):
    """Miner registers a run. `spec` is the spec's canonical CBOR; the protocol keeps its digest."""

    NAME: ClassVar[str] = "start_training_commitment"
    FIELDS: ClassVar[dict[str, Any]] = {
        "run_id": _bytes32,
        "initial_hash": _bytes32,
        "schedule_commitment": _bytes32,
        "dataset_hash": _bytes32,
        "spec": _SPEC,
        "declared_steps": _uint,
        "endpoint": _text,
    }
    run_id: bytes
    initial_hash: bytes
    schedule_commitment: bytes
    dataset_hash: bytes
    spec: bytes
    declared_steps: int
    endpoint: str


@dataclass(frozen=True)
class SubmitCheckpointRoot(Call):
    """Miner moves the run's checkpoint root forward (append-only, proven by consistency)."""

    NAME: ClassVar[str] = "submit_checkpoint_root"
    FIELDS: ClassVar[dict[str, Any]] = {
        "run_id": _bytes32,
        "root": _bytes32,
        "size": _uint,
        "consistency_proof": _proof,
    }
    run_id: bytes
    root: bytes
    size: int
    consistency_proof: tuple[bytes, ...]


@dataclass(frozen=True)
class SubmitOpening(Call):
    """Miner says where the opening of a challenge is, and shows leaf t with its inclusion proof."""

    NAME: ClassVar[str] = "submit_opening"
    FIELDS: ClassVar[dict[str, Any]] = {
        "challenge_id": _bytes32,
        "opening_digest": _bytes32,
        "uri": _text,
        "leaf": _LEAF,
        "leaf_proof": _proof,
    }
    challenge_id: bytes
    opening_digest: bytes
    uri: str
    leaf: bytes
    leaf_proof: tuple[bytes, ...]


@dataclass(frozen=True)
class CommitWitness(Call):
    """Verifier binds itself to a witness value without showing it."""

    NAME: ClassVar[str] = "commit_witness"
    FIELDS: ClassVar[dict[str, Any]] = {"challenge_id": _bytes32, "commitment": _bytes32}
    challenge_id: bytes
    commitment: bytes


@dataclass(frozen=True)
class RevealWitnessValue(Call):
    """Verifier opens its commitment: the value hash, norm bucket and salt it committed to."""

    NAME: ClassVar[str] = "reveal_witness_value"
    FIELDS: ClassVar[dict[str, Any]] = {
        "challenge_id": _bytes32,
        "value_hash": _bytes32,
        "norm_bucket": _bucket,
        "salt": _SALT,
    }
    challenge_id: bytes
    value_hash: bytes
    norm_bucket: int
    salt: bytes


@dataclass(frozen=True)
class DeclareWitnessNormBucket(Call):
    """Miner declares the reference norm bucket of step t (cross-architecture specs)."""

    NAME: ClassVar[str] = "declare_witness_norm_bucket"
    FIELDS: ClassVar[dict[str, Any]] = {"challenge_id": _bytes32, "bucket": _bucket}
    challenge_id: bytes
    bucket: int


CALL_TYPES: dict[str, type[Call]] = {
    c.NAME: c
    for c in (
        StartTrainingCommitment,
        SubmitCheckpointRoot,
        SubmitOpening,
        CommitWitness,
        RevealWitnessValue,
        DeclareWitnessNormBucket,
    )
}


def encode_call(call: Call) -> bytes:
    """The wire bytes of a call: b"pot1" + CBOR([name, {field: value}])."""
    if not isinstance(call, Call) or type(call).NAME not in CALL_TYPES:
        raise CallError(f"not a protocol call: {type(call).__name__}")
    data = PREFIX + cbor.encode([call.NAME, call.to_wire()])
    if len(data) > MAX_CALL_BYTES:
        raise CallError(f"{call.NAME} encodes to {len(data)} bytes, over the limit of {MAX_CALL_BYTES}")
    return data


def is_pot_payload(data: bytes) -> bool:
    """True when bytes carry our prefix (so a decode failure is worth a logged reason)."""
    return isinstance(data, (bytes, bytearray)) and bytes(data[: len(PREFIX)]) == PREFIX


def _shown(text: str, *, quote: bool = True, limit: int = 64) -> str:
    """Text from the wire as a message may show it: cut short, so a refusal stays small."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut) if quote else cut


def decode_call(data: bytes) -> Call:
    """Parse wire bytes into a call, or raise `CallDecodeError` saying what is wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CallDecodeError(f"call payload must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_CALL_BYTES:
        raise CallDecodeError(f"payload of {len(data)} bytes exceeds the limit of {MAX_CALL_BYTES}")
    if not data.startswith(PREFIX):
        raise CallDecodeError(f"payload does not start with {PREFIX!r} (not a pot1 call)")
    try:
        obj = cbor.decode(data[len(PREFIX) :], max_bytes=MAX_CALL_BYTES)
    except CommitmentError as exc:
        raise CallDecodeError(f"pot1 payload is not canonical CBOR: {exc}") from None
    if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], dict)):
        raise CallDecodeError("pot1 payload must be [call_name, {field: value}]")
    name, fields = obj
    cls = CALL_TYPES.get(name)
    if cls is None:
        raise CallDecodeError(f"unknown call {_shown(name)}; known: {', '.join(sorted(CALL_TYPES))}")
    expected = set(cls.FIELDS)
    if not all(isinstance(k, str) for k in fields):
        raise CallDecodeError(f"{name}: field names must be text")
    missing, extra = expected - set(fields), set(fields) - expected
    if missing:
        raise CallDecodeError(f"{name}: missing field(s) {', '.join(sorted(missing))}")
    if extra:
        shown = ", ".join(_shown(k, quote=False, limit=40) for k in sorted(extra)[:5])
        raise CallDecodeError(f"{name}: unknown field(s) {shown}{', ...' if len(extra) > 5 else ''}")
    try:
        return cls(**fields)
    except CallError as exc:
        raise CallDecodeError(f"{name}: {exc}") from None


__all__ = [
    "CALL_TYPES",
    "Call",
    "CallDecodeError",
    "CallError",
    "CommitWitness",
    "DeclareWitnessNormBucket",
    "MAX_CALL_BYTES",
    "PREFIX",
    "RevealWitnessValue",
    "StartTrainingCommitment",
    "SubmitCheckpointRoot",
    "SubmitOpening",
    "decode_call",
    "encode_call",
    "is_pot_payload",
]
