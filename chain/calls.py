"""The protocol's calls as typed values, and their one wire format.

A call travels as b"pot1" + canonical CBOR([call_name, {field: value}]) — in a dev-chain
transaction, a Substrate remark or a pallet argument alike. `decode_call` refuses anything that is
not exactly one of our calls (foreign remarks, bad CBOR, wrong fields) with `CallDecodeError`,
whose `reason` is one of the bounded codes of `IGNORE_REASONS`; it never raises anything else, so
a transport turns every bad payload into an `Ignored` record and reads on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from commitments import cbor
from commitments.errors import CommitmentError
from commitments.hashing import digest

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
NONCE_MIN, NONCE_MAX = 16, 32
MAX_MIRRORS = 4  # further addresses of one opening, besides its uri


class CallError(ValueError):
    """A call whose fields cannot be what the protocol expects, with the field and the reason."""


# Why a payload carrying our prefix was not a call: a bounded set of codes, each with a fixed
# message. These are what an ignored record holds (never the payload's bytes or a decoder's text),
# so every node records the same thing for the same remark and the record has a bounded size.
IGNORE_REASONS: dict[str, str] = {
    "too_large": "the payload is over the size limit of a call",
    "bad_cbor": "the payload is not canonical CBOR of the kinds a call uses",
    "bad_shape": "the payload is not [call_name, {field: value}]",
    "unknown_call": "the payload names no protocol call",
    "bad_fields": "the call's fields are missing, unknown or out of range",
    "truncated": "the payload is shorter than the pot1 prefix",
    "bad_prefix": "the payload nearly carries the pot1 prefix (its detail says how)",
    "unfunded_bond": "a bond_verifier call without its transfer into the protocol account in the same "
                     "extrinsic",
    "unfunded_run": "a start_training_commitment without its stake and escrow transfer in the same extrinsic",
    "decoder_fault": "decoding the payload failed unexpectedly",
    "transport_fault": "reading the payload from its block failed unexpectedly",
}


# Reasons whose decoder message is our own deterministic text about the payload (the field, the
# rule): an ignored record keeps it, cut to MAX_DETAIL, as its `detail`. Faults keep none.
DETAILED_REASONS = frozenset({"too_large", "bad_cbor", "bad_shape", "unknown_call", "bad_fields", "truncated",
                              "bad_prefix", "unfunded_bond", "unfunded_run"})
MAX_DETAIL = 240


class CallDecodeError(CallError):
    """Bytes that are not a well-formed pot1 call (foreign remark, bad CBOR, unknown call, ...).

    `reason` is a code of IGNORE_REASONS; the message says what is wrong (the field, the rule).
    """

    def __init__(self, message: str, reason: str = "bad_shape") -> None:
        super().__init__(message)
        self.reason = reason if reason in IGNORE_REASONS else "decoder_fault"

    @property
    def detail(self) -> str:
        """The bounded text an ignored record keeps: the message, for reasons our decoder words."""
        return _cut(str(self), MAX_DETAIL) if self.reason in DETAILED_REASONS else ""


@dataclass(frozen=True)
class Ignored:
    """A payload with our prefix that a transport could not turn into a call: where it was in
    its block, who sent it, why (a code of IGNORE_REASONS), its size and its BLAKE3 digest."""

    position: int  # its index among the block's protocol payloads, calls and ignored alike
    origin: str
    reason: str
    size: int
    payload_digest: bytes
    detail: str = ""  # what exactly is wrong (CallDecodeError.detail), bounded; "" for faults

    @classmethod
    def of(cls, position: int, origin: str, payload: Any, reason: str, detail: str = "") -> Ignored:
        data = bytes(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else b""
        reason = reason if reason in IGNORE_REASONS else "decoder_fault"
        detail = _cut(detail, MAX_DETAIL) if isinstance(detail, str) and reason in DETAILED_REASONS else ""
        return cls(position, origin, reason, len(data), digest("pot/ignored-payload/v1", data), detail)

    @classmethod
    def of_error(cls, position: int, origin: str, payload: Any, exc: CallDecodeError) -> Ignored:
        return cls.of(position, origin, payload, exc.reason, exc.detail)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


def _uris(name: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)):
        raise CallError(f"{name} must be a list of text, got {_describe(v)}")
    if len(v) > MAX_MIRRORS:
        raise CallError(f"{name} holds {len(v)} addresses; at most {MAX_MIRRORS}")
    return tuple(_text(f"{name}[{i}]", x) for i, x in enumerate(v))


def _amount(name: str, v: Any) -> int:
    v = _uint(name, v)
    if v < 1:
        raise CallError(f"{name} must be at least 1")
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
_NONCE = _blob(NONCE_MAX, NONCE_MIN)
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
    """Miner registers a run. `spec` is the spec's canonical CBOR; the protocol keeps its digest.

    The run id belongs to its sender: it must be `derive_run_id(origin, nonce)`, so a registration
    copied out of the transaction pool names a run id that is not the copier's."""

    NAME: ClassVar[str] = "start_training_commitment"
    FIELDS: ClassVar[dict[str, Any]] = {
        "run_id": _bytes32,
        "nonce": _NONCE,
        "initial_hash": _bytes32,
        "schedule_commitment": _bytes32,
        "dataset_hash": _bytes32,
        "spec": _SPEC,
        "declared_steps": _uint,
        "endpoint": _text,
        "checkpoint_interval": _amount,
    }
    run_id: bytes
    nonce: bytes
    initial_hash: bytes
    schedule_commitment: bytes
    dataset_hash: bytes
    spec: bytes
    declared_steps: int
    endpoint: str
    # The most steps between two states the miner keeps (its keep-every): an opening of any step
    # replays at most checkpoint_interval - 1 steps from a kept state, and the run's opening window
    # is sized for that (docs/protocol.md, "Window sizing").
    checkpoint_interval: int = 1


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
        "mirrors": _uris,
        "leaf": _LEAF,
        "leaf_proof": _proof,
    }
    challenge_id: bytes
    opening_digest: bytes
    uri: str
    leaf: bytes
    leaf_proof: tuple[bytes, ...]
    mirrors: tuple[str, ...] = ()  # further addresses of the same bytes (bound by opening_digest)


@dataclass(frozen=True)
class CommitWitness(Call):
    """Verifier binds itself to a witness value without showing it."""

    NAME: ClassVar[str] = "commit_witness"
    FIELDS: ClassVar[dict[str, Any]] = {"challenge_id": _bytes32, "commitment": _bytes32}
    challenge_id: bytes
    commitment: bytes


@dataclass(frozen=True)
class RevealWitnessValue(Call):
    """Verifier opens its commitment: the witness pair (value hash, proof hash), the norm bucket
    and the salt it committed to. `value_hash` is H(recomputed leaf t); `proof_hash` is the keyed
    digest of the whole recomputed post-state (challenges.witness.state_proof), which no public
    data gives."""

    NAME: ClassVar[str] = "reveal_witness_value"
    FIELDS: ClassVar[dict[str, Any]] = {
        "challenge_id": _bytes32,
        "value_hash": _bytes32,
        "proof_hash": _bytes32,
        "norm_bucket": _bucket,
        "salt": _SALT,
    }
    challenge_id: bytes
    value_hash: bytes
    proof_hash: bytes
    norm_bucket: int
    salt: bytes


@dataclass(frozen=True)
class DeclareWitnessNormBucket(Call):
    """Miner declares the reference norm bucket of step t (cross-architecture specs)."""

    NAME: ClassVar[str] = "declare_witness_norm_bucket"
    FIELDS: ClassVar[dict[str, Any]] = {"challenge_id": _bytes32, "bucket": _bucket}
    challenge_id: bytes
    bucket: int


@dataclass(frozen=True)
class BondVerifier(Call):
    """An account bonds `amount` (protocol units) as a verifier, or tops its bond up.

    On the dev chain the bond is accounting. On a Substrate chain the same extrinsic must carry a
    transfer of `amount` x the network's planck-per-unit into the protocol's keyless account; the
    transport passes the call on only then (chain.substrate.remark), so every node can check it."""

    NAME: ClassVar[str] = "bond_verifier"
    FIELDS: ClassVar[dict[str, Any]] = {"amount": _amount}
    amount: int


@dataclass(frozen=True)
class UnbondVerifier(Call):
    """A verifier starts unbonding `amount`: it leaves committee draws at once and the amount is
    released after the unbonding delay, still answerable for the challenges it sits on."""

    NAME: ClassVar[str] = "unbond_verifier"
    FIELDS: ClassVar[dict[str, Any]] = {"amount": _amount}
    amount: int


@dataclass(frozen=True)
class EscalateChallenge(Call):
    """A seat of a resolved-to-be round that revealed another value than the winning cluster's
    escalates the step to the dispute round, reserving the network's escalation_stake of its free
    bond; it loses that stake if the dispute round proves it wrong (docs/protocol.md, "Escalation")."""

    NAME: ClassVar[str] = "escalate_challenge"
    FIELDS: ClassVar[dict[str, Any]] = {"challenge_id": _bytes32}
    challenge_id: bytes


MAX_PARAMS_BYTES = 4096


@dataclass(frozen=True)
class ConfigureNetwork(Call):
    """The network's authority fixes the protocol parameters from `effective_block` on.

    `params` is the canonical CBOR of `ProtocolParams.to_dict()`. Only the authority's records
    count (any other sender's is refused, `NotAuthority`): a dev chain file records its creator as
    the authority, and a node on a Substrate chain must pin it (`[chain] authority`); only a reader
    with neither lets the first accepted record name it (docs/protocol.md §11). Each record changes
    the parameters at a stated later block, never retroactively.
    """

    NAME: ClassVar[str] = "configure_network"
    FIELDS: ClassVar[dict[str, Any]] = {"params": _blob(MAX_PARAMS_BYTES, 1), "effective_block": _uint}
    params: bytes
    effective_block: int


CALL_TYPES: dict[str, type[Call]] = {
    c.NAME: c
    for c in (
        StartTrainingCommitment,
        SubmitCheckpointRoot,
        SubmitOpening,
        CommitWitness,
        RevealWitnessValue,
        DeclareWitnessNormBucket,
        ConfigureNetwork,
        BondVerifier,
        UnbondVerifier,
        EscalateChallenge,
    )
}


RUN_ID_DOMAIN = "pot/run-id/v2"


def derive_run_id(origin: str, nonce: bytes) -> bytes:
    """The run id an account may register: digest("pot/run-id/v2", origin, nonce)."""
    if not isinstance(origin, str) or not origin:
        raise CallError("origin must be a non-empty account id")
    nonce = _NONCE("nonce", nonce)
    return digest(RUN_ID_DOMAIN, origin, nonce)


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


_HEX_PREFIX = b"0x" + PREFIX.hex().encode()


def near_miss(data: bytes) -> CallDecodeError | None:
    """Why bytes that are no pot1 payload were surely meant as one, or None for a foreign remark.

    Recognised: a payload shorter than the prefix that begins it ("truncated"); the prefix with
    its first byte eaten as a SCALE length (b"ot1..." : a client passed the payload as a byte
    array where a remark wants hex, see docs/protocol.md), the payload's 0x-hex spelled as text,
    or the prefix in another case ("bad_prefix"). Other remarks are not ours and stay unrecorded.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    data = bytes(data)
    if data.startswith(PREFIX):
        return None
    if 0 < len(data) < len(PREFIX) and PREFIX.startswith(data):
        return CallDecodeError(
            f"the payload is {len(data)} byte(s), {data!r}: a cut pot1 prefix", "truncated"
        )
    if data.startswith(PREFIX[1:]) and len(data) > len(PREFIX) - 1:
        return CallDecodeError(
            "the payload starts with b'ot1': its first byte (p, 0x70) was read as a SCALE length, so only "
            f"{len(data)} bytes of it went on chain; submit the remark as a 0x-hex string", "bad_prefix")
    if data[: len(_HEX_PREFIX)].lower() == _HEX_PREFIX:
        return CallDecodeError("the payload is the 0x-hex of a pot1 call spelled as text; submit its bytes",
                               "bad_prefix")
    if data[: len(PREFIX)].lower() == PREFIX:
        return CallDecodeError(f"the payload starts with {data[:len(PREFIX)]!r}, not b'pot1'", "bad_prefix")
    return None


def read_payload(data: bytes) -> Call | CallDecodeError | None:
    """What a transport makes of one payload: a call, the error of a pot1 payload that is no call
    (or of a near miss, see `near_miss`), or None for a foreign payload. Never raises."""
    if not is_pot_payload(data):
        return near_miss(data)
    try:
        return decode_call(data)
    except CallDecodeError as exc:
        return exc


def _shown(text: str, *, quote: bool = True, limit: int = 64) -> str:
    """Text from the wire as a message may show it: cut short, so a refusal stays small."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut) if quote else cut


def decode_call(data: bytes) -> Call:
    """Parse wire bytes into a call, or raise `CallDecodeError` saying what is wrong.

    Nothing else escapes: an unexpected failure inside decoding (a decoder bug, a recursion or
    digit limit) becomes a CallDecodeError with reason "decoder_fault".
    """
    try:
        return _decode_call(data)
    except CallDecodeError:
        raise
    except Exception as exc:
        raise CallDecodeError(
            f"decoding failed unexpectedly ({type(exc).__name__})", "decoder_fault"
        ) from None


def _decode_call(data: bytes) -> Call:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CallDecodeError(f"call payload must be bytes, got {type(data).__name__}", "bad_shape")
    data = bytes(data)
    if len(data) > MAX_CALL_BYTES:
        raise CallDecodeError(
            f"payload of {len(data)} bytes exceeds the limit of {MAX_CALL_BYTES}", "too_large"
        )
    if not data.startswith(PREFIX):
        raise CallDecodeError(f"payload does not start with {PREFIX!r} (not a pot1 call)", "bad_shape")
    try:
        obj = cbor.decode(
            data[len(PREFIX) :], max_bytes=MAX_CALL_BYTES, max_items=_MAX_ITEMS, max_depth=_MAX_DEPTH
        )
    except CommitmentError as exc:
        raise CallDecodeError(f"pot1 payload is not canonical CBOR: {exc}", "bad_cbor") from None
    if not (isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], dict)):
        raise CallDecodeError("pot1 payload must be [call_name, {field: value}]", "bad_shape")
    name, fields = obj
    cls = CALL_TYPES.get(name)
    if cls is None:
        raise CallDecodeError(
            f"unknown call {_shown(name)}; known: {', '.join(sorted(CALL_TYPES))}", "unknown_call"
        )
    expected = set(cls.FIELDS)
    if not all(isinstance(k, str) for k in fields):
        raise CallDecodeError(f"{name}: field names must be text", "bad_fields")
    missing, extra = expected - set(fields), set(fields) - expected
    if missing:
        raise CallDecodeError(f"{name}: missing field(s) {', '.join(sorted(missing))}", "bad_fields")
    if extra:
        shown = ", ".join(_shown(k, quote=False, limit=40) for k in sorted(extra)[:5])
        raise CallDecodeError(
            f"{name}: unknown field(s) {shown}{', ...' if len(extra) > 5 else ''}", "bad_fields"
        )
    try:
        return cls(**fields)
    except CallError as exc:
        raise CallDecodeError(f"{name}: {exc}", "bad_fields") from None


# The most CBOR items a call can hold (six 32-byte fields, two proofs of MAX_PROOF_LEN hashes) and
# its nesting ([name, {field: [hash, ...]}]), with room to spare: the decoder stops at either.
_MAX_ITEMS = 4 * MAX_PROOF_LEN + 64
_MAX_DEPTH = 8


__all__ = [
    "BondVerifier",
    "UnbondVerifier",
    "derive_run_id",
    "CALL_TYPES",
    "Call",
    "ConfigureNetwork",
    "CallDecodeError",
    "CallError",
    "IGNORE_REASONS",
    "Ignored",
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
    "near_miss",
    "read_payload",
]
