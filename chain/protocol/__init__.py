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

from chain.protocol.events import (
    EVENT_TYPES,
    BondReleased,
    CallRefused,
    ChallengeIssued,
    ChallengeResolved,
    CheckpointRootUpdated,
    Event,
    MinerSlashed,
    NetworkConfigured,
    NormBucketDeclared,
    OpeningSubmitted,
    ParamsEffective,
    RemarkIgnored,
    RevealRejected,
    RunRegistered,
    VerifierBonded,
    VerifierOutlier,
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
    BadConsistencyProof,
    BadLeaf,
    BadLeafProof,
    BadRootSize,
    ChallengeClosed,
    CommitmentMismatch,
    CommitWindowClosed,
    DeclarationTooLate,
    FieldTooLarge,
    InvalidCall,
    NoCommitment,
    NotAuthority,
    NotBonded,
    NotInCommittee,
    NotCrossArchitecture,
    NotRunOwner,
    OpeningTooLate,
    OwnChallenge,
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
from chain.protocol.rules import activate_due, apply, apply_recorded, on_block
from chain.protocol.state import (
    SNAPSHOT_VERSION,
    ChallengeState,
    ProtocolState,
    RunState,
    SnapshotError,
    new_state,
)

__all__ = [
    "EVENT_TYPES", "REFUSAL_TYPES", "SNAPSHOT_VERSION",
    # parameters, state, rules
    "ProtocolParams", "ProtocolState", "RunState", "ChallengeState", "SnapshotError",
    "activate_due", "apply", "apply_recorded", "on_block", "new_state", "refusal_type",
    # events
    "Event", "RunRegistered", "CheckpointRootUpdated", "ChallengeIssued", "OpeningSubmitted",
    "NormBucketDeclared", "WitnessCommitted", "WitnessRevealed", "RevealRejected", "ChallengeResolved",
    "MinerSlashed", "VerifierOutlier", "CallRefused", "RemarkIgnored", "NetworkConfigured", "ParamsEffective",
    "VerifierBonded", "VerifierUnbonding", "BondReleased", "VerifierPenalized",
    # refusals
    "Refused", "InvalidCall", "RunExists", "UnknownRun", "NotRunOwner", "BadRootSize", "BadConsistencyProof",
    "RootNotAppendOnly", "UnknownChallenge", "ChallengeClosed", "OpeningTooLate", "AlreadyOpened",
    "BadLeafProof", "BadLeaf", "OwnChallenge", "CommitWindowClosed", "AlreadyCommitted", "NoCommitment",
    "RevealTooEarly", "RevealTooLate", "CommitmentMismatch", "NotCrossArchitecture", "DeclarationTooLate",
    "AlreadyDeclared", "UnknownCall", "FieldTooLarge", "TooMany", "NotAuthority", "RetroactiveChange",
    "ProtocolError", "RunIdNotOwned", "ReplayTooSlow", "NotInCommittee", "NotBonded",
]
