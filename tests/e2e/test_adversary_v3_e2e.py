"""Protocol v3's adversary rows for findings 1-5 (devnet/protocol_matrix.py: row_commit_flood,
row_half_served_dispute, row_dust_bonds, row_one_bond_many_committees, row_lazy_majority_escalated)
end to end: a dev chain (`pot chain dev`), real miners (`pot miner train`, honest or forging a step
with `--substitute-batch-at`), real honest verifier nodes (`pot node run`), and an adversary the
test scripts, acting through the dev chain's transport with accounts of its own. Every assertion
reads the chain (events and state through a ChainView), never the adversary's own bookkeeping.

Two networks serve the five rows, each a module of work done once:

* `net_a` (an honest miner, the two challenges of its run open side by side, committees of 18
  seats drawn from the 36 seat units bonded at the first draw, so the two draws between them seat
  (nearly) every unit):
  - finding 3, dust bonds: before any node starts, 256 accounts bond 1 unit each (refused
    BondBelowMinimum) and the one-bond account tries to unbond down to dust (refused the same); the
    three real nodes, all started after the flood, bond and serve.
  - finding 1, commit flood: four least-bond Sybils send their commitments (garbage) as soon as a
    round they sit on is issued, before its opening is on chain: refused NoOpening; sent again
    after the opening, taken; an account that bonds after the first draw commits to it (refused
    NotInCommittee) and then plays a Sybil. The honest nodes' reveals decide both rounds (honest)
    and every seated Sybil pays an outlier penalty a seat.
  - finding 4, one bond on many committees: an account bonded 2 x verifier_stake never commits. The
    draws are random (the test does not choose block hashes), but with every unit seated by one of
    the two committees (at most one left over, when the late account's unit joins the second
    draw) it sits; the chain never gives it more seats at once than its bond backs, every absence
    is paid in full from its seats, and every account's bond is what its bonds, payments and
    penalties on chain add up to.
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
from collections.abc import Callable

import pytest

from chain import protocol as P
from chain.calls import BondVerifier, CommitWitness, RevealWitnessValue, UnbondVerifier
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from chain.transport import TransportError
from chain.view import ChainView
from challenges.witness import witness_commitment
from commitments.hashing import digest
from devnet.procs import free_port
from tests.e2e.cluster import TINY_GPT, Cluster
from tests.miner.helpers import corpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Windows leave room for a loaded machine (blocks every 0.5 s): the miner opens within 20 s, a node
# fetches and replays (a cold replay worker took 30 s on two busy cores) before the commit
# deadline, and escalates within escalation_window. A round's windows grow with its number.
WINDOWS = dict(reveal_window=12, opening_deadline=40, challenge_delay=2, escalation_window=12,
               quorum_min_reveals=3)
FETCH = {"connect_timeout_s": 2.0, "read_timeout_s": 2.0, "total_timeout_s": 6.0, "attempts": 2}
TRAIN_TIMEOUT = 600


# --- the adversary ----------------------------------------------------------------------------


class Adversary:
    """Accounts of the adversary's own on the dev chain: `send` submits calls as one of them; `play`
    runs a strategy in a thread, called with a ChainView of its own after every new block."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._tx: dict[str, DevTransport] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def send(self, who: str, *calls, keep: bool = True) -> None:
        """Submit `calls` as `who` (not waiting for a block); `keep=False` closes its transport after."""
        with self._lock:
            if who not in self._tx:
                self._tx[who] = DevTransport(self.cluster.chain_db, who)
            self._tx[who].submit(list(calls), wait=False)
            if not keep:
                self._tx.pop(who).close()

    def play(self, strategy: Callable[[ChainView], None]) -> None:
        def loop() -> None:
            transport = DevTransport(self.cluster.chain_db, "adversary-eye")
            view = ChainView(transport, self.cluster.params)
            try:
                while not self._stop.is_set():
                    seen = view.cursor
                    try:
                        view.sync()
                    except TransportError:  # the chain file busy: read again
                        pass
                    if view.cursor != seen:
                        strategy(view)
                    self._stop.wait(0.02)
            except BaseException as exc:  # reported by the test, not lost in the thread
                self.errors.append(exc)
            finally:
                transport.close()

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        self._threads.append(t)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        for t in self._tx.values():
            t.close()


def commit_pair(cid: bytes, who: str, value: bytes, proof: bytes) -> tuple[CommitWitness, RevealWitnessValue]:
    salt = digest("pot/e2e/adversary-salt/v1", who, cid)
    com = witness_commitment(cid, value, 0, salt, who, proof_hash=proof)
    return CommitWitness(cid, com), RevealWitnessValue(cid, value, proof, 0, salt)


class Witnesses:
    """A strategy: the seated accounts among `accounts()` commit `pair(view, challenge, who)` once the
    opening is on chain and reveal it after the commit window, each call sent again every few blocks
    until the chain shows it. `early` (a pair that needs no opening) also sends each commitment in
    each of the first three blocks after the round's issue while its opening is not on chain."""

    def __init__(self, adversary: Adversary, accounts: Callable[[], set[str]],
                 pair: Callable[[ChainView, P.ChallengeState, str], tuple[bytes, bytes]], *,
                 early: bool = False) -> None:
        self.adv, self.accounts, self.pair, self.early = adversary, accounts, pair, early
        self.sent: dict[tuple[bytes, str, str], int] = {}  # (challenge, account, what) -> block last sent
        self.tries: Counter = Counter()

    def _due(self, key: tuple[bytes, str, str], head: int, every: int) -> bool:
        last = self.sent.get(key)
        if last is not None and head - last < every:
            return False
        self.sent[key] = head
        return True

    def __call__(self, view: ChainView) -> None:
        head, mine = view.cursor, self.accounts()
        for cid, ch in list(view.state.challenges.items()):
            if ch.verdict is not None:
                continue
            for who in sorted(mine & set(ch.committee)):
                if ch.opening is None:
                    early = (cid, who, "early")
                    if (self.early and head < ch.opening_deadline and self.tries[early] < 3
                            and self._due(early, head, 1)):
                        self.tries[early] += 1
                        self.adv.send(who, commit_pair(cid, who, *self.pair(view, ch, who))[0])
                    continue
                commit, reveal = commit_pair(cid, who, *self.pair(view, ch, who))
                if who not in ch.commitments:
                    if head < ch.commit_deadline and self._due((cid, who, "commit"), head, 4):
                        self.adv.send(who, commit)
                elif (who not in ch.reveals and ch.commit_deadline <= head < ch.reveal_deadline
                      and self._due((cid, who, "reveal"), head, 4)):
                    self.adv.send(who, reveal)


# --- what the chain says ----------------------------------------------------------------------


def books(view: ChainView) -> list[str]:
    """Every account's bond is what the chain's events add up to: bonds, less unbonding amounts,
    penalties and forfeited escalation stakes, plus payments; nothing is left reserved or staked
    once every round is settled. The differences, named (empty when the books hold)."""
    out: Counter = Counter()
    for e in view.of(P.VerifierBonded):
        out[e.verifier] += e.amount
    for e in view.of(P.VerifierUnbonding):
        out[e.verifier] -= e.amount
    for e in view.of(P.VerifierPenalized):
        out[e.verifier] -= e.amount
    for e in view.of(P.EscalationSettled):
        out[e.verifier] -= e.forfeited
    for e in view.of(P.VerifierPaid):
        out[e.verifier] += e.amount
    s = view.state
    wrong = [f"{a}: the events give {out[a]}, the state holds {s.vbonds.get(a, 0)}"
             for a in sorted(set(out) | set(s.vbonds)) if out[a] != s.vbonds.get(a, 0)]
    wrong += [f"{a} has a bond of {b}" for a, b in s.vbonds.items() if b < 0]
    if s.reserved:
        wrong.append(f"still reserved: {s.reserved}")
    if s.staked:
        wrong.append(f"still staked: {s.staked}")
    return wrong


def rounds_of(view: ChainView, run_id: bytes) -> list[tuple[P.ChallengeIssued, P.ChallengeResolved]]:
    resolved = {e.challenge_id: e for e in view.of(P.ChallengeResolved)}
    return [(e, resolved[e.challenge_id]) for e in view.of(P.ChallengeIssued)
            if e.run_id == run_id and e.challenge_id in resolved]


def penalties(view: ChainView) -> dict[tuple[bytes, str], list[tuple[str, int]]]:
    out: dict[tuple[bytes, str], list[tuple[str, int]]] = {}
    for e in view.of(P.VerifierPenalized):
        out.setdefault((e.challenge_id, e.verifier), []).append((e.why, e.amount))
    return out


def alive(cluster: Cluster, names: list[str]) -> None:
    for name in names:
        assert cluster.procs[name].poll() is None, f"{name} stopped:\n{cluster.err(name)[-3000:]}"


def run_id_of(view: ChainView, miner: str) -> bytes:
    (run,) = [e.run_id for e in view.of(P.RunRegistered) if e.miner == miner]
    return run


# --- network A: an honest run, two challenges side by side ------------------------------------

# Each node replays both challenges, one after the other: a longer commit window.
A_PARAMS = ProtocolParams(**WINDOWS, commit_window=100, challenges_per_run=2, committee_size=18, max_rounds=3)
A_NODES = ["v1", "v2", "v3"]
A_BOND = 1000  # 10 seat units a node: 30 of the 36 units the two draws share
SYBILS = ["s0", "s1", "s2", "s3"]
ONE = "w"  # the one bond of finding 4
DUST = [f"dust{i:03d}" for i in range(256)]


@pytest.fixture(scope="module")
def net_a(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("net_a")
    cluster = Cluster(tmp, A_PARAMS)
    adv = Adversary(cluster)
    started = time.monotonic()
    try:
        vs = A_PARAMS.verifier_stake
        # finding 3: dust against the registry, before any node is up
        for name in DUST:
            adv.send(name, BondVerifier(amount=1), keep=False)
        adv.send(ONE, BondVerifier(amount=2 * vs))
        for s in SYBILS:
            adv.send(s, BondVerifier(amount=vs))
        _until(cluster, lambda v: v.state.vbonds.get(ONE) == 2 * vs
               and all(v.state.vbonds.get(s) for s in SYBILS), "the adversary's bonds")
        adv.send(ONE, UnbondVerifier(amount=2 * vs - vs // 2))  # would leave dust
        flooded = _until(cluster, lambda v: any(e.origin == ONE for e in v.of(P.CallRefused)),
                         "the dust unbond")
        # the real nodes, every one started after the flood
        for name in A_NODES:
            cluster.start_verifier(name, bond=A_BOND, fetch=FETCH)
        cluster.wait_bonded(A_NODES)

        garbage = lambda view, ch, who: (digest("pot/e2e/garbage/v1", ch.challenge_id),  # noqa: E731
                                         digest("pot/e2e/garbage-proof/v1", ch.challenge_id))
        sybils = set(SYBILS)
        flood = Witnesses(adv, lambda: set(sybils), garbage, early=True)
        late: dict[str, int] = {}

        def strategy(view: ChainView) -> None:
            flood(view)
            issued = view.of(P.ChallengeIssued)
            if issued and "late" not in late:  # bonds after the first draw and commits to it
                first = issued[0]
                late["late"] = view.cursor
                adv.send("late", BondVerifier(amount=vs),
                         commit_pair(first.challenge_id, "late", *garbage(view, first, "late"))[0])
                sybils.add("late")  # and acts as a Sybil wherever a later draw seats it

        adv.play(strategy)
        spec = tmp / "spec.toml"
        spec.write_text(TINY_GPT.format(steps=6))
        rc, summary = cluster.train(spec, corpus(tmp), steps_timeout=TRAIN_TIMEOUT)
        alive(cluster, A_NODES)
        assert not adv.errors, adv.errors
        view = cluster.view()
        yield cluster, view, rc, summary, flooded.cursor
    finally:
        adv.close()
        cluster.close()
        print(f"\nnet_a: {time.monotonic() - started:.0f} s")


def _until(cluster: Cluster, done: Callable[[ChainView], bool], what: str, timeout: float = 60) -> ChainView:
    deadline = time.monotonic() + timeout
    while True:
        view = cluster.view()
        if done(view):
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"the chain did not show {what} within {timeout:.0f} s")
        time.sleep(0.5)


def test_dust_bonds_are_refused_and_new_real_nodes_bond_and_serve(net_a):
    cluster, view, rc, summary, flood_block = net_a
    refused = [e for e in view.of(P.CallRefused) if e.refusal == "BondBelowMinimum"]
    assert sorted(e.origin for e in refused if e.origin in DUST) == DUST
    assert [(e.origin, e.call) for e in refused if e.origin not in DUST] == [(ONE, "unbond_verifier")]
    assert view.of(P.VerifierUnbonding) == []
    assert not set(DUST) & set(view.state.verifiers), "a dust account is in the verifier registry"
    # every real node bonded after the flood, was seated and paid for winning seats
    bonded = {e.verifier: e.block for e in view.of(P.VerifierBonded)}
    paid = Counter()
    for e in view.of(P.VerifierPaid):
        paid[e.verifier] += e.amount
    seated = Counter(a for e in view.of(P.ChallengeIssued) for a in e.committee)
    for name in A_NODES:
        assert bonded[name] > flood_block, (name, bonded[name], flood_block)
        assert seated[name] > 0 and paid[name] > 0, (name, seated, paid)


def test_commit_flood_before_the_opening_is_refused_and_honest_reveals_decide(net_a):
    cluster, view, rc, summary, _ = net_a
    assert rc == 0, cluster.err("miner")[-3000:]
    run = run_id_of(view, "miner")
    rounds = rounds_of(view, run)
    assert [(i.round, r.verdict) for i, r in rounds] == [(1, "honest")] * 2, [r.reason for _, r in rounds]
    opened = {e.challenge_id: e.block for e in view.of(P.OpeningSubmitted)}
    adversary = set(SYBILS) | {"late"}
    early = [e for e in view.of(P.CallRefused) if e.refusal == "NoOpening"]
    # the commitments sent before the opening were refused, and only those: every one in a block
    # no later than the opening of a round its sender sits on
    assert early, "no commitment reached the chain before an opening"
    for e in early:
        assert e.origin in adversary and e.call == "commit_witness", e
        assert any(e.origin in i.committee and e.block <= opened[i.challenge_id] for i, _ in rounds), e
    unseated = [e for e in view.of(P.CallRefused) if e.refusal == "NotInCommittee"]
    assert [e.origin for e in unseated] == ["late"], unseated
    committed = {(e.challenge_id, e.verifier) for e in view.of(P.WitnessCommitted)}
    pen = penalties(view)
    for issued, res in rounds:
        seats = Counter(issued.committee)
        for who in adversary & set(seats):  # each seated Sybil's commitment taken, whatever the order
            assert (issued.challenge_id, who) in committed, (who, issued.challenge_id.hex()[:16])
            assert who in res.outliers
            assert pen[(issued.challenge_id, who)] == [("outlier", A_PARAMS.outlier_penalty * seats[who])]
        # the honest nodes' reveals decide: every one of them in the winning cluster
        assert res.cluster_size == sum(seats[n] for n in A_NODES), (res.cluster_size, seats)
        assert not set(A_NODES) & set(res.outliers)
    assert not any(who in A_NODES for _, who in pen), pen
    assert any(e.origin in SYBILS for e in early)


def test_one_bond_sits_on_no_more_seats_than_it_backs_and_pays_in_full(net_a):
    cluster, view, rc, summary, _ = net_a
    vs = A_PARAMS.verifier_stake
    rounds = rounds_of(view, run_id_of(view, "miner"))
    spans = [(i.block, r.block, i.committee.count(ONE), i.challenge_id)
             for i, r in rounds if ONE in i.committee]
    assert spans, f"{ONE} sat on none of {len(rounds)} committees"
    # at every issuance, the seats it holds on open rounds are backed by its bond then
    # (a block's draws come before its resolutions: a round resolving at the block still holds its
    # seats, and its penalties are not taken yet)
    bond_at = lambda n: 2 * vs - sum(e.amount for e in view.of(P.VerifierPenalized)  # noqa: E731
                                     if e.verifier == ONE and e.block < n)
    holding = {start: sum(k for s, end, k, _ in spans if s <= start <= end) for start, _, _, _ in spans}
    for start, k in holding.items():
        assert k * vs <= bond_at(start), (start, k, bond_at(start))
    most = max(holding.values())
    assert 1 <= most <= 2
    # every absence paid in full: no_show_penalty a seat, on each round it sat on
    pen = penalties(view)
    for _, _, k, cid in spans:
        assert pen[(cid, ONE)] == [("no_commit", A_PARAMS.no_show_penalty * k)], pen.get((cid, ONE))
    total = sum(k for _, _, k, _ in spans)
    assert view.state.vbonds[ONE] == 2 * vs - A_PARAMS.no_show_penalty * total
    assert books(view) == []
    print(f"\n{ONE}: {total} seat(s) over {len(spans)} rounds, at most {most} at once")


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
        _until(cluster, lambda v: all(v.state.vbonds.get(w) for w in LAZY), "the lazy bonds")
        shared = digest("pot/e2e/made-up-proof/v1")  # one proof for both accounts and both rounds
        adv.play(Witnesses(adv, lambda: set(LAZY), lambda v, ch, who: (ch.opening["leaf_hash"], shared)))
        t, out = _train_in_thread(cluster, spec=spec, data=data, steps_timeout=TRAIN_TIMEOUT, substitute_at=4,
                                  miner="forger2")
        # the rest of the honest stake joins once round 1 is drawn
        _until(cluster, lambda v: any(v.state.runs[e.run_id].miner == "forger2"
                                      for e in v.of(P.ChallengeIssued)),
               "the second run's first round", timeout=TRAIN_TIMEOUT)
        cluster.start_verifier(LATE, bond=vs * 2 * lazy_units, fetch=FETCH)
        cluster.wait_bonded([LATE])
        t.join(TRAIN_TIMEOUT + 180)
        assert "error" not in out, out.get("error")
        alive(cluster, [*B_NODES, LATE])
        assert not adv.errors, adv.errors
        yield cluster, cluster.view(), half, (out["rc"], out["summary"])
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
    assert seats2[LATE] > 0 and "not more than the share" in r2.reason, (seats2, r2.reason)
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
