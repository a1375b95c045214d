"""Protocol v3 in the daemon, in one process on a dev chain sealed by the test: a node whose revealed
value half differs from the value its round would resolve to escalates the round once, from a
journaled escalate_challenge call; the dispute round settles it (its stake returned, the wrong seats
penalised) and the node records the escalation, its settlement and the fees of a winning seat with
its stake. Without the free bond for escalation_stake it logs escalation_unaffordable instead, and
with `[verifier] escalate = false` it does nothing."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from chain import protocol as P
from chain.calls import EscalateChallenge
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from commitments.hashing import digest
from devnet.node_faults import LAZY_PROOF_DOMAIN
from node import journal, stake
from node.api import create_app
from node.db import challenges, stake_events
from node.stages import Stage
from tests.chain.runs import SyntheticRun, bond, witness
from tests.node.harness import in_process_node

# Every seat unit sits on a first round (committee_size >= the units), so who sits is fixed; a node
# bonded 150 holds one seat unit and keeps 50 free: exactly escalation_stake.
PARAMS = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=4, challenge_delay=2, challenges_per_run=1,
                        quorum_min_reveals=2, committee_size=5, forced_challenge_steps=(3,), escalation_stake=50,
                        escalation_window=2)
WRONG = digest("pot/test/wrong-value/v1", b"x")  # the value half the colluding pair reveals


@pytest.fixture
def chain(tmp_path):
    path = tmp_path / "c.db"
    miner = DevTransport(path, "miner", sealing="interval")  # blocks only when the test seals them
    miner.record_params(PARAMS)
    return path, miner


def _node(tmp_path, path, *, bond_amount: int, escalate: bool = True):
    """The lazy node v1 (it reveals the public H(leaf t) without fetching): here the one seat whose
    value half is right, against two seats that agree on a wrong one."""
    d = tmp_path / "n"
    d.mkdir(exist_ok=True)
    return in_process_node(d, path, f'[node]\ndata_dir = "{d}/data"\n'
                                    f"[verifier]\nbond = {bond_amount}\nescalate = {str(escalate).lower()}\n",
                           fault="lazy")


def _seal(miner, node, n: int = 1) -> None:
    for _ in range(n):
        miner.seal()
        node.step_once()


def _job(engine, cid: bytes):
    with engine.connect() as c:
        return c.execute(sa.select(challenges).where(challenges.c.challenge_id == cid)).one()


def _calls(path, origin: str) -> list:
    t = DevTransport(path, "observer")
    return [c for n in range(1, t.finalized_head() + 1) for o, c in t.block(n).calls if o == origin]


class _Driver:
    """The daemon's pass without its threads: ingest, bond, escalate, the witness stage, then the
    sender's pass, as `step` and the sender loop do."""

    def __init__(self, node) -> None:
        self.node = node

    def step_once(self) -> None:
        n = self.node
        n.ingest()
        n.ensure_bond()
        n.escalate()
        n.schedule()
        n.send_txs(n.transport, n.transport.finalized_head())


def _round_one(tmp_path, chain, *, bond_amount: int, escalate: bool = True):
    """Register a run, seat v1 (the node), v2 and v3 on its challenge, open it; v2 and v3 commit and
    reveal WRONG while v1 reveals H(leaf t): sealed up to the block after the reveal deadline."""
    path, miner = chain
    node, engine = _node(tmp_path, path, bond_amount=bond_amount, escalate=escalate)
    node.start()
    driver = _Driver(node)
    node.step_once = driver.step_once  # type: ignore[attr-defined]
    node.step_once()
    others = {v: DevTransport(path, v) for v in ("v2", "v3")}
    for t in others.values():
        t.submit([bond(100)], wait=False)
    _seal(miner, node)
    assert node.view.state.vbonds["v1"] == bond_amount
    run = SyntheticRun(steps=4)
    miner.submit([run.register(), run.submit_full_root()], wait=False)
    while not [c for c in node.view.state.challenges.values() if c.run_id == run.run_id]:
        _seal(miner, node)
    ch = next(c for c in node.view.state.challenges.values() if c.run_id == run.run_id)
    assert sorted(ch.committee) == ["v1", "v2", "v3"]
    assert _job(engine, ch.challenge_id).escalate_deadline == ch.escalate_deadline == ch.reveal_deadline + 2
    miner.submit([run.opening(ch.challenge_id, ch.step)], wait=False)
    _seal(miner, node)
    pairs = {v: witness(ch.challenge_id, v, WRONG) for v in others}
    for v, t in others.items():
        t.submit([pairs[v][0]], wait=False)
    while node.view.cursor < ch.commit_deadline:
        _seal(miner, node)
    assert set(ch.commitments) == {"v1", "v2", "v3"}
    for v, t in others.items():
        t.submit([pairs[v][1]], wait=False)
    while node.view.cursor < ch.reveal_deadline:
        _seal(miner, node)
    assert set(ch.reveals) == {"v1", "v2", "v3"} and _job(engine, ch.challenge_id).stage == Stage.REVEALED
    result = P.round_result(node.view.state, ch.challenge_id)
    assert (result.verdict, result.winning_value) == ("fraud", WRONG)  # v1's H(leaf t) is outvoted
    return node, engine, run, ch


def test_a_dissenting_seat_escalates_once_and_the_dispute_round_returns_its_stake(tmp_path, chain, caplog):
    path, miner = chain
    caplog.set_level(logging.INFO, logger="node.daemon")
    node, engine, run, ch = _round_one(tmp_path, chain, bond_amount=150)
    cid = ch.challenge_id
    # The block after the reveal deadline: the node has journaled its escalation and sent it.
    tx = journal.get_tx(engine, cid, "v1", "escalate")
    assert tx is not None and tx.payload[:4] == b"pot1" and tx.state == "unconfirmed"
    assert _job(engine, cid).escalation == "journaled"
    node.escalate()  # once: a second pass journals nothing more
    _seal(miner, node)
    assert node.view.state.challenges[cid].escalations == {"v1": ["fraud", 50]}
    assert _calls(path, "v1").count(EscalateChallenge(cid)) == 1
    assert journal.get_tx(engine, cid, "v1", "escalate").state == "confirmed"
    assert _job(engine, cid).escalation == "escalated"
    mine = [r for r in caplog.records if getattr(r, "event", None) == "challenge_escalated"]
    assert [(r.verifier, r.stake, r.disputes, r.ours) for r in mine] == [("v1", 50, "fraud", True)]
    with engine.connect() as c:
        st = stake.stake_status(c, "v1")
    assert (st["bond"], st["reserved"], st["free"], st["escalated_total"]) == (150, 150, 0, 50)
    assert st["eligible"] is False  # nothing free for a seat until the dispute settles the round

    # Two more accounts bond and sit on the dispute round; they reveal the pair v1 does, H(leaf t)
    # with its proof hash (a dispute round judges the value half: the miner's).
    honest = {v: DevTransport(path, v) for v in ("v4", "v5")}
    for t in honest.values():
        t.submit([bond(100)], wait=False)
    while node.view.state.challenges[cid].verdict is None:
        _seal(miner, node)
    first = node.view.state.challenges[cid]
    dispute = node.view.state.challenges[first.rechallenge]
    assert first.verdict == "inconclusive" and first.pending and dispute.dispute
    assert {"v4", "v5"} <= set(dispute.committee) and dispute.escalated == cid
    job = _job(engine, cid)
    assert job.status == f"escalated to the dispute round as {first.rechallenge.hex()[:16]} (round {dispute.round})"
    miner.submit([run.opening(dispute.challenge_id, ch.step)], wait=False)
    _seal(miner, node)
    made_up = digest(LAZY_PROOF_DOMAIN, dispute.challenge_id, "v1")
    pairs = {v: witness(dispute.challenge_id, v, run.value_hash(ch.step), proof_hash=made_up) for v in honest}
    for v, t in honest.items():
        t.submit([pairs[v][0]], wait=False)
    while node.view.cursor < dispute.commit_deadline:
        _seal(miner, node)
    for v, t in honest.items():
        t.submit([pairs[v][1]], wait=False)
    while dispute.verdict is None:
        _seal(miner, node)
    assert dispute.verdict == "honest"

    # v1 was right: its stake comes back, the two wrong seats of the escalated round pay
    # outlier_penalty, and the dispute's winning seats are paid their fees.
    job = _job(engine, cid)
    assert job.escalation == "returned" and job.penalty is None
    with engine.connect() as c:
        st = stake.stake_status(c, "v1")
        rows = [(r.name, r.amount, r.why) for r in c.execute(
            sa.select(stake_events).where(stake_events.c.verifier == "v1",
                                          stake_events.c.name.in_(("ChallengeEscalated", "EscalationSettled")))
            .order_by(stake_events.c.id))]
    assert rows == [("ChallengeEscalated", 50, None), ("EscalationSettled", 50, "returned")]
    assert (st["reserved"], st["forfeited_total"], st["penalised_total"]) == (0, 0, 0)
    assert st["bond"] == st["free"] == 150 + st["paid_total"] == node.view.state.vbonds["v1"]
    events = _events(path)
    wrong = [(e.verifier, e.amount) for e in events if isinstance(e, P.VerifierPenalized) and e.challenge_id == cid]
    assert sorted(wrong) == [("v2", PARAMS.outlier_penalty), ("v3", PARAMS.outlier_penalty)]
    paid = [e for e in events if isinstance(e, P.VerifierPaid) and e.challenge_id == dispute.challenge_id]
    assert {"v4", "v5"} <= {e.verifier for e in paid if e.why == "seat_fee"}
    node.shutdown()
    engine.dispose()


HIGH_STAKE = dataclasses.replace(PARAMS, escalation_stake=60)


def test_a_seat_that_cannot_cover_the_escalation_stake_logs_it_and_sends_nothing(tmp_path, caplog):
    path = tmp_path / "c.db"
    miner = DevTransport(path, "miner", sealing="interval")
    miner.record_params(HIGH_STAKE)
    chain = (path, miner)
    caplog.set_level(logging.INFO, logger="node.daemon")
    # its one unit is its seat: the room is 100 - 50 (the seat's most penalty) = 50, short of 60
    node, engine, _run, ch = _round_one(tmp_path, chain, bond_amount=100)
    cid = ch.challenge_id
    assert journal.get_tx(engine, cid, "v1", "escalate") is None and _job(engine, cid).escalation == "unaffordable"
    (warn,) = [r for r in caplog.records if getattr(r, "event", None) == "escalation_unaffordable"]
    assert warn.levelno == logging.WARNING and warn.challenge_id == cid.hex()
    assert (warn.escalation_stake, warn.escalation_room, warn.bond, warn.reserved) == (60, 50, 100, 100)
    node.escalate()
    assert len([r for r in caplog.records if getattr(r, "event", None) == "escalation_unaffordable"]) == 1
    while node.view.state.challenges[cid].verdict is None:
        _seal(miner, node)
    assert node.view.state.challenges[cid].verdict == "fraud" and EscalateChallenge(cid) not in _calls(path, "v1")
    # v1 sat in the losing cluster: penalised as an outlier; the winning seats were paid.
    job = _job(engine, cid)
    assert (job.verdict, job.outlier, job.penalty, job.penalty_why, job.escalation) == (
        "fraud", True, PARAMS.outlier_penalty, "outlier", "unaffordable")
    with TestClient(create_app(engine, node.cfg), base_url="http://127.0.0.1:8700") as client:
        st = client.get("/api/v1/stake").json()
        assert (st["bond"], st["reserved"], st["free"], st["paid_total"]) == (
            100 - PARAMS.outlier_penalty, 0, 100 - PARAMS.outlier_penalty, 0)
        assert st["escalation_stake"] == 60 and st["payments"] == []
        detail = client.get(f"/api/v1/challenges/{cid.hex()}").json()
        assert detail["escalation"] == "unaffordable" and detail["deadlines"]["escalate"] == ch.escalate_deadline
        metrics = client.get("/metrics").text
        assert 'pot_fees_paid_total{why="seat_fee"} 0.0' in metrics and "pot_verifier_reserved 0.0" in metrics
    paid = {e.verifier: e.amount for e in _events(path) if isinstance(e, P.VerifierPaid) and e.why == "seat_fee"}
    assert set(paid) == {"v2", "v3"}
    node.shutdown()
    engine.dispose()


def test_escalate_false_never_escalates(tmp_path, chain, caplog):
    path, miner = chain
    caplog.set_level(logging.INFO, logger="node.daemon")
    node, engine, _run, ch = _round_one(tmp_path, chain, bond_amount=150, escalate=False)
    while node.view.state.challenges[ch.challenge_id].verdict is None:
        _seal(miner, node)
    assert journal.get_tx(engine, ch.challenge_id, "v1", "escalate") is None
    assert _job(engine, ch.challenge_id).escalation is None and _calls(path, "v1").count(EscalateChallenge(
        ch.challenge_id)) == 0
    assert not [r for r in caplog.records if str(getattr(r, "event", "")).startswith("escalation")]
    node.shutdown()
    engine.dispose()


def test_a_winning_seat_is_paid_and_the_stake_panel_shows_it(tmp_path, chain):
    """The node's fee of a round it won: VerifierPaid recorded in stake_events, in /api/v1/stake,
    on the dashboard and in pot_fees_paid_total; while the round is open its seat's collateral
    shows as reserved."""
    path, miner = chain
    node, engine = _node(tmp_path, path, bond_amount=100)
    node.start()
    node.step_once = _Driver(node).step_once  # type: ignore[attr-defined]
    node.step_once()
    others = {v: DevTransport(path, v) for v in ("v2", "v3")}
    for t in others.values():
        t.submit([bond(100)], wait=False)
    _seal(miner, node)
    run = SyntheticRun(steps=4)
    miner.submit([run.register(), run.submit_full_root()], wait=False)
    while not [c for c in node.view.state.challenges.values() if c.run_id == run.run_id]:
        _seal(miner, node)
    ch = next(c for c in node.view.state.challenges.values() if c.run_id == run.run_id)
    with engine.connect() as c:
        st = stake.stake_status(c, "v1")
    assert (st["reserved"], st["free"], st["eligible"]) == (PARAMS.verifier_stake, 0, False)  # its seat's collateral
    miner.submit([run.opening(ch.challenge_id, ch.step)], wait=False)
    _seal(miner, node)
    # v2 and v3 reveal the very pair the lazy v1 does (H(leaf t), its made-up proof hash): one
    # cluster of three seats, whose value half is H(leaf t): honest, and every seat is paid.
    made_up = digest(LAZY_PROOF_DOMAIN, ch.challenge_id, "v1")
    pairs = {v: witness(ch.challenge_id, v, run.value_hash(ch.step), proof_hash=made_up) for v in others}
    for v, t in others.items():
        t.submit([pairs[v][0]], wait=False)
    while node.view.cursor < ch.commit_deadline:
        _seal(miner, node)
    for v, t in others.items():
        t.submit([pairs[v][1]], wait=False)
    while ch.verdict is None:
        _seal(miner, node)
    assert ch.verdict == "honest"
    assert journal.get_tx(engine, ch.challenge_id, "v1", "escalate") is None  # nothing to dissent from
    fee = node.view.state.runs[run.run_id].seat_fee
    assert fee > 0 and node.view.state.paid["v1"] == fee
    with engine.connect() as c:
        rows = [(r.name, r.amount, r.why, bytes(r.challenge_id) if r.challenge_id else None) for r in c.execute(
            sa.select(stake_events).where(stake_events.c.name == "VerifierPaid"))]
    assert rows == [("VerifierPaid", fee, "seat_fee", ch.challenge_id)]
    with TestClient(create_app(engine, node.cfg), base_url="http://127.0.0.1:8700") as client:
        st = client.get("/api/v1/stake").json()
        assert (st["bond"], st["reserved"], st["free"], st["eligible"]) == (100 + fee, 0, 100 + fee, True)
        assert (st["paid_total"], st["paid_by_why"]) == (fee, {"seat_fee": fee, "slash_share": 0, "dispute_pool": 0})
        assert st["payments"] == [{"block": ch.escalate_deadline + 1, "challenge_id": ch.challenge_id.hex(),
                                   "amount": fee, "why": "seat_fee"}]
        assert client.get("/api/v1/status").json()["stake"]["paid_total"] == fee
        page = client.get("/").text
        assert 'id="stake-paid"' in page and f'data-payment="{ch.challenge_id.hex()}"' in page
        assert f'pot_fees_paid_total{{why="seat_fee"}} {float(fee)}' in client.get("/metrics").text
    node.shutdown()
    engine.dispose()


def _events(path) -> list[P.Event]:
    from chain.view import ChainView

    v = ChainView(DevTransport(path, "observer"), PARAMS)
    v.sync()
    return v.events
