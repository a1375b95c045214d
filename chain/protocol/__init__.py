"""The protocol as one deterministic state machine, the same code behind every transport.

Its parts, one module each: `params` (the constants), `events` and `refusals` (each with a stable
`code`), `state` (plain data and its snapshot form) and `rules` (the transitions). This package
re-exports their public names, so `from chain import protocol as P; P.RunRegistered` works.

`on_block(state, block)` runs first for each finalized block (issue due challenges from that
block's hash, resolve challenges whose windows have closed), then `apply(state, call, origin,
block)` runs for each call of the block in chain order. Refusals raise `Refused` subclasses with a
reason and leave the state as it was; `apply_recorded` turns them into `CallRefused` events.

Timeline of a run (all counts in blocks, constants in `ProtocolParams`; docs/protocol.md is the
normative text):
  * verifiers bond (`bond_verifier`); an active bond of at least `verifier_stake` makes an account
    eligible for committees, drawn stake-weighted per challenge round;
  * the miner registers the run (its run id derived from its account and a nonce, bonding
    `miner_stake`; a spec whose replay cannot fit `max_replay_blocks` is refused) and moves its
    checkpoint root forward;
  * once a root covers every declared step at block B, challenge i is issued at block
    B + challenge_delay + i from that block's hash, with its committee;
  * the opening is due by the round's opening deadline (none by then: fraud); committee members
    commit to the witness pair (H(recomputed leaf t), the keyed proof of the post-state), then
    reveal; the round resolves at the block after its reveal deadline: honest, fraud, or a new
    round (no quorum, or a refused opening's second window) with a larger committee, up to the
    dispute round where every eligible verifier sits. No-shows and outliers pay from their bond.
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
