"""The protocol as one deterministic state machine, the same code behind every transport.

Its parts, one module each: `params` (the constants), `events` and `refusals` (each with a stable
`code`), `state` (plain data and its snapshot form) and `rules` (the transitions). This package
re-exports their public names, so `from chain import protocol as P; P.RunRegistered` works.

`on_block(state, block)` runs first for each finalized block (issue due challenges from that
block's hash, resolve challenges whose windows have closed), then `apply(state, call, origin,
block)` runs for each call of the block in chain order. Refusals raise `Refused` subclasses with a
reason and leave the state as it was; `apply_recorded` turns them into `CallRefused` events.

Timeline of a run (all counts in blocks, constants in `ProtocolParams`):
  * the miner registers the run (bonding `miner_stake`) and moves its checkpoint root forward;
  * once a root covers every declared step (size = declared_steps + 1) at block B, challenge i
    (0 <= i < challenges_per_run) is issued at block I = B + challenge_delay + i from block I's
    hash, so each challenged step derives from a block that did not exist when the root was
    submitted, and each from a different block;
  * each challenge draws its committee, stake-weighted, from the accounts whose active verifier
    bond is at least verifier_stake (the run's miner never sits); only its members commit;
  * the opening is due by I + opening_deadline (none by then: fraud);
  * committee members commit until commit_deadline = opening deadline + max(commit_window, the
    run's replay_blocks), then reveal until reveal_deadline = commit_deadline + reveal_window; the
    round resolves at the next block, and an inconclusive or refused round re-challenges the step
    under a new id with a larger committee and longer windows, up to the dispute round.
Verifiers bond with `bond_verifier` before a challenge is issued to be drawn onto its committee;
`unbond_verifier` releases an amount after unbonding_delay, still answerable for its seats.
"""

from __future__ import annotations

from chain.protocol.events import (
    EVENT_TYPES,
    BondReleased,
    Burned,
    CallRefused,
    ChallengeEscalated,
    ChallengeIssued,
    ChallengeResolved,
    CheckpointRootUpdated,
    EscalationSettled,
    Event,
    MinerSlashed,
    NetworkConfigured,
    NormBucketDeclared,
    OpeningSubmitted,
    ParamsEffective,
    RemarkIgnored,
    RevealRejected,
    RunRegistered,
    RunSettled,
    VerifierBonded,
    VerifierOutlier,
    VerifierPaid,
    VerifierPenalized,
    VerifierUnbonding,
    WitnessCommitted,
    WitnessRevealed,
)
from chain.protocol.params import ProtocolParams
from chain.protocol.refusals import (
    REFUSAL_TYPES,
    AlreadyCommitted,
    AlreadyDeclared,
    AlreadyOpened,
    AmountOverBond,
    BadConsistencyProof,
    BadLeaf,
    BadLeafProof,
    BadRootSize,
    BondBelowMinimum,
    BondReserved,
    ChallengeClosed,
    CheckpointIntervalTooLong,
    CommitmentMismatch,
    CommitWindowClosed,
    DeclarationTooLate,
    EscrowTooLarge,
    FieldTooLarge,
    InsufficientFreeBond,
    InvalidCall,
    NoCommitment,
    NoOpening,
    NotAuthority,
    NotBonded,
    NotCrossArchitecture,
    NotEscalable,
    NotInCommittee,
    NotRunOwner,
    OpeningTooLate,
    OwnChallenge,
    ParamOutOfRange,
    ProtocolError,
    Refused,
    ReplayTooSlow,
    RetroactiveChange,
    RevealTooEarly,
    RevealTooLate,
    RootNotAppendOnly,
    RunExists,
    RunIdNotOwned,
    TooMany,
    UnknownCall,
    UnknownChallenge,
    UnknownRun,
    refusal_type,
)
from chain.protocol.rules import activate_due, apply, apply_recorded, on_block, round_result
from chain.protocol.state import (
    SNAPSHOT_VERSION,
    ChallengeState,
    ProtocolState,
    RunState,
    SnapshotError,
    eligible_verifiers,
    escalation_room,
    free_bond,
    new_state,
)

__all__ = [
    "EVENT_TYPES",
    "REFUSAL_TYPES",
    "SNAPSHOT_VERSION",
    # parameters, state, rules
    "ProtocolParams",
    "ProtocolState",
    "RunState",
    "ChallengeState",
    "SnapshotError",
    "activate_due",
    "apply",
    "apply_recorded",
    "on_block",
    "new_state",
    "refusal_type",
    "eligible_verifiers",
    # events
    "Event",
    "RunRegistered",
    "CheckpointRootUpdated",
    "ChallengeIssued",
    "OpeningSubmitted",
    "NormBucketDeclared",
    "WitnessCommitted",
    "WitnessRevealed",
    "RevealRejected",
    "ChallengeResolved",
    "MinerSlashed",
    "VerifierOutlier",
    "CallRefused",
    "RemarkIgnored",
    "NetworkConfigured",
    "ParamsEffective",
    "VerifierBonded",
    "VerifierUnbonding",
    "BondReleased",
    "VerifierPenalized",
    # refusals
    "Refused",
    "InvalidCall",
    "RunExists",
    "UnknownRun",
    "NotRunOwner",
    "BadRootSize",
    "BadConsistencyProof",
    "RootNotAppendOnly",
    "UnknownChallenge",
    "ChallengeClosed",
    "OpeningTooLate",
    "AlreadyOpened",
    "BadLeafProof",
    "BadLeaf",
    "OwnChallenge",
    "CommitWindowClosed",
    "AlreadyCommitted",
    "NoCommitment",
    "RevealTooEarly",
    "RevealTooLate",
    "CommitmentMismatch",
    "NotCrossArchitecture",
    "DeclarationTooLate",
    "AlreadyDeclared",
    "UnknownCall",
    "FieldTooLarge",
    "TooMany",
    "NotAuthority",
    "RetroactiveChange",
    "ProtocolError",
    "RunIdNotOwned",
    "ReplayTooSlow",
    "NotInCommittee",
    "NotBonded",
    "AmountOverBond",
    "ParamOutOfRange",
    "NoOpening",
    "BondBelowMinimum",
    "BondReserved",
    "CheckpointIntervalTooLong",
    "EscrowTooLarge",
    "NotEscalable",
    "InsufficientFreeBond",
    "ChallengeEscalated",
    "VerifierPaid",
    "EscalationSettled",
    "Burned",
    "RunSettled",
    "round_result",
    "free_bond",
    "escalation_room",
]
