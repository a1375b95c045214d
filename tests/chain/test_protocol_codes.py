"""The stable codes of refusals and events: explicit on every class, unique, and pinned, so that a
class rename can never change what a CallRefused event records or what a node stores."""

from __future__ import annotations

import dataclasses

import pytest

from chain import protocol as P
from chain.calls import SubmitCheckpointRoot
from chain.protocol import events as E
from chain.protocol import refusals as R

# The full table. A change here changes stored records and emitted events: never edit a code,
# only add new ones.
REFUSAL_CODES = {
    "Refused": "Refused",
    "InvalidCall": "InvalidCall",
    "RunExists": "RunExists",
    "UnknownRun": "UnknownRun",
    "NotRunOwner": "NotRunOwner",
    "BadRootSize": "BadRootSize",
    "BadConsistencyProof": "BadConsistencyProof",
    "RootNotAppendOnly": "RootNotAppendOnly",
    "UnknownChallenge": "UnknownChallenge",
    "ChallengeClosed": "ChallengeClosed",
    "OpeningTooLate": "OpeningTooLate",
    "AlreadyOpened": "AlreadyOpened",
    "BadLeafProof": "BadLeafProof",
    "BadLeaf": "BadLeaf",
    "OwnChallenge": "OwnChallenge",
    "CommitWindowClosed": "CommitWindowClosed",
    "AlreadyCommitted": "AlreadyCommitted",
    "NoCommitment": "NoCommitment",
    "RevealTooEarly": "RevealTooEarly",
    "RevealTooLate": "RevealTooLate",
    "CommitmentMismatch": "CommitmentMismatch",
    "NotCrossArchitecture": "NotCrossArchitecture",
    "DeclarationTooLate": "DeclarationTooLate",
    "AlreadyDeclared": "AlreadyDeclared",
    "UnknownCall": "UnknownCall",
    "FieldTooLarge": "FieldTooLarge",
    "TooMany": "TooMany",
    "NotAuthority": "NotAuthority",
    "RetroactiveChange": "RetroactiveChange",
    "ProtocolError": "ProtocolError",
    # protocol v2
    "RunIdNotOwned": "RunIdNotOwned",
    "ReplayTooSlow": "ReplayTooSlow",
    "NotInCommittee": "NotInCommittee",
    "NotBonded": "NotBonded",
    "AmountOverBond": "AmountOverBond",
    "ParamOutOfRange": "ParamOutOfRange",
    # protocol v3
    "NoOpening": "NoOpening",
    "BondBelowMinimum": "BondBelowMinimum",
    "BondReserved": "BondReserved",
    "CheckpointIntervalTooLong": "CheckpointIntervalTooLong",
    "EscrowTooLarge": "EscrowTooLarge",
    "NotEscalable": "NotEscalable",
    "InsufficientFreeBond": "InsufficientFreeBond",
}
EVENT_CODES = {
    "RunRegistered": "RunRegistered",
    "CheckpointRootUpdated": "CheckpointRootUpdated",
    "ChallengeIssued": "ChallengeIssued",
    "OpeningSubmitted": "OpeningSubmitted",
    "NormBucketDeclared": "NormBucketDeclared",
    "WitnessCommitted": "WitnessCommitted",
    "WitnessRevealed": "WitnessRevealed",
    "RevealRejected": "RevealRejected",
    "ChallengeResolved": "ChallengeResolved",
    "MinerSlashed": "MinerSlashed",
    "VerifierOutlier": "VerifierOutlier",
    "CallRefused": "CallRefused",
    "RemarkIgnored": "RemarkIgnored",
    "NetworkConfigured": "NetworkConfigured",
    "ParamsEffective": "ParamsEffective",
    # protocol v2
    "VerifierBonded": "VerifierBonded",
    "VerifierUnbonding": "VerifierUnbonding",
    "BondReleased": "BondReleased",
    "VerifierPenalized": "VerifierPenalized",
    "BlockWorkFailed": "BlockWorkFailed",
    # protocol v3
    "ChallengeEscalated": "ChallengeEscalated",
    "VerifierPaid": "VerifierPaid",
    "EscalationSettled": "EscalationSettled",
    "Burned": "Burned",
    "RunSettled": "RunSettled",
}


def _classes(module, base):
    return {n: c for n, c in vars(module).items()
            if isinstance(c, type) and issubclass(c, base) and c.__module__ == module.__name__}


def test_refusal_code_table_is_pinned_and_complete():
    classes = _classes(R, P.Refused)
    assert {n: c.code for n, c in classes.items()} == REFUSAL_CODES
    assert {c.code: c for c in classes.values()} == P.REFUSAL_TYPES
    for c in classes.values():
        assert isinstance(c.__dict__["code"], str) and c.__dict__["code"]  # declared, not inherited


def test_event_code_table_is_pinned_and_complete():
    classes = {n: c for n, c in _classes(E, P.Event).items() if c is not P.Event}
    assert {n: c.code for n, c in classes.items()} == EVENT_CODES
    assert {c.code: c for c in classes.values()} == P.EVENT_TYPES
    for c in classes.values():
        assert isinstance(c.__dict__["code"], str) and c.NAME == c.code


def test_codes_are_unique():
    assert len(set(REFUSAL_CODES.values())) == len(REFUSAL_CODES)
    assert len(set(EVENT_CODES.values())) == len(EVENT_CODES)


def test_a_renamed_class_keeps_its_code():
    renamed_refusal = type("LateOpening", (P.OpeningTooLate,), {"code": P.OpeningTooLate.code})
    assert renamed_refusal.__name__ != renamed_refusal.code == "OpeningTooLate"
    exc = renamed_refusal("too late")
    ev = P.CallRefused(3, "alice", "submit_opening", exc.code, exc.reason)
    assert ev.to_dict()["refusal"] == "OpeningTooLate"

    renamed_event = dataclasses.make_dataclass(
        "RunSignedUp", [], bases=(P.RunRegistered,), frozen=True, namespace={"code": P.RunRegistered.code})
    ev2 = renamed_event(1, b"r", "m", b"s", "value", 1, "e", b"i", b"c", b"d", 0)
    assert ev2.to_dict()["event"] == "RunRegistered" and ev2.NAME == "RunRegistered"


def test_a_class_without_its_own_code_is_refused():
    with pytest.raises(TypeError, match="must declare its own stable `code`"):
        type("Unnamed", (P.BadLeaf,), {})
    with pytest.raises(TypeError, match="must declare its own stable `code`"):
        dataclasses.make_dataclass("Nameless", [], bases=(P.Event,), frozen=True)


def test_apply_recorded_emits_the_code_not_the_class_name():
    # Rename the class the rules raise: the recorded refusal still carries the stable code.
    call = SubmitCheckpointRoot(run_id=bytes(32), root=bytes(32), size=1, consistency_proof=())
    P.UnknownRun.__name__ = "NoSuchRun"
    try:
        evs = P.apply_recorded(P.new_state(), call, "alice", 5)
    finally:
        P.UnknownRun.__name__ = "UnknownRun"
    assert [e.code for e in evs] == ["CallRefused"]
    assert evs[0].refusal == "UnknownRun" and evs[0].call == "submit_checkpoint_root"


def test_stored_codes_map_back_to_refusals():
    for code, cls in P.REFUSAL_TYPES.items():
        assert P.refusal_type(code) is cls
    with pytest.raises(ValueError, match="unknown refusal code 'Nope'"):
        P.refusal_type("Nope")


# The reasons a RemarkIgnored event records (chain.calls.IGNORE_REASONS): pinned like the codes.
IGNORE_REASON_CODES = ("too_large", "bad_cbor", "bad_shape", "unknown_call", "bad_fields", "truncated",
                       "bad_prefix", "unfunded_bond", "unfunded_run", "decoder_fault", "transport_fault")


def test_ignore_reason_table_is_pinned():
    from chain.calls import IGNORE_REASONS, Ignored

    assert tuple(IGNORE_REASONS) == IGNORE_REASON_CODES
    # Each message is one short fixed line (unfunded_bond's, the longest, is 87 characters).
    assert all(isinstance(m, str) and 0 < len(m) <= 100 for m in IGNORE_REASONS.values())
    assert Ignored.of(0, "a", b"x", "no such reason").reason == "decoder_fault"
