"""ChainView: derived state from blocks, refusals recorded, snapshots resume where they stopped."""

from __future__ import annotations

import pytest

from chain import protocol as P
from chain.dev import DevTransport
from chain.protocol import ProtocolParams, SnapshotError
from chain.transport import Block
from chain.view import ChainView, seal_snapshot, snapshot_key
from tests.chain.runs import SyntheticRun, bond

PARAMS = ProtocolParams(challenge_delay=1)


def chain_with_run(path):
    run = SyntheticRun()
    miner = DevTransport(path, "miner")
    miner.submit([run.register()])
    miner.submit([run.submit_root(4)])
    miner.submit_payloads([b"pot1 not cbor"])  # skipped by the transport and recorded, not a crash
    miner.submit([run.submit_root(2)])  # refused: not append-only
    return run, miner


def test_view_derives_state_and_records_refusals(tmp_path):
    run, miner = chain_with_run(tmp_path / "c.db")
    view = ChainView(miner, PARAMS)
    events = view.sync()
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["RunRegistered", "CheckpointRootUpdated", "RemarkIgnored", "CallRefused"]
    assert (events[2].block, events[2].reason, events[2].origin) == (3, "bad_cbor", "miner")
    assert events[3].refusal == "RootNotAppendOnly" and events[3].block == 4
    assert view.cursor == 4 and view.state.head == 4
    assert view.state.runs[run.run_id].size == 4
    assert view.sync() == []


def test_sync_until_and_process_order(tmp_path):
    _, miner = chain_with_run(tmp_path / "c.db")
    view = ChainView(miner, PARAMS)
    assert [type(e) for e in view.sync(until=1)] == [P.RunRegistered]
    assert view.cursor == 1
    with pytest.raises(ValueError, match="does not follow the cursor"):
        view.process(Block(3, bytes(32)))


def test_follow_yields_events(tmp_path):
    _, miner = chain_with_run(tmp_path / "c.db")
    view = ChainView(miner, PARAMS)
    seen = []
    for ev in view.follow(poll=0.01, stop=lambda: view.cursor >= 4):
        seen.append(ev)
    assert [type(e).__name__ for e in seen][:2] == ["RunRegistered", "CheckpointRootUpdated"]


def test_snapshot_resume_equals_full_replay(tmp_path):
    run, miner = chain_with_run(tmp_path / "c.db")
    snap = tmp_path / "view" / "state.cbor"
    view = ChainView(miner, PARAMS)
    view.sync(until=2)
    view.save(snap)
    DevTransport(tmp_path / "c.db", "v1").submit([bond()])  # a free seat unit: the challenge is drawn
    miner.submit([run.submit_root(9, 4)])
    miner.seal()
    miner.seal()
    resumed = ChainView.load(miner, snap, PARAMS)
    assert resumed.cursor == 2
    tail = resumed.sync()
    full = ChainView(miner, PARAMS)
    all_events = full.sync()
    assert tail == [e for e in all_events if e.block > 2]
    assert any(isinstance(e, P.ChallengeIssued) for e in tail)
    assert resumed.state == full.state


def test_snapshot_refusals(tmp_path):
    _, miner = chain_with_run(tmp_path / "a.db")
    snap = tmp_path / "state.cbor"
    view = ChainView(miner, PARAMS)
    view.sync()
    view.save(snap)
    with pytest.raises(SnapshotError, match="other protocol parameters"):
        ChainView.load(miner, snap, ProtocolParams(challenge_delay=3))
    other = DevTransport(tmp_path / "b.db", "miner")
    for _ in range(5):
        other.seal()
    with pytest.raises(SnapshotError, match="differs from the snapshot"):
        ChainView.load(other, snap, PARAMS)
    with pytest.raises(SnapshotError, match="beyond this chain's head"):
        ChainView.load(DevTransport(tmp_path / "c.db"), snap, PARAMS)
    snap.write_bytes(b"garbage")
    with pytest.raises(SnapshotError, match="unusable"):
        ChainView.load(miner, snap, PARAMS)
    missing = ChainView.load(miner, tmp_path / "none.cbor", PARAMS)
    assert missing.cursor == 0


def test_a_call_that_breaks_the_protocol_is_recorded_not_fatal(tmp_path):
    from chain.calls import CommitWitness

    t = DevTransport(tmp_path / "c.db", "miner")
    view = ChainView(t, PARAMS)
    broken = object.__new__(CommitWitness)  # no fields: the handler fails with AttributeError
    events = view.process(Block(1, bytes(32), (("v1", broken),)))
    (ev,) = events
    assert isinstance(ev, P.CallRefused) and ev.refusal == "ProtocolError" and "AttributeError" in ev.reason
    assert view.cursor == 1


@pytest.mark.parametrize(
    ("old_version", "gone"),
    [
        (
            "v1",
            ("vbonds", "unbonding", "reserved", "staked", "disputes", "burned", "paid"),
        ),  # before verifier bonds
        (
            "v2",
            ("reserved", "staked", "disputes", "burned", "paid"),
        ),  # before seat collateral, fees and burns
    ],
)
def test_a_snapshot_of_an_older_protocol_is_refused_naming_the_file_and_the_versions(
    tmp_path, old_version, gone
):
    from commitments import cbor

    _, miner = chain_with_run(tmp_path / "c.db")
    snap = tmp_path / "state.cbor"
    view = ChainView(miner, PARAMS)
    view.sync()
    view.save(snap)
    domain, cursor, cursor_hash, state_bytes, _tag = cbor.decode(snap.read_bytes())
    old = cbor.decode(state_bytes)
    old["version"] = f"pot/protocol-state/{old_version}"  # what a node of that protocol wrote
    for k in gone:
        old.pop(k)
    # Sealed with this node's key: the digest checks, the state inside is of the older version.
    snap.write_bytes(seal_snapshot(snapshot_key(snap.parent), domain, cursor, cursor_hash, cbor.encode(old)))
    with pytest.raises(SnapshotError) as err:
        ChainView.load(miner, snap, PARAMS)
    msg = str(err.value)
    assert msg.startswith(f"{snap}: ") and f"a pot/protocol-state/{old_version} snapshot" in msg
    assert "this node reads pot/protocol-state/v3" in msg and "drop the snapshot" in msg
    # Without the snapshot the view derives the same state from the chain.
    snap.unlink()
    fresh = ChainView.load(miner, snap, PARAMS)
    fresh.sync()
    assert fresh.state == view.state


def test_summary_lists_open_challenges_and_verifiers(tmp_path):
    from chain.calls import UnbondVerifier

    run = SyntheticRun()
    miner = DevTransport(tmp_path / "c.db", "miner")
    DevTransport(tmp_path / "c.db", "v1").submit([bond(120)])
    v2 = DevTransport(tmp_path / "c.db", "v2")
    v2.submit([bond(40)])  # refused: below verifier_stake, v2 is no verifier yet
    v2.submit([bond(100)])
    v2.submit([UnbondVerifier(100)])  # all of it, before the draw: no seat for v2
    miner.submit([run.register()])
    miner.submit([run.submit_full_root()])
    miner.seal()
    view = ChainView(miner, ProtocolParams(challenge_delay=1, challenges_per_run=2))
    view.sync()
    (refused,) = view.of(P.CallRefused)
    assert (refused.origin, refused.refusal) == ("v2", "BondBelowMinimum")
    s = view.summary()
    assert s["cursor"] == 7 and s["runs"] == 1
    assert s["challenges"] == {"open": 1, "resolved": 0, "verdicts": {}}
    (c,) = s["open_challenges"]
    (issued,) = view.of(P.ChallengeIssued)
    assert c["challenge_id"] == issued.challenge_id.hex() and c["committee"] == ["v1"] and c["round"] == 1
    assert c["first"] is None and not c["opened"] and (c["commitments"], c["reveals"]) == (0, 0)
    assert (c["opening_deadline"], c["commit_deadline"], c["reveal_deadline"]) == (
        issued.opening_deadline, issued.commit_deadline, issued.reveal_deadline)
    release = 4 + ProtocolParams().unbonding_delay
    assert s["verifiers"] == [
        {"account": "v1", "bond": 120, "eligible": True, "unbonding": [], "penalized": 0},
        {"account": "v2", "bond": 0, "eligible": False, "unbonding": [[release, 100]], "penalized": 0},
    ]
    import json

    json.dumps(s)
