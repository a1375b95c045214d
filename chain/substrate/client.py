"""The one RPC choke point: a websocket to one node, and `SubstrateClient.call`, which every RPC
goes through (socket timeout, retries with the project's backoff, a fresh websocket after any
failure, opened by us: substrate-interface's own auto-reconnect silently drops subscriptions)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from substrateinterface import SubstrateInterface
from substrateinterface.exceptions import SubstrateRequestException
from websocket import WebSocketException

from chain.transport import TransportError
from commitments.retry import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_RPC_TIMEOUT = 30.0
# A connection failure is worth retrying; an RPC error answer or a decode error is not.
_RETRYABLE = (ConnectionError, TimeoutError, OSError, WebSocketException)


class RpcError(TransportError):
    """The node answered an RPC with an error object (code and message kept for the caller)."""

    def __init__(self, what: str, code: Any, message: str) -> None:
        super().__init__(f"{what}: node refused ({code}): {message}")
        self.code = code
        self.message = message



class SubstrateClient:
    """One websocket connection to a node, and the one method every RPC goes through."""

    def __init__(
        self,
        url: str,
        *,
        rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
        max_attempts: int = 6,
        backoff_base: float = 0.5,
        backoff_max: float = 15.0,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
            raise TransportError(f"a Substrate node URL must start with ws:// or wss://, got {url!r}")
        if not rpc_timeout > 0 or max_attempts < 1:
            raise TransportError("rpc_timeout must be positive and max_attempts at least 1")
        if not (backoff_base > 0 and backoff_max > 0):
            raise TransportError(
                f"backoff_base and backoff_max must be positive, got {backoff_base}, {backoff_max}"
            )
        self.url = url
        self.rpc_timeout = float(rpc_timeout)
        self.max_attempts = int(max_attempts)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self._backoff = Backoff(self.backoff_base, self.backoff_max)
        self.reconnects = 0
        self.ss58_format: int | None = None
        self._si: SubstrateInterface | None = None
        self._socket_lost = False
        self._lock = threading.RLock()

    def _connect(self) -> SubstrateInterface:
        si = SubstrateInterface(
            url=self.url,
            auto_reconnect=False,
            ws_options={"timeout": self.rpc_timeout},
        )
        try:
            si.init_runtime()
            if self.ss58_format is None:
                prefix = si.get_constant("System", "SS58Prefix")
                self.ss58_format = int(prefix.value) if prefix is not None else 42
            si.ss58_format = self.ss58_format
        except BaseException:
            si.close()
            raise
        return si

    def _drop(self) -> None:
        si, self._si = self._si, None
        if si is not None:
            try:
                si.close()
            except Exception:  # a dead socket may fail to close; it is gone either way
                pass

    def _lose_socket(self) -> None:
        """Close the socket but keep the interface: its decoded metadata is costly to rebuild."""
        if self._si is not None:
            try:
                self._si.transport.close()
            except Exception:
                pass
            self._socket_lost = True

    def _ready(self) -> SubstrateInterface:
        if self._si is None:
            self._si = self._connect()
            self._socket_lost = False
        elif self._socket_lost:
            # A fresh websocket under the same interface; request ids keep counting up, so a
            # late answer to a request on the old socket can never be taken for a new one.
            self._si.connect_websocket()
            self._socket_lost = False
            log.info("reconnected to %s", self.url)
        return self._si

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry `attempt` (1-based): the project's one retry policy
        (commitments.retry: capped exponential, full jitter)."""
        return self._backoff.delay(attempt - 1)

    def backoff_window(self, attempt: int) -> float:
        """The largest wait `backoff(attempt)` can draw."""
        return self._backoff.window(attempt - 1)

    def call(self, what: str, fn: Callable[[SubstrateInterface], T], *, retry: bool = True) -> T:
        """Run `fn(interface)`: the choke point for every RPC (timeout, retry, reconnect)."""
        attempts = self.max_attempts if retry else 1
        last: BaseException | None = None
        with self._lock:
            for attempt in range(1, attempts + 1):
                try:
                    return fn(self._ready())
                except SubstrateRequestException as exc:
                    err = exc.args[0] if exc.args else {}
                    if isinstance(err, dict):
                        raise RpcError(what, err.get("code"), str(err.get("message", err))) from None
                    raise RpcError(what, None, str(err)) from None
                except TransportError:
                    raise
                except _RETRYABLE as exc:
                    last = exc
                    self._lose_socket()
                    self.reconnects += 1
                    if attempt == attempts:
                        break
                    delay = self.backoff(attempt)
                    log.warning(
                        "%s: connection to %s failed (%s: %s); retry %d/%d in %.2f s",
                        what,
                        self.url,
                        type(exc).__name__,
                        exc,
                        attempt,
                        attempts - 1,
                        delay,
                    )
                    time.sleep(delay)
                except Exception as exc:
                    # An answer we cannot use (or cannot encode for) is reported, never a crash.
                    raise TransportError(
                        f"{what} failed against {self.url}: {type(exc).__name__}: {exc}"
                    ) from None
        raise TransportError(
            f"{what}: {self.url} unreachable after {attempts} attempt(s): {type(last).__name__}: {last}"
        )

    def rpc(self, method: str, params: list[Any], *, retry: bool = True) -> Any:
        """A raw JSON-RPC request through the choke point; returns the `result` member."""

        def run(si: SubstrateInterface) -> Any:
            reply = si.rpc_request(method, params)
            if "error" in reply:
                raise SubstrateRequestException(reply["error"])
            return reply.get("result")

        return self.call(method, run, retry=retry)

    def ensure_connected(self) -> None:
        self.call("connect", lambda si: None)

    def close(self) -> None:
        with self._lock:
            self._drop()
