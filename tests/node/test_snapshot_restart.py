"""The daemon's protocol-state snapshot in its database is sealed under the node's snapshot key:
a restart with a tampered snapshot row discards it with a warning, derives the state again from
the chain and goes on; a block whose protocol work fails is recorded, counted and the node goes on."""

from __future__ import annotations

import logging
import stat

import sqlalchemy as sa

from chain.dev import DevTransport
from chain.protocol import ProtocolParams, rules
from chain.view import SNAPSHOT_KEY_FILE, seal_snapshot
from commitments import cbor
from node import daemon
from node.db import chain_cursor, chain_events
from node.faults import block_fault_counts
from tests.chain.runs import SyntheticRun, bond
from tests.node.harness import in_process_node

PARAMS = ProtocolParams(challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2,
                        challenges_per_run=1, quorum_min_reveals=1, forced_challenge_steps=(3,))


def _chain(path) -> tuple[DevTransport, SyntheticRun]:
    run = SyntheticRun(steps=4)
    miner = DevTransport(path, "miner")
    miner.record_params(PARAMS)
    DevTransport(path, "v1").submit([bond(PARAMS.verifier_stake)])
    miner.submit([run.register()])
    miner.submit([run.submit_full_root()])
    for _ in range(3):
        miner.seal()
    return miner, run


def _snapshot(engine) -> bytes:
    with engine.connect() as c:
        return bytes(c.execute(sa.select(chain_cursor.c.snapshot)).scalar_one())


def _set_snapshot(engine, data: bytes) -> None:
    with engine.begin() as c:
        c.execute(sa.update(chain_cursor).values(snapshot=data))


def _with_bad_field(state) -> bytes:
    obj = cbor.decode(state.to_cbor())
    obj["runs"][0]["size"] = "5"
    return cbor.encode(obj)


def _restart_with(tmp_path, engine, data: bytes, caplog):
    """Put `data` in the snapshot row, start a node on the database again, return it started."""
    _set_snapshot(engine, data)
    again, _ = in_process_node(tmp_path, tmp_path / "c.db")
    with caplog.at_level(logging.WARNING, logger="node.daemon"):
        again.start()
    return again


def test_a_restart_with_a_tampered_database_snapshot_derives_again_and_continues(tmp_path, caplog):
    miner, run = _chain(tmp_path / "c.db")
    node, engine = in_process_node(tmp_path, tmp_path / "c.db")
    node.start()
    node.ingest()
    node.shutdown()  # the snapshot of the cursor itself
    key_file = node.data_dir / SNAPSHOT_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    honest = _snapshot(engine)
    state = daemon.read_snapshot(honest, node.snapshot_key)
    assert state == node.view.state and state.challenges

    flipped = bytearray(honest)
    flipped[len(flipped) // 2] ^= 0x10
    forged_state = daemon.read_snapshot(honest, node.snapshot_key)
    forged_state.vbonds["v1"] = 10**9
    tampered = {
        "flipped": bytes(flipped),
        "rekeyed": seal_snapshot(bytes(32), daemon.NODE_SNAPSHOT_DOMAIN, forged_state.to_cbor()),
        "unkeyed": state.to_cbor(),  # what a node before keyed snapshots wrote
        # Sealed with the node's key, malformed inside (what an older bug could have written).
        "malformed": seal_snapshot(node.snapshot_key, daemon.NODE_SNAPSHOT_DOMAIN, _with_bad_field(state)),
    }
    expected = {"flipped": "does not match this node's snapshot key", "rekeyed": "does not match this node's",
                "unkeyed": "written without a key digest", "malformed": r"runs[0].size must be an integer"}
    for name, data in tampered.items():
        caplog.clear()
        again = _restart_with(tmp_path, engine, data, caplog)
        (warning,) = [r for r in caplog.records if r.getMessage() == "snapshot_discarded"]
        assert warning.levelno == logging.WARNING and expected[name] in warning.reason, (name, warning.reason)
        assert again.view.cursor == miner.finalized_head() and again.view.state == state, name
        assert again.snapshot_block is None, name  # the next block writes a fresh snapshot
        again.transport.close()

    # It goes on: the next blocks are ingested and the row holds a good snapshot again.
    before = miner.finalized_head()
    miner.seal()
    miner.seal()
    again.transport = DevTransport(tmp_path / "c.db", "v1")
    again.ingest()
    assert again.view.cursor == miner.finalized_head()
    # Its first block wrote a fresh snapshot, sealed under the node's key.
    assert daemon.read_snapshot(_snapshot(engine), again.snapshot_key).head == before + 1
    engine.dispose()


def test_a_failed_resolution_is_recorded_counted_and_logged_as_an_alarm(tmp_path, monkeypatch, caplog):
    miner, run = _chain(tmp_path / "c.db")
    for _ in range(6):
        miner.seal()

    def poisoned(state, ch, n, block_hash):
        raise RuntimeError("a protocol bug")

    monkeypatch.setattr(rules, "_resolve", poisoned)
    node, engine = in_process_node(tmp_path, tmp_path / "c.db")
    node.start()
    with caplog.at_level(logging.ERROR, logger="node.daemon"):
        node.ingest()
    assert node.view.cursor == miner.finalized_head()
    with engine.connect() as c:
        names = [r.name for r in c.execute(sa.select(chain_events.c.name))]
        counts = block_fault_counts(c)
    assert names.count("BlockWorkFailed") == counts["resolution"] >= 1
    alarms = [r for r in caplog.records if r.getMessage() == "block_work_failed"]
    assert len(alarms) == counts["resolution"] and all(r.levelno == logging.ERROR for r in alarms)
    assert {(r.stage, r.error_type) for r in alarms} == {("resolution", "RuntimeError")}
    node.transport.close()
    engine.dispose()
