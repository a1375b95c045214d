"""The daemon as a real process on a live dev chain: it verifies a run, records the timeline, stops
gracefully, resumes exactly once from its cursor, and refuses chains and databases it does not own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from chain.calls import BondVerifier, CommitWitness, RevealWitnessValue
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from challenges.witness import verify_witness
from node.daemon import StartupError
from node.db import chain_cursor, chain_events, challenges, open_database, stage_log, txs, witnesses
from tests.node.harness import REPO, Network, chain_calls, in_process_node

pytestmark = pytest.mark.slow

PARAMS = ProtocolParams(commit_window=60, reveal_window=16, opening_deadline=10, challenge_delay=2,
                        quorum_min_reveals=1, challenges_per_run=1, forced_challenge_steps=(7,))


def test_node_verifies_an_honest_run_and_resumes_exactly_once(tmp_path, db_url):
    net = Network(tmp_path, PARAMS, interval=0.5)
    try:
        cfg = net.node_config("v1", db_url=db_url)
        proc = net.start_node("v1", cfg)
        run = net.start_run(steps=8)
        assert run.opened.wait(120), "the miner never saw its challenge"
        view = net.wait_resolved(run.challenge_id, 150)
        ch = view.state.challenges[run.challenge_id]
        assert ch.verdict == "honest" and "v1" in ch.reveals and ch.committee == ["v1"]
        # the one winning seat is paid its fee from the miner's escrow (protocol v3), credited to its bond
        fee = view.state.runs[run.run_id].seat_fee
        assert fee > 0 and view.state.paid["v1"] == fee
        assert view.state.vbonds["v1"] == PARAMS.verifier_stake + fee
        time.sleep(1.5)  # let the node ingest the resolution block
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, net.log("v1")[-3000:]
        assert '"node_stopped"' in net.log("v1")

        engine = open_database(db_url)
        with engine.connect() as c:
            job = c.execute(sa.select(challenges)).one()
            assert (job.stage, job.verdict, job.in_winning_cluster, job.outlier) == (
                "done",
                "honest",
                True,
                False,
            )
            assert job.matches_leaf is True and job.step == 7
            assert (job.round, job.first_id, json.loads(job.committee), job.on_committee) == (
                1,
                None,
                ["v1"],
                True,
            )
            # The pair went on chain as journaled: H(leaf t) and the proof hash of the replayed post-state.
            assert bytes(job.value_hash) == ch.reveals["v1"][0] == bytes(job.leaf_hash)
            assert bytes(job.proof_hash) == bytes(job.replay_proof_hash) == ch.reveals["v1"][2]
            salt = bytes(c.execute(sa.select(witnesses.c.salt)).scalar_one())
            assert verify_witness(
                ch.commitments["v1"],
                run.challenge_id,
                ch.reveals["v1"][0],
                ch.reveals["v1"][1],
                salt,
                "v1",
                proof_hash=ch.reveals["v1"][2],
            )
            assert json.loads(job.loss_checks)["steps"] == 8
            stages = [r.stage for r in c.execute(sa.select(stage_log).order_by(stage_log.c.id))]
            assert stages == [
                "awaiting_opening",
                "fetch",
                "validate",
                "losschecks",
                "replay",
                "witness",
                "commit",
                "reveal",
                "resolution",
            ]
            assert all(r.finished_at >= r.started_at for r in c.execute(sa.select(stage_log)))
            assert {(r.kind, r.state) for r in c.execute(sa.select(txs))} == {("commit", "confirmed"),
                                                                              ("reveal", "confirmed")}
            events_before = c.execute(sa.select(sa.func.count()).select_from(chain_events)).scalar()
            cursor_before = c.execute(sa.select(chain_cursor.c.block)).scalar()
        mine = chain_calls(net, "v1")
        assert [type(c) for _, _, c in mine] == [BondVerifier, CommitWitness, RevealWitnessValue]
        assert mine[0][2].amount == PARAMS.verifier_stake

        # A restart resumes after its cursor: no block is applied twice, none is skipped.
        proc = net.start_node("v1", cfg, init=False)
        time.sleep(8)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        with engine.connect() as c:
            cursor_after = c.execute(sa.select(chain_cursor.c.block)).scalar()
            rows = c.execute(sa.select(chain_events.c.block, chain_events.c.position)).all()
            names = [json.loads(b)["event"] for (b,) in c.execute(sa.select(chain_events.c.body))]
        engine.dispose()
        assert len(rows) == len(set(rows)) >= events_before
        assert cursor_after > cursor_before
        # Every event of the chain up to the cursor, each exactly once.
        v = net.view()
        upto = [e.NAME for e in v.events if e.block <= cursor_after]
        assert sorted(names) == sorted(upto)
        assert names.count("ChallengeResolved") == 1 and names.count("ChallengeIssued") == 1
        # The restarted node found its bond on chain: it bonded once in all.
        assert [type(c) for _, _, c in chain_calls(net, "v1")].count(BondVerifier) == 1
        assert '"bond_ok"' in net.log("v1")

        # The offline check of the same opening, with the facts read from the chain.
        opening = next((tmp_path / "served" / "openings").iterdir())
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pot",
                "verify",
                "opening",
                str(opening),
                "--json",
                "--chain",
                net.url,
                "--challenge",
                run.challenge_id.hex(),
                "--config",
                str(cfg),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["verdict"] == "verified"
        assert json.loads(out.stdout)["facts"] == "chain"
        # ... replays to the same witness pair the node revealed.
        assert json.loads(out.stdout)["replay"]["value_hash"] == ch.reveals["v1"][0].hex()
        assert json.loads(out.stdout)["replay"]["proof_hash"] == ch.reveals["v1"][2].hex()
    finally:
        net.close()


def test_run_refuses_an_uninitialised_database(tmp_path):
    cfg = tmp_path / "n.toml"
    cfg.write_text(f'[chain]\nurl = "dev:///{tmp_path}/c.db"\naccount = "v1"\n')
    DevTransport(tmp_path / "c.db").close()  # the chain exists: `pot node run` never creates one
    out = subprocess.run([sys.executable, "-m", "pot", "node", "run", "--config", str(cfg)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not initialised; run `pot node init" in out.stderr
    out = subprocess.run([sys.executable, "-m", "pot", "node", "init", "--config", str(cfg)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)["ok"] is True


def _node(tmp_path, chain_db, env=None, protocol="[protocol]\n"):
    """A node on `chain_db`; its [protocol] section (by default present, so a pin of the defaults,
    which these chains without a parameter record need) is `protocol`."""
    return in_process_node(tmp_path, chain_db, protocol, env)


def test_start_refuses_parameters_other_than_the_chains(tmp_path):
    DevTransport(tmp_path / "c.db", "miner").record_params(ProtocolParams(commit_window=9))
    node, engine = _node(tmp_path, tmp_path / "c.db", protocol="[protocol]\ncommit_window = 12\n")
    with pytest.raises(StartupError, match="disagrees with the protocol parameters the chain records"):
        node.start()
    engine.dispose()
    # Without a [protocol] section the node follows the chain's record.
    follower, engine = _node(tmp_path, tmp_path / "c.db", protocol="")
    follower.start()
    assert follower.view is not None and follower.view.params.commit_window == 9
    follower.shutdown()
    engine.dispose()


def test_start_refuses_a_chain_without_parameters_and_no_pin(tmp_path):
    DevTransport(tmp_path / "c.db", "miner").seal()
    node, engine = _node(tmp_path, tmp_path / "c.db", protocol="")
    with pytest.raises(StartupError, match="records no protocol parameters .* and none are pinned"):
        node.start()
    engine.dispose()


def test_start_refuses_a_database_of_another_chain(tmp_path):
    a = DevTransport(tmp_path / "a.db", "x")
    for _ in range(3):
        a.seal()
    node, engine = _node(tmp_path, tmp_path / "a.db")
    node.start()
    node.ingest()
    node.shutdown()
    assert node.view is not None and node.view.cursor == 3
    b = DevTransport(tmp_path / "b.db", "x")
    for _ in range(5):
        b.seal()
    other, _ = _node(tmp_path, tmp_path / "b.db")
    with pytest.raises(StartupError, match="belongs to another chain"):
        other.start()
    engine.dispose()


def test_watchdog_rebuilds_the_connection(tmp_path):
    env = {"POT_CHAIN_WATCHDOG_S": "0.3"}
    node, engine = _node(tmp_path, tmp_path / "c.db", env=env)
    node.start()
    first = node.transport
    time.sleep(0.5)
    node.step()
    assert node.transport is not first and node.view is not None
    node.shutdown()
    engine.dispose()


def test_node_reads_past_hostile_remarks_and_still_verifies_from_a_mirror(tmp_path):
    """Hostile remarks around an honest run whose opening URI on chain is dead: the node ignores
    the remarks, fetches the opening from the mirror the opening names, and verifies."""
    from chain.view import snapshot_key
    from node.daemon import read_snapshot
    from node.db import ignored_counts
    from tests.chain.test_containment import HOSTILE, _bignum_remark, _value_sharing_remark

    net = Network(tmp_path, PARAMS, interval=0.5)
    try:
        attacker = DevTransport(net.chain_path, "mallory")
        attacker.submit_payloads([p for p, _ in HOSTILE.values()])
        cfg = net.node_config("v1")
        proc = net.start_node("v1", cfg)
        dead = "http://127.0.0.1:9"  # nothing listens on the discard port
        run = net.start_run(steps=8, opening_base=dead, mirrors=(net.endpoint,))
        attacker.submit_payloads([_bignum_remark(), _value_sharing_remark()])
        assert run.opened.wait(120), "the miner never saw its challenge"
        view = net.wait_resolved(run.challenge_id, 150)
        ch = view.state.challenges[run.challenge_id]
        assert ch.verdict == "honest" and "v1" in ch.reveals
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, net.log("v1")[-3000:]
        assert '"remark_ignored"' in net.log("v1")

        engine = open_database(f"sqlite:///{tmp_path / 'v1-data' / 'node.db'}")
        with engine.connect() as c:
            names = [r.name for r in c.execute(sa.select(chain_events.c.name))]
            counts = ignored_counts(c)
            cursor = c.execute(sa.select(chain_cursor)).one()
            job = c.execute(sa.select(challenges)).one()
            fetch = c.execute(sa.select(stage_log.c.detail).where(stage_log.c.stage == "fetch")).scalar_one()
        engine.dispose()
        [mirror] = json.loads(job.opening_mirrors)
        assert job.opening_uri.startswith(dead) and mirror.startswith(net.endpoint)
        assert job.opening_source == mirror and job.matches_leaf is True
        assert f"from {mirror} after 1 failed address(es): {job.opening_uri}: unreachable" in fetch
        assert names.count("RemarkIgnored") == len(HOSTILE) + 2
        assert counts["bad_cbor"] == sum(r == "bad_cbor" for _, r in HOSTILE.values()) + 2
        assert sum(counts.values()) == len(HOSTILE) + 2
        # A graceful stop leaves the snapshot of the cursor itself.
        key = snapshot_key(tmp_path / "v1-data")
        assert read_snapshot(cursor.snapshot, key).head == cursor.block
    finally:
        net.close()


def test_the_snapshot_is_written_every_few_blocks_and_rederived_on_start(tmp_path):
    from chain.protocol import ProtocolState
    from node import daemon
    from tests.chain.runs import SyntheticRun

    miner = DevTransport(tmp_path / "c.db", "miner")
    run = SyntheticRun(steps=4)
    miner.submit([run.register()])
    for _ in range(daemon.SNAPSHOT_MIN_BLOCKS + 5):
        miner.seal()
    node, engine = _node(tmp_path, tmp_path / "c.db")
    node.start()
    writes = []
    real = ProtocolState.to_cbor
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ProtocolState, "to_cbor", lambda self: writes.append(self.head) or real(self))
        node.ingest()
    head = miner.finalized_head()
    assert node.view.cursor == head
    assert writes == [1, 1 + daemon.SNAPSHOT_MIN_BLOCKS]  # the first block, then every 16th
    with engine.connect() as c:
        row = c.execute(sa.select(chain_cursor)).one()
    assert row.block == head and daemon.read_snapshot(row.snapshot, node.snapshot_key).head == writes[-1]
    state_before = node.view.state.to_cbor()
    node.transport.close()  # a crash: no shutdown, so no final snapshot

    again, _ = _node(tmp_path, tmp_path / "c.db")
    again.start()  # re-derives the blocks after the snapshot up to the cursor
    assert again.view.cursor == head and again.view.state.to_cbor() == state_before
    assert run.run_id in again.view.state.runs
    again.shutdown()  # a graceful stop writes the snapshot of the cursor itself
    with engine.connect() as c:
        row = c.execute(sa.select(chain_cursor)).one()
    assert daemon.read_snapshot(row.snapshot, again.snapshot_key).head == head
    engine.dispose()
