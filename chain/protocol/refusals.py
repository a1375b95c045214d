"""Refusals: the ways the protocol says no to a call. Each carries a stable `code`, the value a
`CallRefused` event records and a node stores; codes never follow class names, so renaming a class
changes no record. The table is pinned by tests/chain/test_protocol_codes.py and in docs/protocol.md."""

from __future__ import annotations

from typing import Any, ClassVar

from chain.protocol.events import Event


class Refused(Exception):
    """A call the protocol refuses. `events` are records the refusal itself leaves behind.

    Every subclass declares its own `code`; the base's code names a refusal of no finer kind.
    """

    code: ClassVar[str] = "Refused"

    def __init__(self, reason: str, events: list[Event] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.events = events or []

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "code" not in cls.__dict__:
            raise TypeError(f"refusal {cls.__qualname__} must declare its own stable `code`")


class InvalidCall(Refused):
    """A call whose content the protocol cannot use (bad spec, steps that do not add up)."""

    code = "InvalidCall"


class RunExists(Refused):
    """The run id is registered already, by another account or with other commitments."""

    code = "RunExists"


class UnknownRun(Refused):
    """No run has this id."""

    code = "UnknownRun"


class NotRunOwner(Refused):
    """The call concerns a run that another account registered."""

    code = "NotRunOwner"


class BadRootSize(Refused):
    """A checkpoint root whose size is outside 1..declared_steps + 1."""

    code = "BadRootSize"


class BadConsistencyProof(Refused):
    """The proof does not show the old tree is a prefix of the new one."""

    code = "BadConsistencyProof"


class RootNotAppendOnly(Refused):
    """A root that shrinks the tree or rewrites it at the same size."""

    code = "RootNotAppendOnly"


class UnknownChallenge(Refused):
    """No challenge has this id."""

    code = "UnknownChallenge"


class ChallengeClosed(Refused):
    """The challenge is resolved already."""

    code = "ChallengeClosed"


class OpeningTooLate(Refused):
    """The opening arrived after its deadline."""

    code = "OpeningTooLate"


class AlreadyOpened(Refused):
    """The challenge has a different opening already."""

    code = "AlreadyOpened"


class BadLeafProof(Refused):
    """The leaf proof does not place the leaf at the challenged index of the root."""

    code = "BadLeafProof"


class BadLeaf(Refused):
    """The opened leaf is not a step leaf of the challenged step."""

    code = "BadLeaf"


class OwnChallenge(Refused):
    """The run's miner tried to witness its own challenge."""

    code = "OwnChallenge"


class CommitWindowClosed(Refused):
    """A witness commitment after the commit window."""

    code = "CommitWindowClosed"


class AlreadyCommitted(Refused):
    """The verifier committed a different commitment already."""

    code = "AlreadyCommitted"


class NoCommitment(Refused):
    """A reveal from an account that never committed."""

    code = "NoCommitment"


class RevealTooEarly(Refused):
    """A reveal while the commit window is still open."""

    code = "RevealTooEarly"


class RevealTooLate(Refused):
    """A reveal after the reveal window."""

    code = "RevealTooLate"


class CommitmentMismatch(Refused):
    """The revealed value, bucket and salt do not open the commitment (recorded as RevealRejected)."""

    code = "CommitmentMismatch"


class NotCrossArchitecture(Refused):
    """A norm-bucket declaration for an exact-profile run."""

    code = "NotCrossArchitecture"


class DeclarationTooLate(Refused):
    """A norm-bucket declaration after the commit deadline."""

    code = "DeclarationTooLate"


class AlreadyDeclared(Refused):
    """A different norm bucket is declared already."""

    code = "AlreadyDeclared"


class UnknownCall(Refused):
    """Not a protocol call."""

    code = "UnknownCall"


class FieldTooLarge(Refused):
    """A field over the size the protocol state keeps (spec bytes, endpoint, URI, leaf, steps)."""

    code = "FieldTooLarge"


class TooMany(Refused):
    """A list or count the protocol state keeps is full (runs per miner, witnesses per challenge)."""

    code = "TooMany"


class NotAuthority(Refused):
    """A configure_network record from an account other than the network's authority."""

    code = "NotAuthority"


class RetroactiveChange(Refused):
    """A configure_network record whose effective block is not after the block that carries it."""

    code = "RetroactiveChange"


class ParamOutOfRange(Refused):
    """A configure_network record with a parameter, or an effective block, outside its range."""

    code = "ParamOutOfRange"


class RunIdNotOwned(Refused):
    """The run id is not derive_run_id(sender, nonce): a registration copied by another account."""

    code = "RunIdNotOwned"


class ReplayTooSlow(Refused):
    """The spec's replay could not fit in max_replay_blocks at the reference speed."""

    code = "ReplayTooSlow"


class NotInCommittee(Refused):
    """A witness commitment from an account the challenge's committee does not hold."""

    code = "NotInCommittee"


class NotBonded(Refused):
    """An unbond by an account that has no active bond."""

    code = "NotBonded"


class AmountOverBond(Refused):
    """An unbond of more than the account's active bond (which is not zero)."""

    code = "AmountOverBond"


class NoOpening(Refused):
    """A witness commitment before the challenge's opening is on chain: there is nothing to replay."""

    code = "NoOpening"


class BondBelowMinimum(Refused):
    """A bond or unbond that would leave an active bond above zero but below verifier_stake."""

    code = "BondBelowMinimum"


class BondReserved(Refused):
    """An unbond of more than the free bond: the rest is reserved by seats of open rounds."""

    code = "BondReserved"


class CheckpointIntervalTooLong(Refused):
    """A registration whose checkpoint interval makes the opening window longer than the protocol allows."""

    code = "CheckpointIntervalTooLong"


class EscrowTooLarge(Refused):
    """A registration whose verification escrow exceeds the protocol's cap on one amount."""

    code = "EscrowTooLarge"


class NotEscalable(Refused):
    """An escalation outside its window, of a dispute round, of a round with no winning cluster, or
    by an account that did not reveal a dissenting value."""

    code = "NotEscalable"


class InsufficientFreeBond(Refused):
    """An escalation whose stake exceeds the account's free bond."""

    code = "InsufficientFreeBond"


class ProtocolError(Refused):
    """Never raised by the rules: a follower records it when applying a call crashed inside the
    protocol (a bug), so one bad call cannot stop the node at that block."""

    code = "ProtocolError"


REFUSAL_TYPES: dict[str, type[Refused]] = {
    c.code: c
    for c in (
        Refused, InvalidCall, RunExists, UnknownRun, NotRunOwner, BadRootSize, BadConsistencyProof,
        RootNotAppendOnly, UnknownChallenge, ChallengeClosed, OpeningTooLate, AlreadyOpened, BadLeafProof,
        BadLeaf, OwnChallenge, CommitWindowClosed, AlreadyCommitted, NoCommitment, RevealTooEarly,
        RevealTooLate, CommitmentMismatch, NotCrossArchitecture, DeclarationTooLate, AlreadyDeclared,
        UnknownCall, FieldTooLarge, TooMany, NotAuthority, RetroactiveChange, ProtocolError,
        RunIdNotOwned, ReplayTooSlow, NotInCommittee, NotBonded, AmountOverBond, ParamOutOfRange,
        NoOpening, BondBelowMinimum, BondReserved, CheckpointIntervalTooLong, EscrowTooLarge, NotEscalable,
        InsufficientFreeBond,
    )
}


def refusal_type(code: str) -> type[Refused]:
    """The refusal class a stored or emitted code names (old records included: codes never change)."""
    try:
        return REFUSAL_TYPES[code]
    except KeyError:
        raise ValueError(
            f"unknown refusal code {code!r}; known: {', '.join(sorted(REFUSAL_TYPES))}"
        ) from None
