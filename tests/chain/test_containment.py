"""Fault containment at the chain boundary, tried as an attacker would: hostile pot1 payloads
(bignums, value sharing, deep nesting, oversized fields, payloads that crash a decoder) are each
recorded once as RemarkIgnored or refused with a code, the cursor moves on, the block's other
calls still apply, and the protocol state stays within its caps."""

from __future__ import annotations

import dataclasses
import json
import time

import cbor2
import pytest
from typer.testing import CliRunner

from chain import calls as C
from chain import protocol as P
from chain.calls import PREFIX, CallDecodeError, decode_call, encode_call
from chain.dev import DevTransport
from chain.protocol import rules
from chain.protocol.params import MAX_ENDPOINT_BYTES, MAX_SPEC_BYTES, MAX_URI_BYTES
from chain.view import ChainView
from commitments import cbor
from pot.cli import app
from tests.chain.runs import SyntheticRun, bond, proof, witness

PARAMS = P.ProtocolParams(challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2,
                          challenges_per_run=1, quorum_min_reveals=1, forced_challenge_steps=(3,))


def _bignum_remark(digits_bytes: int = 1800) -> bytes:
    # The same call shape as a root submission, with a size that is a CBOR bignum (tag 2).
    huge = int.from_bytes(b"\x7f" + b"\xff" * (digits_bytes - 1), "big")
    return PREFIX + cbor2.dumps(["submit_checkpoint_root", {
        "run_id": bytes(32), "root": bytes(32), "size": huge, "consistency_proof": []}])


def _value_sharing_remark(levels: int = 60) -> bytes:
    x: list = []
    for _ in range(levels):
        x = [x, x]  # a DAG of 2^levels paths: tags 28/29 keep it tiny on the wire
    return PREFIX + cbor2.dumps(
        ["commit_witness", {"challenge_id": bytes(32), "commitment": x}], value_sharing=True
    )


def _nested_remark(depth: int = 20000) -> bytes:
    return PREFIX + b"\x81" * depth + b"\x00"


HOSTILE = {
    "bignum": (_bignum_remark(), "bad_cbor"),
    "value_sharing": (_value_sharing_remark(), "bad_cbor"),
    "nested": (_nested_remark(), "bad_cbor"),
    "too_large": (PREFIX + b"\x00" * (C.MAX_CALL_BYTES + 1), "too_large"),
    "not_cbor": (PREFIX + b"\xff\x00", "bad_cbor"),
    "bad_shape": (PREFIX + cbor.encode({"a": 1}), "bad_shape"),
    "unknown_call": (PREFIX + cbor.encode(["x" * 5000, {}]), "unknown_call"),
    "bad_fields": (PREFIX + cbor.encode(["commit_witness", {"challenge_id": b"1", "commitment": b"2"}]),
                   "bad_fields"),
}


def test_hostile_payloads_decode_or_refuse_quickly_with_a_reason():
    for name, (payload, reason) in HOSTILE.items():
        t0 = time.monotonic()
        with pytest.raises(CallDecodeError) as err:
            decode_call(payload)
        assert err.value.reason == reason, name
        assert time.monotonic() - t0 < 1.0, name
    assert len(HOSTILE["value_sharing"][0]) < 700 and len(HOSTILE["bignum"][0]) > 1800


def test_an_unexpected_decoder_failure_is_a_decode_error(monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("decoder bug " + "x" * 10_000)

    monkeypatch.setattr(C.cbor, "decode", boom)
    with pytest.raises(CallDecodeError) as err:
        decode_call(encode_call(C.CommitWitness(bytes(32), bytes(32))))
    assert err.value.reason == "decoder_fault" and "xxx" not in str(err.value)


def _hostile_chain(path) -> tuple[DevTransport, SyntheticRun]:
    run = SyntheticRun(steps=4)
    miner = DevTransport(path, "miner")
    miner.record_params(PARAMS)
    payloads = [p for p, _ in HOSTILE.values()]
    # One block: every hostile payload around an honest registration and a foreign payload.
    miner.submit_payloads([payloads[0], encode_call(run.register()), b"hello chain", *payloads[1:]])
    DevTransport(path, "v1").submit([bond(PARAMS.verifier_stake)])  # v1 sits on the challenge's committee
    miner.submit([run.submit_full_root()])
    return miner, run


def test_a_hostile_block_is_read_to_its_head_and_recorded_once_per_payload(tmp_path):
    miner, run = _hostile_chain(tmp_path / "c.db")
    t0 = time.monotonic()
    view = ChainView(miner, PARAMS)
    view.sync()
    assert time.monotonic() - t0 < 5.0
    assert view.cursor == miner.finalized_head()
    assert run.run_id in view.state.runs  # the honest call of the same block applied
    ignored = view.of(P.RemarkIgnored)
    assert [(e.block, e.position, e.reason) for e in ignored] == [
        (1, 0, "bad_cbor"), *[(1, i + 3, r) for i, (_, r) in enumerate(list(HOSTILE.values())[1:])]]
    for e in ignored:
        assert e.origin == "miner" and e.message == C.IGNORE_REASONS[e.reason]
        assert (
            len(e.to_json()) < 400 + C.MAX_DETAIL
        )  # a code, a fixed message, a bounded detail; never the payload
    assert ignored[0].size == len(HOSTILE["bignum"][0])

    # Deterministic: another follower of the same chain records exactly the same events.
    other = ChainView(DevTransport(tmp_path / "c.db", "observer"), PARAMS)
    other.sync()
    assert [e.to_json() for e in other.events] == [e.to_json() for e in view.events]


def test_ignored_payloads_show_in_chain_events(tmp_path):
    _hostile_chain(tmp_path / "c.db")
    r = CliRunner().invoke(app, ["chain", "events", "--chain", f"dev://{tmp_path / 'c.db'}", "--json"])
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.splitlines()]
    assert [d["reason"] for d in lines if d["event"] == "RemarkIgnored"] == [r for _, r in HOSTILE.values()]
    assert "RunRegistered" in {d["event"] for d in lines}


def test_an_honest_run_after_hostile_remarks_still_resolves(tmp_path):
    miner, run = _hostile_chain(tmp_path / "c.db")
    view = ChainView(miner, PARAMS)
    while not view.state.challenges:
        miner.seal()
        view.sync()
    (ch,) = view.state.challenges.values()
    miner.submit_payloads([_value_sharing_remark(), encode_call(run.opening(ch.challenge_id, ch.step))])
    v = DevTransport(tmp_path / "c.db", "v1")
    com, rev = witness(ch.challenge_id, "v1", run.value_hash(ch.step))
    v.submit_payloads([_bignum_remark(), encode_call(com)])
    while view.cursor <= ch.commit_deadline:
        miner.seal()
        view.sync()
    v.submit_payloads([_nested_remark(), encode_call(rev)])
    while ch.verdict is None:
        miner.seal()
        view.sync()
    assert ch.verdict == "honest" and "v1" in ch.reveals
    assert len(view.of(P.RemarkIgnored)) == len(HOSTILE) + 3


def test_a_call_crashing_inside_the_protocol_records_no_attacker_text(tmp_path, monkeypatch):
    miner = DevTransport(tmp_path / "c.db", "miner")
    miner.submit([C.CommitWitness(bytes(32), bytes(32)), C.CommitWitness(b"\1" * 32, bytes(32))])

    def boom(state, call, origin, n):
        if call.challenge_id == bytes(32):
            raise ValueError("x" * 100_000)
        raise P.UnknownChallenge("no challenge")

    monkeypatch.setitem(rules._HANDLERS, C.CommitWitness, boom)
    view = ChainView(miner, PARAMS)
    events = view.sync()
    assert [(e.refusal, e.reason) for e in events] == [
        ("ProtocolError", "internal protocol error: ValueError"), ("UnknownChallenge", "no challenge")]
    assert view.cursor == 1


# --- caps on the protocol state --------------------------------------------------------------


def _apply(state, call, origin="miner", n=1):
    return P.apply_recorded(state, call, origin, n)


def test_registration_fields_over_the_caps_are_refused_with_a_code():
    run = SyntheticRun()
    state = P.new_state(PARAMS)
    cases = [
        run.register(spec=b"\xa0" * (MAX_SPEC_BYTES + 1)),
        run.register(endpoint="http://" + "e" * MAX_ENDPOINT_BYTES),
        run.register(declared_steps=2**40),
    ]
    for call in cases:
        (ev,) = _apply(state, call)
        assert ev.refusal == "FieldTooLarge", ev.reason
    assert state.runs == {}
    (ev,) = _apply(state, run.register())
    assert isinstance(ev, P.RunRegistered)
    assert len(state.runs[run.run_id].registration) == 32  # a digest, whatever the spec's size


def test_open_runs_per_miner_are_capped_and_witnesses_are_the_seated_accounts(monkeypatch):
    """Open runs of one miner are capped (TooMany). Witness lists need no cap of their own: only a
    seated account commits, once, and a round seats at most MAX_DISPUTE_SEATS accounts, so
    arrival order never decides who takes part (an unseated account is NotInCommittee, never
    crowded out)."""
    from chain.protocol.params import MAX_DISPUTE_SEATS, MAX_WITNESSES_PER_CHALLENGE

    assert MAX_WITNESSES_PER_CHALLENGE == MAX_DISPUTE_SEATS
    monkeypatch.setattr(rules, "MAX_OPEN_RUNS_PER_MINER", 2)
    state = P.new_state(dataclasses.replace(PARAMS, committee_size=2))
    runs = [SyntheticRun(seed=f"r{i}", steps=4) for i in range(3)]
    for who in ("v1", "v2", "v3"):
        _apply(state, bond(), who)
    assert isinstance(_apply(state, runs[0].register())[0], P.RunRegistered)
    assert isinstance(_apply(state, runs[1].register())[0], P.RunRegistered)
    (ev,) = _apply(state, runs[2].register())
    assert ev.refusal == "TooMany"
    _apply(state, runs[0].submit_full_root(), n=2)
    events = P.on_block(state, type("B", (), {"number": 3, "hash": b"\3" * 32})())
    (issued,) = [e for e in events if isinstance(e, P.ChallengeIssued)]
    cid = issued.challenge_id
    assert len(issued.committee) == 2 and len(set(issued.committee)) == 2  # one unit each: two accounts
    # The opening's URI is capped.
    op = runs[0].opening(cid, issued.step)
    long_uri = C.SubmitOpening(op.challenge_id, op.opening_digest, "http://" + "u" * MAX_URI_BYTES, op.leaf,
                               op.leaf_proof)
    (ev,) = _apply(state, long_uri, "miner", 3)
    assert ev.refusal == "FieldTooLarge"
    assert isinstance(_apply(state, op, "miner", 3)[0], P.OpeningSubmitted)
    unseated = next(v for v in ("v1", "v2", "v3") if v not in issued.committee)
    for who in (unseated, *issued.committee):  # the unseated one first: it still takes no seat
        com, _ = witness(cid, who, runs[0].value_hash(issued.step))
        (ev,) = _apply(state, com, who, 3)
        assert (
            isinstance(ev, P.WitnessCommitted) if who in issued.committee else ev.refusal == "NotInCommittee"
        )
    assert set(state.challenges[cid].commitments) == set(issued.committee)


def test_rejected_reveals_keep_one_record_per_verifier():
    run = SyntheticRun(steps=4)
    state = P.new_state(PARAMS)
    _apply(state, run.register())
    _apply(state, bond(), "v1")
    _apply(state, run.submit_full_root(), n=2)
    events = P.on_block(state, type("B", (), {"number": 3, "hash": b"\3" * 32})())
    (issued,) = [e for e in events if isinstance(e, P.ChallengeIssued)]
    ch = state.challenges[issued.challenge_id]
    com, rev = witness(ch.challenge_id, "v1", run.value_hash(ch.step))
    _apply(state, run.opening(ch.challenge_id, ch.step), "miner", 3)
    assert isinstance(_apply(state, com, "v1", 3)[0], P.WitnessCommitted)
    bad = C.RevealWitnessValue(ch.challenge_id, bytes(32), proof(ch.challenge_id), 0, rev.salt)
    for _ in range(5):
        evs = _apply(state, bad, "v1", ch.commit_deadline + 1)
        assert evs[-1].refusal == "CommitmentMismatch"
    assert len(ch.rejected) == 1


def test_hostile_spec_and_leaf_bytes_are_refused_with_a_code_quickly():
    run = SyntheticRun(steps=4)
    state = P.new_state(PARAMS)
    shared = cbor2.dumps({"steps": _value_sharing_remark()}, value_sharing=True)
    t0 = time.monotonic()
    (ev,) = _apply(state, run.register(spec=shared))
    assert ev.refusal == "InvalidCall"
    _apply(state, run.register())
    _apply(state, bond(), "v1")  # a free seat unit: the challenge is drawn
    _apply(state, run.submit_full_root(), n=2)
    events = P.on_block(state, type("B", (), {"number": 3, "hash": b"\3" * 32})())
    (issued,) = [e for e in events if isinstance(e, P.ChallengeIssued)]
    # A leaf the miner's own tree holds, but which is a deeply nested CBOR bomb, not a step leaf.
    bomb = b"\x81" * 1000 + b"\x00"
    leaves = list(run.leaves)
    leaves[issued.step] = bomb
    run.leaves = leaves
    state.challenges[issued.challenge_id].root = run.root(len(leaves))
    (ev,) = _apply(state, run.opening(issued.challenge_id, issued.step), "miner", 3)
    assert ev.refusal == "BadLeaf"
    assert time.monotonic() - t0 < 2.0
