"""Protocol v3's adversary rows for findings 2 and 5 (devnet/protocol_matrix.py:
row_half_served_dispute, row_lazy_majority_escalated) end to end, the dispute-round half of
test_adversary_v3_e2e.py (its docstring says what is real: here two forging miners, one after the
other, real honest nodes and the adversary's scripted accounts on one dev chain).

* `net_b` (four real honest nodes of equal bond, committees seating every unit, max_rounds 2 so the
  second round is the dispute round; two forging miners, one after the other):
  - finding 2, half-served dispute: the forger's prover sits behind a proxy that serves the opening
    to the first two downloads of each round and refuses every other, so exactly half the seats
    replay and half reveal the one refused value: a tie in round 1, re-challenged; fraud in the
    dispute round (a refusal counts against the miner), the miner slashed, no verifier pays.
  - finding 5, lazy majority escalated: two lazy adversary accounts share one made-up proof with
    the public H(leaf t) of the forged step and hold the majority of round 1's seats. Which seats a
    small committee gives them is the block hash's luck, which the matrix row chooses and this test
    cannot: here round 1 seats every unit bonded when it is drawn, the lazy accounts bond more than
    the four nodes, and the rest of the honest stake -- a fifth real node -- bonds after the draw
    and before the dispute round opens. Round 1 would pass the forged leaf; the honest nodes escalate
    (`[verifier] escalate`); the dispute round, which seats the whole stake, rules fraud; the lazy
    pay an outlier penalty a seat in both rounds; each escalator gets its stake back.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter

import pytest

from chain import protocol as P
from chain.calls import BondVerifier
from chain.protocol import ProtocolParams
from chain.view import ChainView
from commitments.hashing import digest
from devnet.procs import free_port
from tests.e2e.adversary import (
    FETCH,
    TRAIN_TIMEOUT,
    WINDOWS,
    Adversary,
    Witnesses,
    alive,
    books,
    penalties,
    rounds_of,
    run_id_of,
    until,
)
from tests.e2e.cluster import TINY_GPT, Cluster
from tests.miner.helpers import corpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# --- network B: two forging runs --------------------------------------------------------------

B_PARAMS = ProtocolParams(**WINDOWS, commit_window=60, challenges_per_run=1, committee_size=256, max_rounds=2,
                          escalation_stake=100, forced_challenge_steps=(4,))
B_NODES = ["v1", "v2", "v3", "v4"]
LATE = "v5"
LAZY = ["l0", "l1"]


class HalfProxy:
    """A TCP front for the forger's prover: in each round (`key`, set from the chain) the first
    `serve` downloads of an opening are relayed, every later one is closed at once; anything else
    (the leaf list) is relayed."""

    def __init__(self, target_port: int, serve: int) -> None:
        self.target, self.serve = target_port, serve
        self.key: bytes | None = None
        self.served: Counter = Counter()
        self.refused: Counter = Counter()
        self._lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                head += chunk
        except OSError:
            conn.close()
            return
        path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
        if path.startswith(b"/openings/"):
            with self._lock:
                ok = self.served[self.key] < self.serve
                (self.served if ok else self.refused)[self.key] += 1
            if not ok:
                conn.close()
                return
        self._relay(conn, head)

    def _relay(self, conn: socket.socket, head: bytes) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.target), timeout=30)
            up.sendall(head)
        except OSError:
            conn.close()
            return
        conn.settimeout(None)

        def pump(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pump, args=(up, conn), daemon=True).start()
        pump(conn, up)

    def close(self) -> None:
        self.closing.set()
        self.sock.close()


def _train_in_thread(cluster: Cluster, **kw) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["rc"], out["summary"] = cluster.train(**kw)
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


@pytest.fixture(scope="module")
def net_b(tmp_path_factory):
    """The network's whole play, its processes stopped before the tests read the chain it left."""
    tmp = tmp_path_factory.mktemp("net_b")
    cluster = Cluster(tmp, B_PARAMS)
    adv = Adversary(cluster)
    prover = free_port()
    proxy = HalfProxy(prover, serve=2)
    started = time.monotonic()
    try:
        for name in B_NODES:
            cluster.start_verifier(name, fetch=FETCH)
        cluster.wait_bonded(B_NODES)
        spec = tmp / "spec.toml"
        spec.write_text(TINY_GPT.format(steps=6))
        data = corpus(tmp)

        # finding 2: the forger serves half of every round
        def follow(view: ChainView) -> None:
            issued = [e for e in view.of(P.ChallengeIssued) if view.state.runs[e.run_id].miner == "miner"]
            if issued:
                proxy.key = issued[-1].challenge_id

        adv.play(follow)
        rc1, summary1 = cluster.train(spec, data, steps_timeout=TRAIN_TIMEOUT, substitute_at=4, port=prover,
                                      endpoint=f"http://127.0.0.1:{proxy.port}")
        half = (rc1, summary1, dict(proxy.served), dict(proxy.refused))

        # finding 5: the lazy majority of round 1, one made-up proof
        vs = B_PARAMS.verifier_stake
        view = cluster.view()
        honest_units = sum(view.state.vbonds[n] // vs for n in B_NODES)
        lazy_units = honest_units + 2  # a majority of round 1's seats, every unit seated
        for i, who in enumerate(LAZY):
            adv.send(who, BondVerifier(amount=vs * (lazy_units // 2 + (i < lazy_units % 2))))
        until(cluster, lambda v: all(v.state.vbonds.get(w) for w in LAZY), "the lazy bonds")
        shared = digest("pot/e2e/made-up-proof/v1")  # one proof for both accounts and both rounds
        adv.play(Witnesses(adv, lambda: set(LAZY), lambda v, ch, who: (ch.opening["leaf_hash"], shared)))
        t, out = _train_in_thread(cluster, spec=spec, data=data, steps_timeout=TRAIN_TIMEOUT, substitute_at=4,
                                  miner="forger2")
        # the rest of the honest stake joins once round 1 is drawn
        until(cluster, lambda v: any(v.state.runs[e.run_id].miner == "forger2"
                                     for e in v.of(P.ChallengeIssued)),
              "the second run's first round", timeout=TRAIN_TIMEOUT)
        cluster.start_verifier(LATE, bond=vs * 2 * lazy_units, fetch=FETCH)
        cluster.wait_bonded([LATE])
        t.join(TRAIN_TIMEOUT + 180)
        assert "error" not in out, out.get("error")
        alive(cluster, [*B_NODES, LATE])
        assert not adv.errors, adv.errors
        return cluster, cluster.view(), half, (out["rc"], out["summary"])
    finally:
        adv.close()
        proxy.close()
        cluster.close()
        print(f"\nnet_b: {time.monotonic() - started:.0f} s")


def test_half_served_rounds_tie_then_the_dispute_round_rules_fraud(net_b):
    cluster, view, (rc, summary, served, refused), _ = net_b
    assert rc == 1, cluster.err("miner")[-3000:]  # the miner exits 1 on a fraud verdict
    rounds = rounds_of(view, run_id_of(view, "miner"))
    assert [(i.round, r.verdict) for i, r in rounds] == [(1, "inconclusive"), (2, "fraud")], [
        r.reason for _, r in rounds]
    (i1, r1), (i2, r2) = rounds
    # round 1: every unit seated, half of them replayed (the forged step's true value), half refused
    assert r1.rechallenge == i2.challenge_id and "tie" in r1.reason, r1.reason
    assert len(r1.clusters) == 2, r1.clusters
    assert r1.clusters[0][1] == r1.clusters[1][1] == len(i1.committee) // 2, r1.clusters
    # the dispute round: half served again, and a refusal counts against the miner
    assert len(r2.clusters) == 2 and r2.clusters[0][1] == r2.clusters[1][1], r2.clusters
    assert "not more than the share" in r2.reason, r2.reason
    (slash,) = [e for e in view.of(P.MinerSlashed) if e.miner == "miner"]
    assert slash.amount == B_PARAMS.slash_amount and slash.challenge_id == i2.challenge_id
    cids = {i1.challenge_id, i2.challenge_id}
    assert [e for e in view.of(P.VerifierPenalized) if e.challenge_id in cids] == []  # no verifier pays
    assert [e for e in view.of(P.ChallengeEscalated) if e.challenge_id in cids] == []
    # the proxy relayed two downloads of each round's opening (its own count, beside the chain's)
    assert served == {i1.challenge_id: 2, i2.challenge_id: 2}, served
    assert all(refused.get(c, 0) >= 2 for c in cids), refused


def test_lazy_majority_with_one_made_up_proof_is_escalated_and_the_dispute_rules_fraud(net_b):
    cluster, view, _, (rc, summary) = net_b
    assert rc == 1, cluster.err("forger2")[-3000:]
    p = B_PARAMS
    rounds = rounds_of(view, run_id_of(view, "forger2"))
    assert [(i.round, r.verdict) for i, r in rounds] == [(1, "inconclusive"), (2, "fraud")], [
        r.reason for _, r in rounds]
    (i1, r1), (i2, r2) = rounds
    leaf_hash = next(e.leaf_hash for e in view.of(P.OpeningSubmitted) if e.challenge_id == i1.challenge_id)
    seats1, seats2 = Counter(i1.committee), Counter(i2.committee)
    lazy1 = sum(seats1[w] for w in LAZY)
    # round 1 would have passed the forged leaf: the lazy cluster (H(leaf t), one proof) won it
    assert LATE not in seats1 and lazy1 > sum(seats1[n] for n in B_NODES), seats1
    assert r1.winning_value == leaf_hash and r1.cluster_size == lazy1, (r1.winning_value, r1.cluster_size)
    assert "escalated to the dispute round" in r1.reason and r1.rechallenge == i2.challenge_id, r1.reason
    escalated = [e for e in view.of(P.ChallengeEscalated) if e.challenge_id == i1.challenge_id]
    assert escalated and {e.verifier for e in escalated} <= set(B_NODES), escalated
    assert all(e.disputes == "honest" and e.stake == p.escalation_stake for e in escalated)
    # the dispute round seats the whole stake, the late node's included, and rules fraud
    (late,) = [e.block for e in view.of(P.VerifierBonded) if e.verifier == LATE]
    assert seats2[LATE] > 0, (f"{LATE} bonded at block {late}, the dispute round was drawn at block {i2.block}: "
                              f"the node took too long to start")
    assert "not more than the share" in r2.reason, r2.reason
    (slash,) = [e for e in view.of(P.MinerSlashed) if e.miner == "forger2"]
    assert slash.challenge_id == i2.challenge_id and slash.amount == p.slash_amount
    # the lazy pay an outlier penalty a seat in round 1 and in the dispute round; nobody else pays
    pen = penalties(view)
    for w in LAZY:
        assert pen[(i1.challenge_id, w)] == [("outlier", p.outlier_penalty * seats1[w])], pen
        assert pen[(i2.challenge_id, w)] == [("outlier", p.outlier_penalty * seats2[w])], pen
    assert {w for c, w in pen if c in (i1.challenge_id, i2.challenge_id)} == set(LAZY), pen
    # every escalator vindicated: its stake returned
    settled = [(e.verifier, e.returned, e.forfeited) for e in view.of(P.EscalationSettled)
               if e.challenge_id == i1.challenge_id]
    assert sorted(settled) == sorted((e.verifier, p.escalation_stake, 0) for e in escalated), settled
    paid = {e.verifier for e in view.of(P.VerifierPaid) if e.challenge_id == i2.challenge_id}
    assert LATE in paid and not paid & set(LAZY), paid
    assert books(view) == []
