"""Faults on a live dev-chain network, all in one challenge window: a verifier SIGKILLed from outside
mid-download and mid-replay, the chain's sealer process killed and restarted, the PostgreSQL
server under another verifier restarted, and a prover that hangs (once for one run, always for another).

tests/node/test_crash.py kills the daemon from inside at each durable point; these kills come from
outside at arbitrary moments (a partial download, a replay worker in flight). Afterwards every node
has taken part in every challenge inside its window, with one commitment and one reveal each.
"""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

from chain import protocol as P
from chain.calls import CommitWitness, RevealWitnessValue, encode_call
from chain.protocol import ProtocolParams
from challenges.refused import REFUSED_BUCKET, refused_value_hash
from node.db import challenges, open_database, txs
from tests.faults.harness import FaultNetwork, alive, kill9, pg_restart, wait_for
from tests.node.conftest import PG_ADMIN_URL
from tests.node.harness import chain_calls, run_id_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# Each node bonds 10 seat units and a committee has 10 seats: the two runs' challenges are open at
# once (protocol v3 issues a challenge only when its seats are free), each seating both nodes.
PARAMS = ProtocolParams(
    commit_window=260,
    reveal_window=60,
    opening_deadline=10,
    challenge_delay=2,
    quorum_min_reveals=2,
    challenges_per_run=1,
    committee_size=10,
    forced_challenge_steps=(7,),
)
BOND = 10 * PARAMS.verifier_stake
NONCE_OK, NONCE_DEAD = b"\x51" * 16, b"\x52" * 16
RUN_OK = run_id_for(NONCE_OK)  # its prover hangs the first two opening requests, then serves slowly
RUN_DEAD = run_id_for(NONCE_DEAD)  # its prover never answers for the opening
ENV = {"POT_FETCH_READ_TIMEOUT_S": "2", "POT_CHAIN_WATCHDOG_S": "4"}


@pytest.fixture
def pg_db():
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"pot_faults_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield admin, name, f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    with admin.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _log_has(net: FaultNetwork, name: str, needle: str, after: int = 0) -> bool:
    return needle in net.log(name)[after:]


# It stops the PostgreSQL server every other test shares, so it runs on its own (./scripts/test runs
# the `serial` tests after the parallel part).
@pytest.mark.serial
def test_node_recovers_from_kills_chain_restart_db_outage_and_a_hanging_prover(tmp_path, pg_db):
    admin, pg_name, pg_url = pg_db
    net = FaultNetwork(tmp_path, PARAMS, interval=0.3)
    try:
        cfg = {"a": net.node_config("a", bond=BOND), "b": net.node_config("b", db_url=pg_url, bond=BOND)}
        net.prover.hang_first[RUN_OK] = 2
        net.prover.hang_always.add(RUN_DEAD)
        net.prover.throttle_bps = 60_000  # ~9 s per opening: time to kill a node mid-download
        for name in ("a", "b"):
            net.start_node(name, cfg[name], env=ENV)
        ok = net.start_run(steps=8, nonce=NONCE_OK)
        assert ok.opened.wait(120), "the miner never saw its challenge"
        node_b = net.nodes["b"]

        # 1. Kill a mid-download (its partial file is on disk), restart it: it resumes with a Range.
        part = tmp_path / "a-data" / "openings" / f"{ok.challenge_id.hex()}.opening.part"
        wait_for(lambda: part.exists() and part.stat().st_size > 0, 120, "node a downloading the opening")
        kill9(net.nodes["a"])
        offset = len(net.log("a"))
        net.start_node("a", cfg["a"], env=ENV, init=False)
        dead = net.start_run(steps=8, nonce=NONCE_DEAD)

        # 2. Kill it again with a replay in flight; its replay worker must not outlive it.
        wait_for(lambda: _log_has(net, "a", '"replay_started"', offset), 180, "node a replaying")
        orphans = kill9(net.nodes["a"])
        assert orphans, "a replaying node has a replay worker process"
        wait_for(lambda: not any(alive(p) for p in orphans), 60, "the killed node's replay worker exiting")
        net.start_node("a", cfg["a"], env=ENV, init=False)

        # 3. The chain node stops for longer than the watchdog, then comes back.
        net.kill_sealer()
        stalled_at = net.head()
        time.sleep(6)
        assert net.head() == stalled_at
        net.start_sealer()

        # 4. The PostgreSQL server under node b restarts: sessions cut, connections refused for 4 s.
        pg_restart(admin, 4)

        assert dead.opened.wait(60), "the miner never saw its second challenge"
        for ch in (ok, dead):
            net.wait_resolved(ch.challenge_id, 300)
        time.sleep(1.5)  # let both nodes ingest the resolution blocks
        assert node_b.poll() is None, "node b died:\n" + net.log("b")[-3000:]
        assert net.nodes["a"].poll() is None, "node a died:\n" + net.log("a")[-3000:]

        # The faults happened as intended.
        ranges = [r for r in net.prover.requests if r["run_id"] == RUN_OK and r["range"]]
        assert ranges, "the restarted node did not resume its partial download"
        assert _log_has(net, "b", '"chain_reconnect"'), "the stalled chain did not trip the watchdog"
        assert _log_has(net, "b", '"loop_error"') and "OperationalError" in net.log("b"), \
            "node b never saw its database go away"

        view = net.view()
        res = {e.challenge_id: e for e in view.of(P.ChallengeResolved)}
        assert (
            res[ok.challenge_id].verdict == "honest"
            and res[ok.challenge_id].cluster_size == PARAMS.committee_size
        )
        dead_ch = view.state.challenges[dead.challenge_id]
        refused = refused_value_hash(dead.challenge_id)
        for name in ("a", "b"):
            # The hanging prover: each node took part with the refused pair, not silence; the
            # round gives the miner a second opening window (a re-challenge).
            assert tuple(dead_ch.reveals[name]) == (refused, REFUSED_BUCKET, refused)
            assert name in view.state.challenges[ok.challenge_id].reveals
        assert (
            res[dead.challenge_id].verdict == "inconclusive"
            and res[dead.challenge_id].rechallenge is not None
        )

        for name in ("a", "b"):
            mine = [(n, c) for n, _, c in chain_calls(net, name)]
            for ch in (ok, dead):
                commits = {encode_call(c) for _, c in mine if isinstance(c, CommitWitness)
                           and c.challenge_id == ch.challenge_id}
                reveals = {(n, encode_call(c)) for n, c in mine if isinstance(c, RevealWitnessValue)
                           and c.challenge_id == ch.challenge_id}
                assert len(commits) == 1, f"{name} committed {len(commits)} different values"
                assert len({p for _, p in reveals}) == 1, f"{name} revealed different values"
                state = view.state.challenges[ch.challenge_id]
                assert all(n <= state.reveal_deadline for n, _ in reveals)
            engine = open_database(pg_url if name == "b" else f"sqlite:///{tmp_path / 'a-data' / 'node.db'}")
            first_rounds = [ok.challenge_id, dead.challenge_id]
            with engine.connect() as c:
                jobs = {bytes(r.challenge_id): r for r in c.execute(sa.select(challenges))}
                tx_states = {(bytes(r.challenge_id), r.kind): r.state for r in c.execute(
                    sa.select(txs).where(txs.c.challenge_id.in_(first_rounds)))}
            engine.dispose()
            assert jobs[ok.challenge_id].stage == jobs[dead.challenge_id].stage == "done", name
            assert jobs[ok.challenge_id].in_winning_cluster is True, name
            assert jobs[dead.challenge_id].refusal_class == "unavailable", name
            assert jobs[dead.challenge_id].status.startswith("re-challenged as "), name
            assert set(tx_states.values()) == {"confirmed"} and len(tx_states) == 4, (name, tx_states)
    finally:
        net.close()


def test_a_loop_error_is_logged_with_its_traceback_not_raised():
    # The daemon logs every loop error with exc_info; that must never raise out of its handler.
    import io
    import json
    import logging

    from node.logs import log_event, setup_logging

    buf = io.StringIO()
    setup_logging("info", buf)
    try:
        raise ConnectionError("the database went away")
    except ConnectionError:
        log_event(
            logging.getLogger("node.daemon"), "loop_error", level=logging.ERROR, error="x", exc_info=True
        )
    line = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert line["event"] == "loop_error" and "the database went away" in line["exc"]
