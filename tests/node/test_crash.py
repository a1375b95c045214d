"""Crash safety: verifier processes SIGKILLed at every stage of a challenge restart and still
reveal inside the window; no verifier ever puts two different commitments or reveals on chain.

Four nodes share one live dev chain, each killed (a real SIGKILL, raised by the node itself right
after the named point became durable) at a different point; two keep their journal in SQLite, two
in PostgreSQL. Two such networks cover the eight points.
"""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

from chain import protocol as P
from chain.calls import CommitWitness, RevealWitnessValue, encode_call
from chain.protocol import ProtocolParams
from node.db import challenges, open_database, txs
from node.hooks import KILL_POINTS
from tests.node.conftest import PG_ADMIN_URL
from tests.node.harness import Network, chain_calls

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

POINTS = list(KILL_POINTS)
GROUPS = [POINTS[:4], POINTS[4:]]
# Generous windows: a loaded CI machine runs four nodes, their replays and restarts at once.
PARAMS = ProtocolParams(commit_window=200, reveal_window=60, opening_deadline=10, challenge_delay=2,
                        quorum_min_reveals=4, challenges_per_run=1, committee_size=5, forced_challenge_steps=(7,))


@pytest.fixture
def pg_urls():
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    names = [f"pot_node_crash_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    with admin.connect() as c:
        for n in names:
            c.execute(sa.text(f'CREATE DATABASE "{n}"'))
    yield [f"postgresql+psycopg2://postgres@127.0.0.1:5432/{n}" for n in names]
    with admin.connect() as c:
        for n in names:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)'))
    admin.dispose()


@pytest.mark.parametrize("points", GROUPS, ids=["-".join(g) for g in GROUPS])
def test_sigkill_at_every_stage_then_restart(tmp_path, pg_urls, points):
    net = Network(tmp_path, PARAMS, interval=0.5)
    names = [f"k{i}" for i in range(len(points))]
    db_urls = {n: (pg_urls[i // 2] if i % 2 else "") for i, n in enumerate(names)}
    configs = {}
    try:
        for name, point in zip(names, points, strict=True):
            configs[name] = net.node_config(name, db_url=db_urls[name])
            net.start_node(name, configs[name], kill_at=point)
        run = net.start_run(steps=8)
        killed: dict[str, int] = {}
        deadline = time.monotonic() + 500
        resolved = None
        while time.monotonic() < deadline:
            for name in names:
                proc = net.nodes[name]
                rc = proc.poll()
                if rc is None:
                    continue
                assert rc == -9, f"{name} exited with {rc}:\n{net.log(name)[-3000:]}"
                assert name not in killed, f"{name} was killed twice"
                killed[name] = rc
                net.start_node(name, configs[name], init=False)  # the real node, with no fault hooks
            if run.challenge_id is not None:
                ch = net.view().state.challenges.get(run.challenge_id)
                if ch is not None and ch.verdict is not None:
                    resolved = ch
                    break
            time.sleep(0.3)
        assert resolved is not None, "the challenge did not resolve in time"
        assert sorted(killed) == sorted(names), f"never reached their kill point: {set(names) - set(killed)}"

        view = net.view()
        res = [e for e in view.of(P.ChallengeResolved) if e.challenge_id == run.challenge_id][0]
        assert res.verdict == "honest" and res.cluster_size == len(names) and res.outliers == ()
        revealed = {e.verifier for e in view.of(P.WitnessRevealed) if e.challenge_id == run.challenge_id}
        assert revealed == set(names)
        for name in names:
            calls = [c for _, _, c in chain_calls(net, name)]
            commits = {encode_call(c) for c in calls if isinstance(c, CommitWitness)}
            reveals = {encode_call(c) for c in calls if isinstance(c, RevealWitnessValue)}
            assert len(commits) == 1 and len(reveals) == 1, f"{name} sent different content"
            engine = open_database(db_urls[name] or f"sqlite:///{tmp_path / f'{name}-data' / 'node.db'}")
            # Each node ingests the resolution block on its own next poll, a moment after the chain
            # has it: wait (bounded) for the node to record it, then check what it recorded.
            settle = time.monotonic() + 30
            while True:
                with engine.connect() as c:
                    job = c.execute(sa.select(challenges)).one()
                    states = {r.kind: r for r in c.execute(sa.select(txs))}
                if job.verdict is not None or time.monotonic() > settle:
                    break
                time.sleep(0.2)
            engine.dispose()
            assert job.in_winning_cluster is True and job.verdict == "honest", name
            assert states["commit"].payload in commits and states["reveal"].payload in reveals
            assert states["commit"].state == states["reveal"].state == "confirmed", name
    finally:
        net.close()
