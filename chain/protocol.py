"""The protocol as one deterministic state machine, the same code behind every transport.

`on_block(state, block)` runs first for each finalized block (issue due challenges from that
block's hash, resolve challenges whose windows have closed), then `apply(state, call, origin,
block)` runs for each call of the block in chain order. Refusals raise `Refused` subclasses with a
reason and leave the state as it was; `apply_recorded` turns them into `CallRefused` events.

Timeline of a run (all counts in blocks, constants in `ProtocolParams`):
  * the miner registers the run (bonding `miner_stake`) and moves its checkpoint root forward;
  * once a root covers every declared step (size = declared_steps + 1) at block B, challenges are
    issued at block I = B + challenge_delay from block I's hash, so the challenged steps derive
    from a block that did not exist when the root was submitted;
  * the opening is due by I + opening_deadline (none by then: fraud);
  * verifiers commit until commit_deadline = opening deadline + commit_window, then reveal until
    reveal_deadline = commit_deadline + reveal_window; the challenge resolves at the next block.
Verifiers need no registration: the first `commit_witness` of an account bonds `verifier_stake`
for it (the miner of a run cannot witness its own challenges).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from fractions import Fraction
from typing import Any, ClassVar

from chain.calls import (
    Call,
    CommitWitness,
    DeclareWitnessNormBucket,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
)
from challenges.derive import challenge_id as derive_challenge_id
from challenges.derive import challenge_steps
from challenges.verdict import FRAUD, Reveal, decide
from challenges.witness import verify_witness
from commitments import cbor
from commitments.errors import CommitmentError
from commitments.leaves import parse_step_leaf, witness_value_hash
from commitments.merkle import verify_consistency, verify_inclusion
from commitments.spec import Spec

SNAPSHOT_VERSION = "pot/protocol-state/v1"


# --- parameters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProtocolParams:
    """Every constant of the protocol. Windows and deadlines are counted in blocks."""

    commit_window: int = 4
    reveal_window: int = 4
    opening_deadline: int = 4  # blocks after issuance by which the opening must be on chain
    challenges_per_run: int = 1
    challenge_delay: int = 2  # blocks after the complete root before challenges are issued
    quorum_min_reveals: int = 3
    quorum_share: Fraction = Fraction(1, 2)  # share of all reveals the largest cluster needs
    miner_stake: int = 1000
    verifier_stake: int = 100
    slash_amount: int = 500
    # Demo/test knob: steps challenged first whatever the randomness says (e.g. (7,)).
    forced_challenge_steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "quorum_share", Fraction(self.quorum_share))
        object.__setattr__(self, "forced_challenge_steps", tuple(self.forced_challenge_steps))
        for name in ("commit_window", "reveal_window", "opening_deadline", "challenge_delay",
                     "challenges_per_run", "quorum_min_reveals"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"protocol parameter {name} must be a positive integer, got {v!r}")
        for name in ("miner_stake", "verifier_stake", "slash_amount"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"protocol parameter {name} must be a non-negative integer, got {v!r}")
        if not 0 < self.quorum_share <= 1:
            raise ValueError(f"protocol parameter quorum_share must be in (0, 1], got {self.quorum_share}")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in self.forced_challenge_steps):
            raise ValueError("forced_challenge_steps must be steps >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quorum_share"] = [self.quorum_share.numerator, self.quorum_share.denominator]
        d["forced_challenge_steps"] = list(self.forced_challenge_steps)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProtocolParams:
        """Parameters from a mapping (a snapshot, or an operator's config file).

        Missing keys keep their defaults; unknown keys are refused. quorum_share may be
        [numerator, denominator], "2/3", or a number.
        """
        if not isinstance(d, dict):
            raise ValueError(f"protocol parameters must be a mapping, got {type(d).__name__}")
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(
                f"unknown protocol parameter(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
            )
        if "quorum_share" in d:
            q = d["quorum_share"]
            try:
                d["quorum_share"] = Fraction(*q) if isinstance(q, (list, tuple)) else Fraction(str(q))
            except (TypeError, ValueError, ZeroDivisionError):
                raise ValueError(f"quorum_share must be a fraction such as \"2/3\", got {q!r}") from None
        return cls(**d)


# --- refusals ---------------------------------------------------------------------------------


class Refused(Exception):
    """A call the protocol refuses. `events` are records the refusal itself leaves behind."""

    def __init__(self, reason: str, events: list[Event] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.events = events or []


class InvalidCall(Refused):
    """A call whose content the protocol cannot use (bad spec, steps that do not add up)."""


class RunExists(Refused):
    pass


class UnknownRun(Refused):
    pass


class NotRunOwner(Refused):
    pass


class BadRootSize(Refused):
    pass


class BadConsistencyProof(Refused):
    pass


class RootNotAppendOnly(Refused):
    pass


class UnknownChallenge(Refused):
    pass


class ChallengeClosed(Refused):
    pass


class OpeningTooLate(Refused):
    pass


class AlreadyOpened(Refused):
    pass


class BadLeafProof(Refused):
    pass


class BadLeaf(Refused):
    pass


class OwnChallenge(Refused):
    pass


class CommitWindowClosed(Refused):
    pass


class AlreadyCommitted(Refused):
    pass


class NoCommitment(Refused):
    pass


class RevealTooEarly(Refused):
    pass


class RevealTooLate(Refused):
    pass


class CommitmentMismatch(Refused):
    pass


class NotCrossArchitecture(Refused):
    pass


class DeclarationTooLate(Refused):
    pass


class AlreadyDeclared(Refused):
    pass


class UnknownCall(Refused):
    pass


# --- events -----------------------------------------------------------------------------------


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
    """A protocol event at a block. `to_dict()` is JSON-ready (bytes as hex)."""

    NAME: ClassVar[str] = "Event"
    block: int

    def to_dict(self) -> dict[str, Any]:
        d = {"event": self.NAME}
        d.update({f.name: _jsonable(getattr(self, f.name)) for f in fields(self)})
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunRegistered(Event):
    NAME: ClassVar[str] = "RunRegistered"
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


@dataclass(frozen=True)
class CheckpointRootUpdated(Event):
    NAME: ClassVar[str] = "CheckpointRootUpdated"
    run_id: bytes
    root: bytes
    size: int
    complete: bool
    challenges_at: int | None  # block at which challenges will be issued, once complete


@dataclass(frozen=True)
class ChallengeIssued(Event):
    NAME: ClassVar[str] = "ChallengeIssued"
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


@dataclass(frozen=True)
class OpeningSubmitted(Event):
    NAME: ClassVar[str] = "OpeningSubmitted"
    challenge_id: bytes
    run_id: bytes
    step: int
    opening_digest: bytes
    uri: str
    leaf: bytes
    leaf_hash: bytes  # H(leaf t): the value an honest exact-profile replay reveals


@dataclass(frozen=True)
class NormBucketDeclared(Event):
    NAME: ClassVar[str] = "NormBucketDeclared"
    challenge_id: bytes
    bucket: int


@dataclass(frozen=True)
class WitnessCommitted(Event):
    NAME: ClassVar[str] = "WitnessCommitted"
    challenge_id: bytes
    verifier: str
    commitment: bytes
    bonded: int  # stake bonded by this commit (verifier_stake on an account's first commit)


@dataclass(frozen=True)
class WitnessRevealed(Event):
    NAME: ClassVar[str] = "WitnessRevealed"
    challenge_id: bytes
    verifier: str
    value_hash: bytes
    norm_bucket: int


@dataclass(frozen=True)
class RevealRejected(Event):
    NAME: ClassVar[str] = "RevealRejected"
    challenge_id: bytes
    verifier: str
    reason: str


@dataclass(frozen=True)
class ChallengeResolved(Event):
    NAME: ClassVar[str] = "ChallengeResolved"
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


@dataclass(frozen=True)
class MinerSlashed(Event):
    NAME: ClassVar[str] = "MinerSlashed"
    run_id: bytes
    challenge_id: bytes
    miner: str
    amount: int
    reason: str


@dataclass(frozen=True)
class VerifierOutlier(Event):
    NAME: ClassVar[str] = "VerifierOutlier"
    challenge_id: bytes
    verifier: str
    value_hash: bytes
    norm_bucket: int


@dataclass(frozen=True)
class CallRefused(Event):
    NAME: ClassVar[str] = "CallRefused"
    origin: str
    call: str
    refusal: str
    reason: str


EVENT_TYPES: dict[str, type[Event]] = {
    c.NAME: c
    for c in (
        RunRegistered, CheckpointRootUpdated, ChallengeIssued, OpeningSubmitted, NormBucketDeclared,
        WitnessCommitted, WitnessRevealed, RevealRejected, ChallengeResolved, MinerSlashed,
        VerifierOutlier, CallRefused,
    )
}


# --- state ------------------------------------------------------------------------------------


@dataclass
class RunState:
    run_id: bytes
    miner: str
    registration: bytes  # the encoded registration fields: an identical repeat is a no-op
    spec_digest: bytes
    mode: str
    declared_steps: int
    endpoint: str
    stake: int
    slashed: int = 0
    root: bytes | None = None
    size: int = 0
    challenges_at: int | None = None
    challenges: list[bytes] = field(default_factory=list)


@dataclass
class ChallengeState:
    challenge_id: bytes
    run_id: bytes
    index: int
    step: int
    root: bytes
    size: int
    mode: str
    issued: int
    opening_deadline: int
    commit_deadline: int
    reveal_deadline: int
    opening: dict[str, Any] | None = None  # opening_digest, uri, leaf, leaf_hash, block
    declared_bucket: int | None = None
    commitments: dict[str, bytes] = field(default_factory=dict)
    reveals: dict[str, list[Any]] = field(default_factory=dict)  # verifier -> [value_hash, bucket]
    rejected: list[list[Any]] = field(default_factory=list)  # [block, verifier, reason]
    verdict: str | None = None


@dataclass
class ProtocolState:
    """Everything the protocol knows. Plain data: deep-copyable and CBOR-serialisable."""

    params: ProtocolParams = field(default_factory=ProtocolParams)
    head: int = -1  # the last block passed to on_block
    runs: dict[bytes, RunState] = field(default_factory=dict)
    challenges: dict[bytes, ChallengeState] = field(default_factory=dict)
    bonds: dict[str, int] = field(default_factory=dict)  # account -> stake bonded (before slashes)
    slashed: dict[str, int] = field(default_factory=dict)  # account -> total slashed
    verifiers: list[str] = field(default_factory=list)  # accounts bonded as verifiers

    # Snapshots let a ChainView restart from a cursor without replaying the chain.
    def to_cbor(self) -> bytes:
        return cbor.encode({
            "version": SNAPSHOT_VERSION,
            "params": self.params.to_dict(),
            "head": self.head,
            "runs": [_row(r) for r in self.runs.values()],
            "challenges": [_row(c) for c in self.challenges.values()],
            "bonds": dict(self.bonds),
            "slashed": dict(self.slashed),
            "verifiers": list(self.verifiers),
        })

    @classmethod
    def from_cbor(cls, data: bytes) -> ProtocolState:
        try:
            obj = cbor.decode(data)
            if not isinstance(obj, dict) or obj.get("version") != SNAPSHOT_VERSION:
                raise ValueError(f"not a {SNAPSHOT_VERSION} snapshot")
            runs = [RunState(**r) for r in obj["runs"]]
            challenges = [ChallengeState(**c) for c in obj["challenges"]]
            return cls(
                params=ProtocolParams.from_dict(obj["params"]),
                head=obj["head"],
                runs={r.run_id: r for r in runs},
                challenges={c.challenge_id: c for c in challenges},
                bonds=dict(obj["bonds"]),
                slashed=dict(obj["slashed"]),
                verifiers=list(obj["verifiers"]),
            )
        except (CommitmentError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"protocol state snapshot is unusable: {exc}") from None


class SnapshotError(ValueError):
    """A persisted protocol state that cannot be restored, with the reason."""


def _row(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


# --- transitions ------------------------------------------------------------------------------


def _number(block: Any) -> int:
    return block if isinstance(block, int) else block.number


def apply(state: ProtocolState, call: Call, origin: str, block: Any) -> list[Event]:
    """Apply one call by `origin` included in `block` (a Block or its number).

    Every check runs before any change, so a refused call leaves the state untouched — except
    `CommitmentMismatch`, whose rejection is recorded in the challenge (the refusal carries the
    `RevealRejected` event).
    """
    n = _number(block)
    handler = _HANDLERS.get(type(call))
    if handler is None:
        raise UnknownCall(f"{type(call).__name__} is not a protocol call")
    return handler(state, call, origin, n)


def apply_recorded(state: ProtocolState, call: Call, origin: str, block: Any) -> list[Event]:
    """`apply`, with a refusal turned into events (what a chain follower records; never raises)."""
    try:
        return apply(state, call, origin, block)
    except Refused as exc:
        name = getattr(call, "NAME", type(call).__name__)
        return [*exc.events, CallRefused(_number(block), origin, name, type(exc).__name__, exc.reason)]


def _start(state: ProtocolState, c: StartTrainingCommitment, origin: str, n: int) -> list[Event]:
    registration = cbor.encode(c.to_wire())
    existing = state.runs.get(c.run_id)
    if existing is not None:
        if existing.miner == origin and existing.registration == registration:
            return []
        how = f"by {existing.miner!r}" if existing.miner != origin else "with different commitments"
        raise RunExists(f"run {c.run_id.hex()[:16]} is already registered {how}")
    try:
        spec = Spec.from_cbor(c.spec)
    except CommitmentError as exc:
        raise InvalidCall(f"run {c.run_id.hex()[:16]}: the spec is not usable: {exc}") from None
    if c.spec != spec.to_cbor():
        raise InvalidCall("the spec must be given in its canonical CBOR form (Spec.to_cbor())")
    if c.declared_steps != spec.steps:
        raise InvalidCall(f"declared_steps ({c.declared_steps}) differs from the spec's steps ({spec.steps})")
    mode = "value" if spec.profile == "exact-v1" else "bucket"
    stake = state.params.miner_stake
    state.runs[c.run_id] = RunState(
        run_id=c.run_id, miner=origin, registration=registration, spec_digest=spec.digest(), mode=mode,
        declared_steps=c.declared_steps, endpoint=c.endpoint, stake=stake,
    )
    state.bonds[origin] = state.bonds.get(origin, 0) + stake
    return [RunRegistered(n, c.run_id, origin, spec.digest(), mode, c.declared_steps, c.endpoint,
                          c.initial_hash, c.schedule_commitment, c.dataset_hash, stake)]


def _run_of(state: ProtocolState, run_id: bytes, origin: str) -> RunState:
    run = state.runs.get(run_id)
    if run is None:
        raise UnknownRun(f"no run {run_id.hex()[:16]} is registered")
    if run.miner != origin:
        raise NotRunOwner(f"run {run_id.hex()[:16]} belongs to {run.miner!r}, not {origin!r}")
    return run


def _root(state: ProtocolState, c: SubmitCheckpointRoot, origin: str, n: int) -> list[Event]:
    run = _run_of(state, c.run_id, origin)
    full = run.declared_steps + 1  # leaves 0..T
    if not 1 <= c.size <= full:
        raise BadRootSize(f"root size {c.size} is outside 1..{full} (leaves 0..{run.declared_steps})")
    if run.root is None:
        if c.consistency_proof:
            raise BadConsistencyProof("the first root of a run extends the empty tree: its proof must be empty")
    elif c.size < run.size:
        raise RootNotAppendOnly(f"root size {c.size} is smaller than the current size {run.size}")
    elif c.size == run.size:
        if c.root == run.root:
            return []
        raise RootNotAppendOnly(f"a different root for the same size {c.size} rewrites the history")
    elif not verify_consistency(run.size, c.size, run.root, c.root, list(c.consistency_proof)):
        raise BadConsistencyProof(
            f"the proof does not show the tree of size {run.size} is a prefix of the new tree of size {c.size}"
        )
    run.root, run.size = c.root, c.size
    complete = c.size == full
    if complete:
        run.challenges_at = n + state.params.challenge_delay
    return [CheckpointRootUpdated(n, c.run_id, c.root, c.size, complete, run.challenges_at)]


def _challenge(state: ProtocolState, challenge_id: bytes) -> ChallengeState:
    ch = state.challenges.get(challenge_id)
    if ch is None:
        raise UnknownChallenge(f"no challenge {challenge_id.hex()[:16]}")
    return ch


def _open_challenge(state: ProtocolState, challenge_id: bytes) -> ChallengeState:
    ch = _challenge(state, challenge_id)
    if ch.verdict is not None:
        raise ChallengeClosed(f"challenge {challenge_id.hex()[:16]} is already resolved ({ch.verdict})")
    return ch


def _opening(state: ProtocolState, c: SubmitOpening, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    run = _run_of(state, ch.run_id, origin)
    if n > ch.opening_deadline:
        raise OpeningTooLate(f"the opening was due by block {ch.opening_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    fields_ = {"opening_digest": c.opening_digest, "uri": c.uri, "leaf": c.leaf}
    if ch.opening is not None:
        if all(ch.opening[k] == v for k, v in fields_.items()):
            return []
        raise AlreadyOpened(f"challenge {c.challenge_id.hex()[:16]} already has an opening")
    if not verify_inclusion(c.leaf, ch.step, ch.size, list(c.leaf_proof), ch.root):
        raise BadLeafProof(f"the leaf proof does not show the leaf at index {ch.step} of the challenged root")
    try:
        leaf = parse_step_leaf(c.leaf)
    except CommitmentError as exc:
        raise BadLeaf(f"leaf {ch.step} is not a step leaf: {exc}") from None
    if leaf.t != ch.step:
        raise BadLeaf(f"the leaf says step {leaf.t}, the challenge is step {ch.step}")
    leaf_hash = witness_value_hash(c.leaf)
    ch.opening = {**fields_, "leaf_hash": leaf_hash, "block": n}
    return [OpeningSubmitted(n, ch.challenge_id, run.run_id, ch.step, c.opening_digest, c.uri, c.leaf, leaf_hash)]


def _declare(state: ProtocolState, c: DeclareWitnessNormBucket, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    _run_of(state, ch.run_id, origin)
    if ch.mode != "bucket":
        raise NotCrossArchitecture("the run's spec is exact: its verdict compares value hashes, not norm buckets")
    if n > ch.commit_deadline:
        raise DeclarationTooLate(f"the norm bucket was due by block {ch.commit_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    if ch.declared_bucket is not None:
        if ch.declared_bucket == c.bucket:
            return []
        raise AlreadyDeclared(f"bucket {ch.declared_bucket} is already declared for this challenge")
    ch.declared_bucket = c.bucket
    return [NormBucketDeclared(n, c.challenge_id, c.bucket)]


def _commit(state: ProtocolState, c: CommitWitness, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    if state.runs[ch.run_id].miner == origin:
        raise OwnChallenge("the run's miner cannot witness its own challenge")
    if n > ch.commit_deadline:
        raise CommitWindowClosed(f"the commit window closed at block {ch.commit_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    prior = ch.commitments.get(origin)
    if prior is not None:
        if prior == c.commitment:
            return []
        raise AlreadyCommitted(f"{origin!r} has already committed to this challenge")
    bonded = 0
    if origin not in state.verifiers:
        bonded = state.params.verifier_stake
        state.verifiers.append(origin)
        state.bonds[origin] = state.bonds.get(origin, 0) + bonded
    ch.commitments[origin] = c.commitment
    return [WitnessCommitted(n, c.challenge_id, origin, c.commitment, bonded)]


def _reveal(state: ProtocolState, c: RevealWitnessValue, origin: str, n: int) -> list[Event]:
    ch = _challenge(state, c.challenge_id)
    commitment = ch.commitments.get(origin)
    if commitment is None:
        raise NoCommitment(f"{origin!r} has no commitment to reveal for this challenge")
    if n <= ch.commit_deadline:
        raise RevealTooEarly(f"reveals open after the commit window closes at block {ch.commit_deadline}")
    if n > ch.reveal_deadline:
        raise RevealTooLate(f"the reveal window closed at block {ch.reveal_deadline}; this is block {n}")
    _open_challenge(state, c.challenge_id)
    if not verify_witness(commitment, c.challenge_id, c.value_hash, c.norm_bucket, c.salt, origin):
        reason = "the revealed value, bucket and salt do not open the commitment"
        ch.rejected.append([n, origin, reason])
        raise CommitmentMismatch(reason, [RevealRejected(n, c.challenge_id, origin, reason)])
    if origin in ch.reveals:
        return []
    ch.reveals[origin] = [c.value_hash, c.norm_bucket]
    return [WitnessRevealed(n, c.challenge_id, origin, c.value_hash, c.norm_bucket)]


_HANDLERS = {
    StartTrainingCommitment: _start,
    SubmitCheckpointRoot: _root,
    SubmitOpening: _opening,
    DeclareWitnessNormBucket: _declare,
    CommitWitness: _commit,
    RevealWitnessValue: _reveal,
}


def on_block(state: ProtocolState, block: Any) -> list[Event]:
    """Protocol work due at a new finalized block, before its calls: issue, then resolve."""
    n, block_hash = block.number, block.hash
    if n <= state.head:
        raise ValueError(f"block {n} is not after the last processed block {state.head}")
    state.head = n
    events: list[Event] = []
    for run in sorted(state.runs.values(), key=lambda r: r.run_id):
        if run.challenges_at is not None and run.challenges_at <= n and not run.challenges:
            events += _issue(state, run, n, block_hash)
    due = [
        ch for ch in state.challenges.values()
        if ch.verdict is None and (n > ch.reveal_deadline or (ch.opening is None and n > ch.opening_deadline))
    ]
    for ch in sorted(due, key=lambda c: (c.issued, c.run_id, c.index)):
        events += _resolve(state, ch, n)
    return events


def _issue(state: ProtocolState, run: RunState, n: int, block_hash: bytes) -> list[Event]:
    p = state.params
    assert run.root is not None
    steps = challenge_steps(block_hash, run.run_id, run.root, run.size, p.challenges_per_run,
                            p.forced_challenge_steps)
    events: list[Event] = []
    for index, step in enumerate(steps):
        cid = derive_challenge_id(run.run_id, run.root, run.size, index, block_hash)
        opening_deadline = n + p.opening_deadline
        commit_deadline = opening_deadline + p.commit_window
        ch = ChallengeState(
            challenge_id=cid, run_id=run.run_id, index=index, step=step, root=run.root, size=run.size,
            mode=run.mode, issued=n, opening_deadline=opening_deadline, commit_deadline=commit_deadline,
            reveal_deadline=commit_deadline + p.reveal_window,
        )
        state.challenges[cid] = ch
        run.challenges.append(cid)
        events.append(ChallengeIssued(n, cid, run.run_id, index, step, run.root, run.size, run.mode,
                                      run.endpoint, ch.opening_deadline, ch.commit_deadline, ch.reveal_deadline))
    return events


def _resolve(state: ProtocolState, ch: ChallengeState, n: int) -> list[Event]:
    p = state.params
    run = state.runs[ch.run_id]
    result = decide(
        [Reveal(v, r[0], r[1]) for v, r in ch.reveals.items()],
        mode=ch.mode,  # type: ignore[arg-type]
        opening_submitted=ch.opening is not None,
        expected_value=ch.opening["leaf_hash"] if ch.opening else None,
        declared_bucket=ch.declared_bucket,
        quorum_min_reveals=p.quorum_min_reveals,
        quorum_share=p.quorum_share,
    )
    ch.verdict = result.verdict
    events: list[Event] = [ChallengeResolved(
        n, ch.challenge_id, ch.run_id, ch.step, result.verdict, result.reason, result.mode,
        result.winning_value, result.cluster_size, result.reveals, result.clusters, result.outliers,
    )]
    if result.verdict == FRAUD:
        amount = min(p.slash_amount, run.stake - run.slashed)
        run.slashed += amount
        state.slashed[run.miner] = state.slashed.get(run.miner, 0) + amount
        events.append(MinerSlashed(n, run.run_id, ch.challenge_id, run.miner, amount, result.reason))
    for v in result.outliers:
        value_hash, bucket = ch.reveals[v]
        events.append(VerifierOutlier(n, ch.challenge_id, v, value_hash, bucket))
    return events


def new_state(params: ProtocolParams | None = None) -> ProtocolState:
    return ProtocolState(params=params or ProtocolParams())


__all__ = [
    "ProtocolParams", "ProtocolState", "RunState", "ChallengeState", "Event", "EVENT_TYPES", "Refused",
    "apply", "apply_recorded", "on_block", "new_state", "SnapshotError",
]
