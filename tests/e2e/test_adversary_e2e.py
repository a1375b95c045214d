"""The adversary matrix's unavailability rows end to end: a dev chain, a real miner (`pot miner
train`) behind a TCP proxy the test controls, and four real verifier nodes (`pot node run`), one of
them lazy. Every node decides for itself what it saw; the protocol decides from their reveals.

* stalled opening: the proxy answers every download one byte a second, so every honest node's fetch
  times out and reveals the one refused value, in both opening windows: fraud, the miner slashed;
  the lazy node, which revealed the public H(leaf t), pays as the outlier, for each seat it holds.
* split refusals: the proxy answers each download with a different malformed opening (junk, a
  truncated body, a wrong length, bytes that are no opening), so each honest node refuses for its
  own reason; they all reveal the one refused value, in both windows: fraud; only the lazy node pays.
* prover knocked offline for one window: the proxy refuses every download of the first round, then
  lets them through: the committee's refusal gives the miner a second opening window, in which the
  step verifies honest; nobody honest pays, the lazy node pays in both rounds.
"""

from __future__ import annotations

import socket
import threading

import pytest
import sqlalchemy as sa

from chain import protocol as P
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from chain.transport import TransportError
from chain.view import ChainView
from challenges.opening import MAGIC as MAGIC_OPENING
from challenges.refused import refused_value_hash
from devnet.procs import free_port
from node.db import challenges
from tests.e2e.cluster import TINY_GPT, Cluster
from tests.miner.helpers import corpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# Windows leave room for a loaded machine (blocks every 0.5 s): the miner builds and opens within 20 s.
PARAMS = ProtocolParams(commit_window=40, reveal_window=16, opening_deadline=40, challenge_delay=2,
                        challenges_per_run=1, committee_size=40, quorum_min_reveals=3, max_rounds=3,
                        forced_challenge_steps=(4,))
HONEST = ["v1", "v2", "v3"]
FETCH = {"connect_timeout_s": 2.0, "read_timeout_s": 2.0, "total_timeout_s": 6.0, "attempts": 2}


class Proxy:
    """A TCP front for the miner's prover: `mode` is "pass" (relay both ways), "down" (accept and
    close at once), "stall" (read the request, then answer one byte a second, forever) or "split"
    (answer each download with another malformed opening)."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.mode = "pass"
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closing = threading.Event()
        self.hits: dict[str, int] = {}
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            mode = self.mode
            self.hits[mode] = self.hits.get(mode, 0) + 1
            threading.Thread(target=getattr(self, f"_{mode}"), args=(conn,), daemon=True).start()

    def _down(self, conn: socket.socket) -> None:
        conn.close()

    def _stall(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n" + b"\0" * 10_000:
                if self.closing.wait(1.0):
                    break
                conn.sendall(bytes([b]))
        except OSError:
            pass
        finally:
            conn.close()

    def _split(self, conn: socket.socket) -> None:
        """Each connection gets the next of three bad answers: bytes that are no opening, an
        opening's magic followed by garbage, a body shorter than its announced length."""
        n = self.hits.get("split", 0)
        kind = n % 3
        body = [b"not an opening at all" * 50, MAGIC_OPENING + bytes(range(256)) * 8, b"\x00" * 2048][kind]
        length = len(body) + (4096 if kind == 2 else 0)
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                         + f"Content-Length: {length}\r\nConnection: close\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            conn.close()

    def _pass(self, conn: socket.socket) -> None:
        try:
            up = socket.create_connection(("127.0.0.1", self.target), timeout=30)
        except OSError:
            conn.close()
            return

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


def _follow_rounds(cluster: Cluster, proxy: Proxy, mode_of_round, stop: threading.Event) -> None:
    """Set the proxy's mode from the newest challenge round on chain."""
    transport = DevTransport(cluster.chain_db, "observer")
    view = ChainView(transport, cluster.params)
    try:
        while not stop.is_set():
            try:
                view.sync()
            except TransportError:  # the chain file busy: read again
                pass
            issued = view.of(P.ChallengeIssued)
            if issued:
                proxy.mode = mode_of_round(max(e.round for e in issued))
            stop.wait(0.3)
    finally:
        transport.close()


def _play(tmp_path, mode_of_round):
    cluster = Cluster(tmp_path, PARAMS)
    prover_port = free_port()
    proxy = Proxy(prover_port)
    proxy.mode = mode_of_round(1)
    stop = threading.Event()
    try:
        for name in HONEST:
            cluster.start_verifier(name, fetch=FETCH)
        cluster.start_verifier("v4", fault="lazy", fetch=FETCH)
        cluster.wait_bonded([*HONEST, "v4"])
        follower = threading.Thread(target=_follow_rounds, args=(cluster, proxy, mode_of_round, stop), daemon=True)
        follower.start()
        spec = tmp_path / "spec.toml"
        spec.write_text(TINY_GPT.format(steps=6))
        rc, summary = cluster.train(spec, corpus(tmp_path), steps_timeout=600, port=prover_port,
                                    endpoint=f"http://127.0.0.1:{proxy.port}")
        for name in [*HONEST, "v4"]:
            assert cluster.procs[name].poll() is None, f"{name} stopped:\n{cluster.err(name)[-3000:]}"
        view = cluster.view()
        name_of = {cluster.account(n): n for n in [*HONEST, "v4", "miner"]}
        resolved = view.of(P.ChallengeResolved)
        paid: dict[str, int] = {}
        for e in view.of(P.VerifierPenalized):
            paid[name_of[e.verifier]] = paid.get(name_of[e.verifier], 0) + e.amount
        slashed = sum(e.amount for e in view.of(P.MinerSlashed))
        lazy = cluster.account("v4")
        # what the lazy node's seats cost it, round by round (a seat per verifier_stake of its bond)
        seats = {e.challenge_id: e.committee.count(lazy) for e in view.of(P.ChallengeIssued)}
        owed = [(e.challenge_id, e.why, e.amount) for e in view.of(P.VerifierPenalized) if e.verifier == lazy]
        assert all(why == "outlier" and amount == seats[cid] * PARAMS.outlier_penalty
                   for cid, why, amount in owed), (owed, seats)
        assert len(owed) == len(resolved), owed
        return rc, summary, resolved, paid, slashed, dict(proxy.hits), cluster
    finally:
        stop.set()
        proxy.close()
        cluster.close()


def test_stalled_opening_is_fraud_after_two_windows_and_only_the_lazy_node_pays(tmp_path):
    rc, summary, resolved, paid, slashed, hits, cluster = _play(tmp_path, lambda r: "stall")
    assert [r.verdict for r in resolved] == ["inconclusive", "fraud"], [r.reason for r in resolved]
    assert "second opening window" in resolved[0].reason and resolved[0].rechallenge is not None
    assert slashed == PARAMS.slash_amount
    assert set(paid) == {"v4"}, paid  # the lazy node, an outlier in both rounds
    assert hits.get("stall", 0) >= 3 and "pass" not in hits


def test_prover_offline_for_one_window_then_honest_and_only_the_lazy_node_pays(tmp_path):
    rc, summary, resolved, paid, slashed, hits, cluster = _play(tmp_path, lambda r: "down" if r == 1 else "pass")
    assert [r.verdict for r in resolved] == ["inconclusive", "honest"], [r.reason for r in resolved]
    assert slashed == 0 and rc == 0, summary
    assert set(paid) == {"v4"}, paid  # the lazy node, an outlier in both rounds
    assert hits.get("down", 0) >= 3 and hits.get("pass", 0) >= 3


def test_split_refusals_are_one_value_fraud_after_two_windows_and_only_the_lazy_node_pays(tmp_path):
    rc, summary, resolved, paid, slashed, hits, cluster = _play(tmp_path, lambda r: "split")
    assert [r.verdict for r in resolved] == ["inconclusive", "fraud"], [r.reason for r in resolved]
    assert slashed == PARAMS.slash_amount
    assert set(paid) == {"v4"}, paid
    assert hits.get("split", 0) >= 3
    # Each round: the honest nodes' refusals are one cluster (the one refused value), the lazy
    # node's public value another.
    for r in resolved:
        assert r.winning_value == refused_value_hash(r.challenge_id) and len(r.clusters) == 2, r.clusters
    # ... though the nodes refused for reasons of their own (what each recorded locally).
    reasons = set()
    for name in HONEST:
        eng = cluster.node_db(name)
        with eng.connect() as c:
            reasons |= {row.refusal_reason for row in c.execute(sa.select(challenges)) if row.refusal_reason}
        eng.dispose()
    assert len(reasons) >= 2, reasons
