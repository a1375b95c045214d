"""The scripted adversary of the protocol v3 end-to-end rows (test_adversary_v3_e2e.py,
test_adversary_v3_dispute_e2e.py): accounts of its own acting through the dev chain's transport,
strategies played after every block, and what the tests read off the chain it leaves."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

from chain import protocol as P
from chain.calls import CommitWitness, RevealWitnessValue
from chain.dev import DevTransport
from chain.transport import TransportError
from chain.view import ChainView
from challenges.witness import witness_commitment
from commitments.hashing import digest
from tests.e2e.cluster import Cluster

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


def until(cluster: Cluster, done: Callable[[ChainView], bool], what: str, timeout: float = 60) -> ChainView:
    """A fresh view of the chain once `done` holds of it (TimeoutError naming `what` otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        view = cluster.view()
        if done(view):
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"the chain did not show {what} within {timeout:.0f} s")
        time.sleep(0.5)
