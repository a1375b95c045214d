"""A verifier daemon on a real Substrate runtime (chopsticks) whose websocket is cut under it, twice,
once while connections are refused for a while: it reconnects and resumes from its cursor, recording
every protocol event of the chain exactly once and skipping none.

tests/chain/test_substrate_reconnect.py cuts the transport under a bare follower; this cuts it under
the whole node (`pot node run`), whose database cursor must carry it across.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from chain.calls import BondVerifier, StartTrainingCommitment, SubmitCheckpointRoot, derive_run_id
from chain.protocol import ProtocolParams
from chain.substrate import connect_substrate
from chain.view import ChainView
from commitments import merkle
from commitments.files import atomic_write_text
from commitments.spec import Spec
from devnet.procs import free_port
from devnet.toml import to_toml
from node.db import DatabaseError, chain_cursor, chain_events, challenges, open_database, runs
from tests.chain.chopsticks_env import Chopsticks, chopsticks, fresh_chain, unique_key  # noqa: F401
from tests.chain.test_substrate_reconnect import CuttableProxy
from tests.faults.harness import wait_for
from tests.node.harness import REPO

pytestmark = [pytest.mark.chopsticks, pytest.mark.slow]

# Protocol v3 issues a challenge only when a committee seat unit (verifier_stake of free bond) is
# free: another account bonds two units, and each challenge seats one, so both are issued at once.
PARAMS = ProtocolParams(commit_window=8, reveal_window=8, opening_deadline=30, challenge_delay=2,
                        challenges_per_run=2, quorum_min_reveals=1, committee_size=1)
NONCE = b"\x61" * 16
LEAVES = [bytes([i]) * 40 for i in range(9)]


def _config(tmp, proxy_url: str, start_block: int, authority: str):
    data = tmp / "node"
    data.mkdir()
    secrets = tmp / "secrets.toml"
    atomic_write_text(secrets, to_toml({"key": {"uri": unique_key("verifier")}}), mode=0o600)
    doc = {
        "node": {
            "data_dir": str(data),
            "log_level": "info",
            "loop_interval_s": 0.1,
            "secrets_file": str(secrets),
        },
        "chain": {
            "url": proxy_url,
            "start_block": start_block,
            "poll_s": 0.1,
            "watchdog_s": 10.0,
            "authority": authority,  # a Substrate node pins it (this chain records no parameters)
            "rpc_timeout_s": 5.0,
        },
        "database": {"url": ""},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        # The node follows the chain; it bonds nothing (a Substrate bond carries a transfer).
        "verifier": {"bond": 0},
        "protocol": PARAMS.to_dict(),
    }
    path = tmp / "node.toml"
    atomic_write_text(path, to_toml(doc))
    return path, data / "node.db"


def test_node_resumes_from_its_cursor_after_the_socket_is_cut(tmp_path, chopsticks: Chopsticks):  # noqa: F811
    base = fresh_chain(chopsticks)
    proxy = CuttableProxy(chopsticks.port)
    writer = connect_substrate(chopsticks.url, unique_key("miner"))
    seats = connect_substrate(chopsticks.url, unique_key("seats"))
    log = open(tmp_path / "node.log", "ab")  # noqa: SIM115 - the process owns it
    proc = None
    try:
        chopsticks.fund([writer.account, seats.account])
        seats.submit([BondVerifier(2 * PARAMS.verifier_stake)])  # the transport pays its transfer
        config, db_path = _config(tmp_path, proxy.url, base, writer.account)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pot", "node", "run", "--config", str(config), "--init"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        engine = None

        def cursor() -> int:
            nonlocal engine
            if engine is None:
                if not db_path.exists():
                    return -1
                try:
                    engine = open_database(f"sqlite:///{db_path}")
                except DatabaseError:  # the node has created the file but not yet migrated it
                    return -1
            with engine.connect() as c:
                return c.execute(sa.select(chain_cursor.c.block)).scalar() or -1

        spec = Spec.from_dict({"steps": 8, "model": {"kind": "mlp", "block_size": 16, "hidden": [32]},
                               "batch": {"batch_size": 4, "seq_len": 16}}).to_cbor()
        run = derive_run_id(writer.account, NONCE)  # a run id belongs to its sender
        registered = writer.submit(
            [
                StartTrainingCommitment(
                    run, NONCE, b"\1" * 32, b"\2" * 32, b"\3" * 32, spec, 8, "http://127.0.0.1:9"
                )
            ]
        ).block_number
        wait_for(lambda: cursor() >= registered, 180, "the node ingesting the registration")

        # Cut 1: the socket goes, and reconnection is refused for a while; the chain moves on.
        proxy.refusing = True
        proxy.cut()
        rooted = writer.submit([SubmitCheckpointRoot(run, merkle.root(LEAVES), len(LEAVES), ())]).block_number
        chopsticks.new_blocks(PARAMS.challenge_delay + 1)  # the challenges are issued
        threading.Timer(2.0, lambda: setattr(proxy, "refusing", False)).start()
        wait_for(lambda: cursor() >= rooted, 120, "the node resuming after the first cut")

        # Cut 2: the socket goes again mid-stream, without refusal.
        proxy.cut()
        head = chopsticks.new_blocks(3)
        wait_for(lambda: cursor() >= head, 120, "the node resuming after the second cut")
        assert proc.poll() is None, (tmp_path / "node.log").read_text()[-3000:]

        # Exactly the chain's events, each once, in block order.
        view = ChainView(writer, PARAMS, cursor=base)
        expected = [(ev.block, ev.NAME) for ev in view.sync(until=head)]
        with engine.connect() as c:
            got = [(r.block, r.name) for r in c.execute(sa.select(chain_events).order_by(chain_events.c.block,
                                                                                      chain_events.c.position))]
            issued = list(c.execute(sa.select(challenges.c.challenge_id)))
            run_rows = list(c.execute(sa.select(runs.c.run_id)))
        engine.dispose()
        assert got == expected
        assert [n for _, n in got].count("ChallengeIssued") == len(issued) == PARAMS.challenges_per_run
        assert [bytes(r.run_id) for r in run_rows] == [run]
        text = (tmp_path / "node.log").read_text()
        assert "reconnected to" in text or '"chain_reconnect"' in text, text[-3000:]
        assert proxy.accepted >= 2
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()
        writer.close()
        seats.close()
        proxy.close()
