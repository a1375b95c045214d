"""Protocol v2 in the daemon, in one process on a dev chain sealed by the test: the node bonds once
(across a restart while its bond call is pending), skips a challenge whose committee it is not on,
records a no-show penalty and a re-challenge, and the lazy fault commits the public H(leaf t) with
a made-up proof hash that opens its commitment, ends an outlier and is penalised."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from chain import protocol as P
from chain.calls import BondVerifier
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from challenges.witness import verify_witness
from commitments.hashing import digest
from devnet.node_faults import LAZY_PROOF_DOMAIN
from node import journal, stake
from node.api import create_app
from node.daemon import BOND_RESEND_FACTOR
from node.db import challenges, stake_events
from node.stages import Stage
from tests.chain.runs import SyntheticRun, bond, witness
from tests.node.harness import in_process_node

PARAMS = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=4, challenge_delay=2, challenges_per_run=1,
                        quorum_min_reveals=2, committee_size=5, forced_challenge_steps=(3,))


@pytest.fixture
def chain(tmp_path):
    path = tmp_path / "c.db"
    miner = DevTransport(path, "miner", sealing="interval")  # blocks only when the test seals them
    miner.record_params(PARAMS)
    return path, miner


def _node(tmp_path, path, toml: str = "", name: str = "n", node: str = "", fault: str = "none"):
    """Account v1 on the chain at `path`; `node` adds [node] keys, `toml` further sections, `fault`
    a test fault (devnet/node_faults.py)."""
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return in_process_node(d, path, f'[node]\ndata_dir = "{d}/data"\n{node}\n{toml}', fault=fault)


def _calls(path, origin: str) -> list:
    t = DevTransport(path, "observer")
    return [c for n in range(1, t.finalized_head() + 1) for o, c in t.block(n).calls if o == origin]


def _seal(miner, node=None, n: int = 1) -> None:
    for _ in range(n):
        miner.seal()
    if node is not None:
        node.ingest()


def _job(engine, cid: bytes):
    with engine.connect() as c:
        return c.execute(sa.select(challenges).where(challenges.c.challenge_id == cid)).one()


def _issue(miner, node, run: SyntheticRun) -> P.ChallengeIssued:
    """Register the run, complete its root and seal until its challenge is issued."""
    miner.submit([run.register(), run.submit_full_root()], wait=False)
    for _ in range(PARAMS.challenge_delay + 3):
        _seal(miner, node)
        issued = [e for e in node.view.state.challenges.values() if e.run_id == run.run_id]
        if issued:
            return issued[0]
    raise AssertionError("no challenge was issued")


def test_the_node_bonds_once_across_a_restart_while_its_bond_is_pending(tmp_path, chain):
    path, miner = chain
    node, engine = _node(tmp_path, path)
    node.start()
    node.ingest()
    node.ensure_bond()  # sent: the chain has not sealed it yet
    with engine.connect() as c:
        pending = stake.pending_bond(c)
    assert pending is not None and (pending.account, pending.amount, pending.target) == ("v1", 100, 100)
    assert pending.tx_hash is not None
    node.shutdown()

    again, _ = _node(tmp_path, path)  # a restart before the bond reached a block
    again.start()
    again.ingest()
    again.ensure_bond()
    again.ensure_bond()
    _seal(miner, again)
    again._bond_due = True  # as after a reconnect
    again.ensure_bond()
    assert [c for c in _calls(path, "v1")] == [BondVerifier(100)]
    assert again.view.state.vbonds["v1"] == 100
    with engine.connect() as c:
        assert stake.pending_bond(c) is None
        rows = c.execute(sa.select(stake_events)).all()
        st = stake.stake_status(c, "v1")
    assert [(r.name, r.amount, r.bond) for r in rows] == [("VerifierBonded", 100, 100)]
    assert (st["bond"], st["eligible"], st["bonded_total"]) == (100, True, 100)
    again.shutdown()
    engine.dispose()


def test_a_pending_bond_is_sent_again_after_its_window(tmp_path, chain):
    path, miner = chain
    node, engine = _node(tmp_path, path)
    node.start()
    node.ingest()
    with engine.begin() as c:  # a bond call journaled, then lost (never reached the chain)
        stake.record_bond(c, account="v1", amount=100, target=100, head=node.head)
    node.ensure_bond()
    assert _calls(path, "v1") == []
    _seal(miner, node, BOND_RESEND_FACTOR * node.cfg.chain.resend_after_blocks)
    node.ensure_bond()
    _seal(miner, node)
    assert _calls(path, "v1") == [BondVerifier(100)] and node.view.state.vbonds["v1"] == 100
    node.shutdown()
    engine.dispose()


def test_bond_zero_never_bonds_and_a_top_up_pays_the_difference(tmp_path, chain):
    path, miner = chain
    off, engine = _node(tmp_path, path, "[verifier]\nbond = 0\n", name="off")
    off.start()
    off.ingest()
    off.ensure_bond()
    assert off._bond_due is False
    off.shutdown()
    engine.dispose()
    DevTransport(path, "v1").submit([BondVerifier(100)], wait=False)  # a first bond is at least verifier_stake
    _seal(miner)
    node, engine = _node(tmp_path, path, "[verifier]\nbond = 230\n")
    node.start()
    node.ingest()
    node.ensure_bond()
    _seal(miner, node)
    assert _calls(path, "v1") == [BondVerifier(100), BondVerifier(130)] and node.view.state.vbonds["v1"] == 230
    node.shutdown()
    engine.dispose()


def test_no_show_penalty_and_re_challenge_then_a_committee_without_this_node(tmp_path, chain):
    """v1 sits on the first round and never commits (its pipeline is not run here): the round has
    no reveals, so it re-challenges; the chain takes the no-show penalty, which leaves v1 below the
    verifier stake, so the second round's committee is drawn without it and its job is skipped."""
    path, miner = chain
    node, engine = _node(tmp_path, path)
    node.start()
    node.ingest()
    node.ensure_bond()
    for v in ("v2", "v3"):  # bonded well above the stake: a no-show penalty leaves them eligible
        DevTransport(path, v).submit([bond(200)], wait=False)
    _seal(miner, node)
    run = SyntheticRun(steps=4)
    ch = _issue(miner, node, run)
    assert set(ch.committee) == {"v1", "v2", "v3"}
    first = _job(engine, ch.challenge_id)
    assert (first.stage, first.round, first.on_committee) == (Stage.AWAITING_OPENING, 1, True)
    assert json.loads(first.committee) == ch.committee
    miner.submit([run.opening(ch.challenge_id, ch.step)], wait=False)
    _seal(miner, node)
    assert _job(engine, ch.challenge_id).stage == Stage.FETCH
    while node.view.state.challenges[ch.challenge_id].verdict is None:
        _seal(miner, node)
    res = [e for e in node.view.state.challenges.values() if e.challenge_id == ch.challenge_id][0]
    again_id = res.rechallenge
    assert again_id is not None

    job = _job(engine, ch.challenge_id)
    assert job.verdict == "inconclusive" and job.status == f"re-challenged as {again_id.hex()[:16]} (round 2)"
    assert bytes(job.rechallenge) == again_id and (job.penalty, job.penalty_why) == (PARAMS.no_show_penalty, "no_commit")
    second = _job(engine, again_id)
    assert second.stage == Stage.SKIPPED and second.status == "not on this challenge's committee (round 2)"
    assert (second.round, bytes(second.first_id), second.on_committee) == (2, ch.challenge_id, False)
    assert sorted(json.loads(second.committee)) == ["v2", "v3"]
    with engine.connect() as c:
        st = stake.stake_status(c, "v1")
    assert (st["bond"], st["eligible"], st["penalised_total"]) == (100 - PARAMS.no_show_penalty, False,
                                                                   PARAMS.no_show_penalty)
    assert st["penalties"][0]["challenge_id"] == ch.challenge_id.hex() and st["penalties"][0]["why"] == "no_commit"
    # A node not on the committee neither fetches, replays nor commits for it.
    node.schedule()
    assert again_id not in node.tasks and journal.get_tx(engine, again_id, "v1", "commit") is None
    node.shutdown()
    engine.dispose()


def test_the_lazy_fault_reveals_the_public_value_with_a_wrong_proof_and_is_penalised(tmp_path, chain):
    path, miner = chain
    lazy, engine = _node(tmp_path, path, fault="lazy")
    lazy.start()
    lazy.ingest()
    lazy.ensure_bond()
    honest = {v: DevTransport(path, v) for v in ("v2", "v3")}
    for t in honest.values():
        t.submit([bond(100)], wait=False)
    _seal(miner, lazy)
    run = SyntheticRun(steps=4)
    ch = _issue(miner, lazy, run)
    cid = ch.challenge_id
    miner.submit([run.opening(cid, ch.step)], wait=False)
    _seal(miner, lazy)
    job = _job(engine, cid)
    assert job.stage == Stage.WITNESS, "a lazy node skips fetch, validation and replay"
    lazy.schedule()  # journals the pair
    job = _job(engine, cid)
    made_up = digest(LAZY_PROOF_DOMAIN, cid, "v1")
    assert (job.stage, bytes(job.value_hash), bytes(job.proof_hash), job.fault) == (
        Stage.COMMIT, run.value_hash(ch.step), made_up, "lazy")
    pairs = {v: witness(cid, v, run.value_hash(ch.step)) for v in honest}
    for v, t in honest.items():
        t.submit([pairs[v][0]], wait=False)
    lazy.send_txs(lazy.transport, lazy.transport.finalized_head())
    _seal(miner, lazy)
    state = lazy.view.state.challenges[cid]
    assert set(state.commitments) == {"v1", "v2", "v3"}
    while lazy.head <= state.commit_deadline:
        _seal(miner, lazy)
    for v, t in honest.items():
        t.submit([pairs[v][1]], wait=False)
    lazy.send_txs(lazy.transport, lazy.transport.finalized_head())
    _seal(miner, lazy)
    assert state.reveals["v1"] == [run.value_hash(ch.step), 0, made_up]
    # The revealed pair opens the journaled commitment.
    entry = journal.get_witness(engine, cid, "v1")
    assert verify_witness(state.commitments["v1"], cid, entry.value_hash, entry.norm_bucket, entry.salt, "v1",
                          proof_hash=entry.proof_hash)
    while state.verdict is None:
        _seal(miner, lazy)
    assert state.verdict == "honest"
    res = next(e for e in _events(path) if isinstance(e, P.ChallengeResolved) and e.challenge_id == cid)
    assert res.winning_value == run.value_hash(ch.step) and res.outliers == ("v1",)
    job = _job(engine, cid)
    assert (job.stage, job.in_winning_cluster, job.outlier) == (Stage.DONE, False, True)
    assert (job.penalty, job.penalty_why) == (PARAMS.outlier_penalty, "outlier")

    # The penalty in the API and the dashboard.
    with TestClient(create_app(engine, lazy.cfg), base_url="http://127.0.0.1:8700") as client:
        st = client.get("/api/v1/stake").json()
        assert st["account"] == "v1" and st["bond"] == 100 - PARAMS.outlier_penalty
        assert st["penalties"] == [{"block": res.block, "challenge_id": cid.hex(), "amount": PARAMS.outlier_penalty,
                                    "why": "outlier"}]
        d = client.get(f"/api/v1/challenges/{cid.hex()}").json()
        assert (d["penalty"], d["penalty_why"], d["outlier"], d["in_winning_cluster"]) == (
            PARAMS.outlier_penalty, "outlier", True, False)
        lazy_cluster = next(c for c in d["clusters"] if "v1" in c["verifiers"])
        assert lazy_cluster["matches_commitment"] and not lazy_cluster["winning"] and lazy_cluster["proof"] == made_up.hex()
        assert 'data-penalty="' + cid.hex() + '"' in client.get("/").text
    lazy.shutdown()
    engine.dispose()


def _events(path) -> list[P.Event]:
    from chain.view import ChainView

    v = ChainView(DevTransport(path, "observer"), PARAMS)
    v.sync()
    return v.events


def test_pot_node_unbond_starts_unbonding_and_the_stake_shows_its_release(tmp_path, chain):
    import threading

    from typer.testing import CliRunner

    from node.commands import node_app

    path, miner = chain
    node, engine = _node(tmp_path, path, "[verifier]\nbond = 140\n")  # an unbond leaves 0 or >= verifier_stake
    node.start()
    node.ingest()
    node.ensure_bond()
    _seal(miner, node)
    stop = threading.Event()

    def seal_every_tenth_second() -> None:  # the CLI waits for its block
        while not stop.wait(0.1):
            miner.seal()

    sealer = threading.Thread(target=seal_every_tenth_second, daemon=True)
    sealer.start()
    try:
        out = CliRunner().invoke(node_app, ["unbond", "--config", str(tmp_path / "n" / "n.toml"), "--amount", "40"])
    finally:
        stop.set()
        sealer.join(5)
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert (got["account"], got["amount"]) == ("v1", 40) and got["block"] is not None
    node.ingest()
    with engine.connect() as c:
        st = stake.stake_status(c, "v1")
    release = got["block"] + PARAMS.unbonding_delay
    assert (st["bond"], st["unbonding"], st["unbonding_total"]) == (100, [{"release_block": release, "amount": 40}], 40)
    while node.view.cursor < release:
        _seal(miner, node)
    with engine.connect() as c:
        st = stake.stake_status(c, "v1")
        names = [r.name for r in c.execute(sa.select(stake_events.c.name).order_by(stake_events.c.id))]
    assert st["unbonding"] == [] and st["released_total"] == 40
    assert names == ["VerifierBonded", "VerifierUnbonding", "BondReleased"]
    node.shutdown()
    engine.dispose()
