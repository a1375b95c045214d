"""Connection loss on a real runtime: the websocket is cut under the transport, which retries with
backoff, rebuilds its connection and carries on from the caller's cursor; a silent node times out."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from chain.calls import CommitWitness
from chain.substrate import TransportError, connect_substrate
from tests.chain.chopsticks_env import Chopsticks, chopsticks, fresh_chain, unique_key  # noqa: F401

pytestmark = pytest.mark.chopsticks


class CuttableProxy:
    """A TCP relay to chopsticks that can cut every open connection, refuse new ones, or go silent."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.refusing = False
        self.silent = False
        self.accepted = 0
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            self.accepted += 1
            if self.silent:  # accept and never answer: the client's timeout must fire
                with self._lock:
                    self._socks.append(client)
                continue
            up = socket.create_connection(self.upstream, timeout=10)
            with self._lock:
                self._socks += [client, up]
            threading.Thread(target=self._pump, args=(client, up), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.cut()


def _commit(i: int) -> CommitWitness:
    return CommitWitness(challenge_id=b"\x05" * 32, commitment=bytes([i]) * 32)


def test_follow_survives_a_cut_and_resumes_from_cursor(chopsticks: Chopsticks, caplog):  # noqa: F811
    fresh_chain(chopsticks)
    proxy = CuttableProxy(chopsticks.port)
    follower = connect_substrate(proxy.url, unique_key("follower"), rpc_timeout=5, backoff_base=0.3)
    writer = connect_substrate(chopsticks.url, unique_key("writer"))
    try:
        chopsticks.fund([writer.account])
        cursor = writer.submit([_commit(1)]).block_number
        assert follower.block(cursor).calls == ((writer.account, _commit(1)),)

        # Cut the socket and refuse reconnection for a while; the chain moves on meanwhile.
        proxy.refusing = True
        proxy.cut()
        later = [writer.submit([_commit(i)]).block_number for i in (2, 3)]
        threading.Timer(1.5, lambda: setattr(proxy, "refusing", False)).start()

        seen = []
        t0 = time.monotonic()
        with caplog.at_level(logging.INFO, logger="chain.substrate"):
            for block in follower.follow(cursor, poll=0.05, stop=lambda: len(seen) >= 2):
                seen.append(block)
        assert [b.number for b in seen] == [cursor + 1, cursor + 2] == later
        assert [b.calls for b in seen] == [((writer.account, _commit(i)),) for i in (2, 3)]
        assert follower.client.reconnects >= 1
        assert "retry 1/" in caplog.text and "reconnected to" in caplog.text
        assert time.monotonic() - t0 >= 1.0  # it waited (backoff) rather than spinning

        # The same transport also submits again after the cut.
        proxy.cut()
        follower_funds = [follower.account]
        chopsticks.fund(follower_funds)
        r = follower.submit([_commit(4)])
        assert writer.block(r.block_number).calls == ((follower.account, _commit(4)),)
    finally:
        follower.close()
        writer.close()
        proxy.close()


def test_silent_node_times_out_with_clear_error(chopsticks: Chopsticks):  # noqa: F811
    proxy = CuttableProxy(chopsticks.port)
    t = connect_substrate(proxy.url, unique_key("timeout"), rpc_timeout=1.0, max_attempts=2, backoff_base=0.1)
    try:
        proxy.silent = True
        proxy.cut()
        t0 = time.monotonic()
        with pytest.raises(TransportError, match=r"unreachable after 2 attempt\(s\)"):
            t.finalized_head()
        elapsed = time.monotonic() - t0
        assert 1.0 <= elapsed < 15, elapsed
    finally:
        t.close()
        proxy.close()
