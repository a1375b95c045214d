"""Whole network, every participant its own process: a chain, one miner (`pot miner train`) and
three verifier nodes, bonded before the miner trains and all on the committee. An honest run is
verified while a node revealing noise ends an outlier, penalised from its bond; a run whose step 7
trained on another batch is caught, and its miner slashed. The chain is a real Substrate runtime
(chopsticks) carrying the calls as remarks, and the nodes' own rows are checked. (The same network
on the dev chain is `pot demo`'s, which tests/e2e/test_demo.py runs with a noisy and a lazy
verifier and a substituted batch, and tests/e2e/test_adversary_e2e.py with hostile miners.)
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from chain import protocol as P
from chain.protocol import ProtocolParams
from chain.protocol.events import VerifierPenalized
from node.db import challenges
from tests.e2e.cluster import TINY_GPT, Cluster
from tests.miner.helpers import corpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.chopsticks]

# Same parameters for everyone: the chain records them, the miner reads them from the chain, each
# node's [protocol] must equal them. chopsticks builds each block with the real runtime (seconds
# apiece on a loaded machine): windows leave room for that. One challenge per run (step 7); the
# committee seats every seat unit of every verifier (3 x 10: cluster.BOND / verifier_stake).
CHOPSTICKS_PARAMS = ProtocolParams(commit_window=30, reveal_window=12, opening_deadline=20, challenge_delay=2,
                                   challenges_per_run=1, committee_size=30, quorum_min_reveals=3,
                                   forced_challenge_steps=(7,))
VERIFIERS = ["v1", "v2", "v3"]
TRAIN_TIMEOUT = 900


@pytest.fixture
def cluster(tmp_path):
    from tests.chain.chopsticks_env import ChopsticksError, chopsticks_node

    try:
        node = chopsticks_node()
    except ChopsticksError as exc:
        pytest.fail(f"chopsticks could not start: {exc}", pytrace=False)
    c = Cluster(tmp_path, CHOPSTICKS_PARAMS, interval=1.0, chopsticks=node)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def material(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_GPT.format(steps=10))
    return spec, corpus(tmp_path)


def _rows(cluster: Cluster, name: str):
    eng = cluster.node_db(name)
    with eng.connect() as c:
        rows = c.execute(sa.select(challenges)).all()
    eng.dispose()
    return rows


def _alive(cluster: Cluster) -> None:
    for name in VERIFIERS:
        assert cluster.procs[name].poll() is None, f"{name} stopped:\n{cluster.err(name)[-3000:]}"


def test_honest_run_is_verified_and_a_noisy_verifier_is_an_outlier(cluster, material):
    spec, data = material
    cluster.start_verifier("v1")
    cluster.start_verifier("v2")
    cluster.start_verifier("v3", fault="noise")
    before = cluster.wait_bonded(VERIFIERS)
    rc, summary = cluster.train(spec, data, steps_timeout=TRAIN_TIMEOUT)
    _alive(cluster)
    assert rc == 0, cluster.err("miner")[-3000:]
    assert list(summary["verdicts"].values()) == ["honest"], summary
    cid = bytes.fromhex(next(iter(summary["verdicts"])))

    view = cluster.view()
    (issued,) = [e for e in view.of(P.ChallengeIssued) if e.challenge_id == cid]
    assert set(issued.committee) == {cluster.account(n) for n in VERIFIERS}
    (res,) = [e for e in view.of(P.ChallengeResolved) if e.challenge_id == cid]
    seats = {n: issued.committee.count(cluster.account(n)) for n in VERIFIERS}  # one per verifier_stake of bond
    assert (res.step, res.verdict, res.cluster_size, res.reveals, res.rechallenge) == (
        7, "honest", seats["v1"] + seats["v2"], 3, None)
    assert res.outliers == (cluster.account("v3"),)
    assert [e.verifier for e in view.of(P.VerifierOutlier)] == [cluster.account("v3")]
    assert [(e.verifier, e.why) for e in view.of(VerifierPenalized)] == [(cluster.account("v3"), "outlier")]
    penalty = cluster.params.outlier_penalty * seats["v3"]  # a penalty per seat
    paid = {n: sum(e.amount for e in view.of(P.VerifierPaid) if e.verifier == cluster.account(n)) for n in VERIFIERS}
    run = next(iter(view.state.runs.values()))
    assert paid == {"v1": run.seat_fee * seats["v1"], "v2": run.seat_fee * seats["v2"], "v3": 0}  # the winning seats
    assert {n: view.state.vbonds[cluster.account(n)] for n in VERIFIERS} == {
        "v1": before["v1"] + paid["v1"], "v2": before["v2"] + paid["v2"], "v3": before["v3"] - penalty}
    assert view.of(P.MinerSlashed) == []

    cluster.wait_ingested(VERIFIERS, cid)
    for name in ("v1", "v2"):
        (job,) = _rows(cluster, name)
        assert (job.verdict, job.in_winning_cluster, job.outlier, job.matches_leaf) == ("honest", True, False, True)
    (noisy,) = _rows(cluster, "v3")
    assert (noisy.verdict, noisy.in_winning_cluster, noisy.outlier, noisy.fault) == ("honest", False, True, "noise")


def test_substituted_batch_at_step_7_is_caught_and_slashed(cluster, material):
    spec, data = material
    for name in VERIFIERS:
        cluster.start_verifier(name)
    cluster.wait_bonded(VERIFIERS)
    rc, summary = cluster.train(spec, data, steps_timeout=TRAIN_TIMEOUT, substitute_at=7)
    _alive(cluster)
    assert rc == 1, cluster.err("miner")[-3000:]  # the miner exits 1 on a fraud verdict
    assert list(summary["verdicts"].values()) == ["fraud"], summary
    cid = bytes.fromhex(next(iter(summary["verdicts"])))

    view = cluster.view()
    (res,) = [e for e in view.of(P.ChallengeResolved) if e.challenge_id == cid]
    (issued,) = [e for e in view.of(P.ChallengeIssued) if e.challenge_id == cid]
    assert (res.step, res.verdict, res.cluster_size, res.outliers) == (7, "fraud", len(issued.committee), ())
    assert view.of(VerifierPenalized) == []  # every committee member committed, revealed and agreed
    (slash,) = view.of(P.MinerSlashed)
    miner = cluster.account("miner")
    assert slash.miner == miner and slash.amount == cluster.params.slash_amount
    assert view.state.slashed[miner] == cluster.params.slash_amount

    cluster.wait_ingested(VERIFIERS, cid)
    for name in VERIFIERS:
        (job,) = _rows(cluster, name)
        assert (job.verdict, job.in_winning_cluster, job.matches_leaf) == ("fraud", True, False)
        assert job.miner_slashed == cluster.params.slash_amount
        assert job.refusal_class is None  # the opening was valid; the replay disagreed with leaf 7
