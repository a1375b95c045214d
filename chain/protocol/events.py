"""Protocol events: what applying a block records. Each event type carries a stable `code`, the
name under which it is emitted (`to_dict()["event"]`) and stored; codes never follow class names,
so renaming a class changes no record."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v



@dataclass(frozen=True)
class Event:
    """A protocol event at a block. `to_dict()` is JSON-ready (bytes as hex).

    `code` is the event's stable name; every subclass declares its own. `NAME` is the same code
    under its older spelling.
    """

    code: ClassVar[str] = "Event"
    NAME: ClassVar[str] = "Event"
    block: int

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "code" not in cls.__dict__:
            raise TypeError(f"event {cls.__qualname__} must declare its own stable `code`")
        cls.NAME = cls.code

    def to_dict(self) -> dict[str, Any]:
        d = {"event": self.code}
        d.update({f.name: _jsonable(getattr(self, f.name)) for f in fields(self)})
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunRegistered(Event):
    code: ClassVar[str] = "RunRegistered"
    run_id: bytes
    miner: str
    spec_digest: bytes
    mode: str  # "value" (exact profile) or "bucket" (cross-architecture)
    declared_steps: int
    endpoint: str
    initial_hash: bytes
    schedule_commitment: bytes
    dataset_hash: bytes
    stake: int
    escrow: int = 0  # the verification fees escrowed for the run's challenges (protocol v3)
    checkpoint_interval: int = 1  # the most steps between two states the miner keeps
    opening_blocks: int = 0  # the run's opening window, sized for regenerating that many steps


@dataclass(frozen=True)
class CheckpointRootUpdated(Event):
    code: ClassVar[str] = "CheckpointRootUpdated"
    run_id: bytes
    root: bytes
    size: int
    complete: bool
    challenges_at: int | None  # block at which challenges will be issued, once complete


@dataclass(frozen=True)
class ChallengeIssued(Event):
    code: ClassVar[str] = "ChallengeIssued"
    challenge_id: bytes
    run_id: bytes
    index: int
    step: int
    root: bytes
    size: int
    mode: str
    endpoint: str
    opening_deadline: int
    commit_deadline: int
    reveal_deadline: int
    round: int = 1  # 1 for a first challenge; a re-challenge of the same step counts on
    first: bytes | None = None  # the first round's challenge id (None: this is the first round)
    committee: tuple[str, ...] = ()  # the accounts whose reveals count, in draw order
    escalate_deadline: int = 0  # the last block of escalations; the round resolves at the block after


@dataclass(frozen=True)
class OpeningSubmitted(Event):
    code: ClassVar[str] = "OpeningSubmitted"
    challenge_id: bytes
    run_id: bytes
    step: int
    opening_digest: bytes
    uri: str
    leaf: bytes
    leaf_hash: bytes  # H(leaf t): the value half an honest exact-profile replay reveals
    mirrors: tuple[str, ...] = ()  # further addresses of the same bytes


@dataclass(frozen=True)
class NormBucketDeclared(Event):
    code: ClassVar[str] = "NormBucketDeclared"
    challenge_id: bytes
    bucket: int


@dataclass(frozen=True)
class WitnessCommitted(Event):
    code: ClassVar[str] = "WitnessCommitted"
    challenge_id: bytes
    verifier: str
    commitment: bytes


@dataclass(frozen=True)
class WitnessRevealed(Event):
    code: ClassVar[str] = "WitnessRevealed"
    challenge_id: bytes
    verifier: str
    value_hash: bytes
    norm_bucket: int
    proof_hash: bytes = b"\x00" * 32


@dataclass(frozen=True)
class RevealRejected(Event):
    code: ClassVar[str] = "RevealRejected"
    challenge_id: bytes
    verifier: str
    reason: str


@dataclass(frozen=True)
class ChallengeResolved(Event):
    code: ClassVar[str] = "ChallengeResolved"
    challenge_id: bytes
    run_id: bytes
    step: int
    verdict: str
    reason: str
    mode: str
    winning_value: bytes | int | None
    cluster_size: int
    reveals: int
    clusters: tuple[tuple[bytes | int, int], ...]
    outliers: tuple[str, ...]
    round: int = 1
    rechallenge: bytes | None = None  # the next round's challenge id, when this round re-challenges


@dataclass(frozen=True)
class MinerSlashed(Event):
    code: ClassVar[str] = "MinerSlashed"
    run_id: bytes
    challenge_id: bytes
    miner: str
    amount: int
    reason: str


@dataclass(frozen=True)
class VerifierOutlier(Event):
    code: ClassVar[str] = "VerifierOutlier"
    challenge_id: bytes
    verifier: str
    value_hash: bytes
    norm_bucket: int


@dataclass(frozen=True)
class VerifierBonded(Event):
    """An account bonded `amount` as a verifier (a top-up adds to its bond)."""

    code: ClassVar[str] = "VerifierBonded"
    verifier: str
    amount: int
    bond: int  # its active bond after this one


@dataclass(frozen=True)
class VerifierUnbonding(Event):
    code: ClassVar[str] = "VerifierUnbonding"
    verifier: str
    amount: int
    release_block: int
    bond: int  # its active bond left


@dataclass(frozen=True)
class BondReleased(Event):
    """An unbonding amount reached its release block. On the dev chain the amount is free again;
    on a remark-only Substrate deployment it stays in the keyless account (docs/protocol.md)."""

    code: ClassVar[str] = "BondReleased"
    verifier: str
    amount: int


@dataclass(frozen=True)
class VerifierPenalized(Event):
    """A committee member paid from its bond: `why` is no_commit, no_reveal or outlier."""

    code: ClassVar[str] = "VerifierPenalized"
    challenge_id: bytes
    verifier: str
    amount: int  # what was taken (at most what it had left)
    why: str


@dataclass(frozen=True)
class CallRefused(Event):
    code: ClassVar[str] = "CallRefused"
    origin: str
    call: str
    refusal: str  # the refusal's code (Refused.code), never its class name
    reason: str


@dataclass(frozen=True)
class RemarkIgnored(Event):
    """A payload with the pot1 prefix that was no call (it could not be decoded), or a call whose
    application failed unexpectedly. Every node records the same one for the same payload, of
    bounded size: a reason code with its fixed message, never the payload's bytes."""

    code: ClassVar[str] = "RemarkIgnored"
    position: int  # the payload's place in its block (see chain.calls.Ignored)
    origin: str
    reason: str  # a code of chain.calls.IGNORE_REASONS
    message: str  # the code's fixed message
    size: int
    payload_digest: bytes
    detail: str = ""  # what exactly is wrong (the field, the rule), bounded; "" for faults


@dataclass(frozen=True)
class NetworkConfigured(Event):
    """A configure_network record was accepted: `params` take effect at `effective_block`."""

    code: ClassVar[str] = "NetworkConfigured"
    authority: str
    params_digest: bytes
    params: dict[str, Any]  # ProtocolParams.to_dict()
    effective_block: int


@dataclass(frozen=True)
class ParamsEffective(Event):
    """Parameters of a configure_network record took effect at this block."""

    code: ClassVar[str] = "ParamsEffective"
    params_digest: bytes
    configured_at: int  # the block of the record


@dataclass(frozen=True)
class BlockWorkFailed(Event):
    """A part of a block's protocol work (§4.2) failed inside the protocol (a bug, or a state it
    cannot handle): that part was rolled back and the follower went on. Every node records the
    same one: the stage, the item it was working on, and the exception's type alone, never its
    text (which may hold values, and differ between builds)."""

    code: ClassVar[str] = "BlockWorkFailed"
    stage: str  # one of BLOCK_WORK_STAGES
    subject: (
        bytes | str | None
    )  # the challenge (resolution), run (issuance), account (release); None: the stage
    error_type: str  # the exception's class name


@dataclass(frozen=True)
class ChallengeEscalated(Event):
    """An account disputed a round's verdict (`disputes`: "honest" or "fraud"), reserving `stake` of
    its bond on the dispute round ruling the other way."""

    code: ClassVar[str] = "ChallengeEscalated"
    challenge_id: bytes
    verifier: str
    stake: int
    disputes: str


@dataclass(frozen=True)
class VerifierPaid(Event):
    """A verifier was credited `amount` (to its active bond): `why` is "seat_fee" (a winning seat's
    fee from the run's escrow), "slash_share" (its share of a miner's slash) or "dispute_pool"
    (its share of forfeited escalation stakes)."""

    code: ClassVar[str] = "VerifierPaid"
    challenge_id: bytes
    verifier: str
    amount: int
    why: str


@dataclass(frozen=True)
class EscalationSettled(Event):
    """The dispute round settled an escalation: `returned` went back to the escalator's free bond,
    `forfeited` was taken (the dispute's value half differs from the escalator's)."""

    code: ClassVar[str] = "EscalationSettled"
    challenge_id: bytes  # the escalated round
    verifier: str
    returned: int
    forfeited: int


@dataclass(frozen=True)
class Burned(Event):
    """Units that left circulation: the part of a slash not paid to seats, the remainder of an
    integer share, the escrow of an unresolved run, a reward past the bond cap."""

    code: ClassVar[str] = "Burned"
    subject: bytes  # the challenge or run
    amount: int
    why: str


@dataclass(frozen=True)
class RunSettled(Event):
    """Every challenge of the run resolved: the miner's remaining stake and escrow are released
    (an unresolved challenge keeps the stake locked and burns the escrow instead)."""

    code: ClassVar[str] = "RunSettled"
    run_id: bytes
    miner: str
    stake_released: int
    escrow_released: int
    escrow_burned: int
    unresolved: int  # challenges left unresolved after their dispute round


# The stages of a block's protocol work, in the order they run (docs/protocol.md §4.2).
BLOCK_WORK_STAGES = ("activation", "release", "issuance", "resolution")


EVENT_TYPES: dict[str, type[Event]] = {
    c.code: c
    for c in (
        RunRegistered, CheckpointRootUpdated, ChallengeIssued, OpeningSubmitted, NormBucketDeclared,
        WitnessCommitted, WitnessRevealed, RevealRejected, ChallengeResolved, MinerSlashed,
        VerifierOutlier, CallRefused, RemarkIgnored, NetworkConfigured, ParamsEffective,
        VerifierBonded, VerifierUnbonding, BondReleased, VerifierPenalized, BlockWorkFailed,
        ChallengeEscalated, VerifierPaid, EscalationSettled, Burned, RunSettled,
    )
}
