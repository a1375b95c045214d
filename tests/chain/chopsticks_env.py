"""A real Substrate runtime for the chain tests: chopsticks running the Rococo Asset Hub genesis.

One chopsticks process per pytest session (`chopsticks_node()` / the `chopsticks` fixture), on a
free local port, built from the chain spec shipped in npm `@substrate/connect-known-chains`.
Accounts are funded with `dev_setStorage`; blocks are made on demand with `dev_newBlock`. In
chopsticks the finalized head is always the best head (see docs/chopsticks.md), so every block
made here is final at once. `make_network(params)` gives the shared protocol suite a fresh chain
each time by rewinding the head (`dev_setHead`) to the block the session started from.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from devnet.procs import free_port
from tests.chain.network import ACCOUNTS, Network

if TYPE_CHECKING:
    from chain.protocol import ProtocolParams
    from chain.substrate import RemarkTransport

REPO = Path(__file__).resolve().parents[2]
CHOPSTICKS_BIN = REPO / "node_modules" / ".bin" / "chopsticks"
SPEC_MODULE = REPO / "node_modules" / "@substrate" / "connect-known-chains" / "dist" / "commonjs" / "specs"
SPEC_FILE = SPEC_MODULE / "rococo_v2_2_asset_hub.js"
START_TIMEOUT = float(os.environ.get("POT_CHOPSTICKS_START_TIMEOUT", "180"))
RPC_TIMEOUT = 30.0
# Enough for fees of thousands of remarks (ROC has 12 decimals).
FUNDS = 10**18


MAX_MEMORY_BLOCKS = 20_000


class ChopsticksError(RuntimeError):
    """chopsticks could not be prepared, started or driven; the message says which and why."""


def export_genesis(dest: Path) -> Path:
    """Write the Rococo Asset Hub chain spec (export `chainSpec`, a JSON string) to `dest`."""
    if not SPEC_FILE.is_file():
        raise ChopsticksError(
            f"{SPEC_FILE} is missing: run `npm install` (scripts/setup --test does) at {REPO}"
        )
    script = f"process.stdout.write(require({json.dumps(str(SPEC_FILE))}).chainSpec)"
    try:
        out = subprocess.run(["node", "-e", script], capture_output=True, timeout=60, check=True)
    except FileNotFoundError:
        raise ChopsticksError("node is not on PATH; Node 20 is needed to run chopsticks") from None
    except subprocess.CalledProcessError as exc:
        raise ChopsticksError(
            f"exporting the chain spec failed: {exc.stderr.decode(errors='replace')[-2000:]}"
        ) from None
    except subprocess.TimeoutExpired:
        raise ChopsticksError("exporting the chain spec took over 60 s") from None
    spec = json.loads(out.stdout)  # refuse a broken export here rather than inside chopsticks
    if "genesis" not in spec:
        raise ChopsticksError(f"{SPEC_FILE} export chainSpec has no genesis")
    dest.write_bytes(out.stdout)
    return dest


class Chopsticks:
    """One chopsticks process and a JSON-RPC client for its dev_* methods."""

    def __init__(self, workdir: Path | None = None, *, build_block_mode: str = "Instant") -> None:
        if workdir is None:
            # Kept after the session (only the log stays), so a failed CI run can be read later.
            workdir = Path(tempfile.mkdtemp(prefix="pot-chopsticks-"))
        self.workdir = workdir
        self.build_block_mode = build_block_mode
        self.log_path = workdir / "chopsticks.log"
        self.genesis_path = workdir / "rococo_asset_hub.json"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._http = httpx.Client(timeout=RPC_TIMEOUT)
        self._rpc_id = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self) -> Chopsticks:
        """Export the genesis, start chopsticks, and wait until its RPC answers."""
        if not CHOPSTICKS_BIN.exists():
            raise ChopsticksError(
                f"{CHOPSTICKS_BIN} is missing: run `npm install` (scripts/setup --test does) at {REPO}"
            )
        if not self.genesis_path.exists():
            export_genesis(self.genesis_path)
        t0 = time.monotonic()
        self.port = free_port()
        cmd = [
            str(CHOPSTICKS_BIN),
            "--genesis",
            str(self.genesis_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--build-block-mode",
            self.build_block_mode,
            "--runtime-log-level",
            "0",
            # chopsticks keeps 500 blocks in memory by default and answers older ones empty: a
            # follower replaying a long test chain from block 1 (the demo's: 500+ blocks) needs them
            "--max-memory-block-count",
            str(MAX_MEMORY_BLOCKS),
        ]
        log = open(self.log_path, "ab")
        try:
            # Own process group: stop() must reach the node process chopsticks spawns under npx/sh.
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = t0 + START_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise ChopsticksError(
                    f"chopsticks exited during start-up; log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                self.rpc("chain_getFinalizedHead", [], timeout=2.0)
                self.startup_seconds = time.monotonic() - t0
                return self
            except (httpx.HTTPError, ChopsticksError) as exc:
                last = exc
                time.sleep(0.25)
        self.stop()
        raise ChopsticksError(
            f"chopsticks did not answer within {START_TIMEOUT:.0f} s ({last}); log "
            f"{self.log_path}:\n{self.log_tail()}"
        )

    def restart(self) -> None:
        """Stop and start again on a new port (a fresh chain from genesis)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        self._http.close()
        self.genesis_path.unlink(missing_ok=True)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"

    # --- JSON-RPC over HTTP (chopsticks serves it on the websocket port) -----------------------

    def rpc(self, method: str, params: list[Any], *, timeout: float = RPC_TIMEOUT) -> Any:
        with self._lock:
            self._rpc_id += 1
            body = {"jsonrpc": "2.0", "id": self._rpc_id, "method": method, "params": params}
        r = self._http.post(f"http://127.0.0.1:{self.port}", json=body, timeout=timeout)
        r.raise_for_status()
        data = r.json()
        if "error" in data:
            raise ChopsticksError(f"{method}: {data['error']}")
        return data.get("result")

    def head(self) -> tuple[int, str]:
        """(number, hash) of the head, which chopsticks also reports as finalized."""
        h = self.rpc("chain_getFinalizedHead", [])
        return int(self.rpc("chain_getHeader", [h])["number"], 16), h

    def new_blocks(self, count: int = 1) -> int:
        if count > 0:
            self.rpc("dev_newBlock", [{"count": count}], timeout=max(RPC_TIMEOUT, 5.0 * count))
        return self.head()[0]

    def set_head(self, block_hash: str) -> None:
        self.rpc("dev_setHead", [block_hash])

    def fund(self, addresses: list[str], amount: int = FUNDS) -> None:
        """Give each account `amount` free balance (decimal string: u128 exceeds JSON numbers)."""
        entries = [[[a], {"providers": 1, "data": {"free": str(amount)}}] for a in addresses]
        self.rpc("dev_setStorage", [{"System": {"Account": entries}}])


_NODE: Chopsticks | None = None
_NODE_LOCK = threading.Lock()
_BASE: tuple[int, str] | None = None


def chopsticks_node() -> Chopsticks:
    """The session's chopsticks, started on first use and stopped when the interpreter exits."""
    global _NODE, _BASE
    with _NODE_LOCK:
        if _NODE is None or _NODE.proc is None or _NODE.proc.poll() is not None:
            node = Chopsticks()
            try:
                node.start()
                _BASE = node.head()
            except BaseException:
                node.close()
                raise
            _NODE = node
            atexit.register(stop_chopsticks)
        return _NODE


def stop_chopsticks() -> None:
    global _NODE
    with _NODE_LOCK:
        node, _NODE = _NODE, None
    if node is not None:
        node.close()


@pytest.fixture(scope="session")
def chopsticks():
    """The session's chopsticks process; fails loudly (never skips) when it cannot start."""
    try:
        node = chopsticks_node()
    except ChopsticksError as exc:
        pytest.fail(f"chopsticks could not start: {exc}", pytrace=False)
    yield node
    stop_chopsticks()


def fresh_chain(node: Chopsticks) -> int:
    """Rewind the head to the block the session started from, so a test sees a fresh chain."""
    if _BASE is None:
        raise ChopsticksError("chopsticks has no base block recorded")
    node.set_head(_BASE[1])
    return _BASE[0]


def unique_key(label: str) -> str:
    """A dev-derivation URI no other test uses, so accounts and nonces never collide."""
    return f"//pot//{secrets.token_hex(6)}//{label}"


class ChopsticksNetwork(Network):
    """The protocol suite's Network over the remark transport on chopsticks."""

    def __init__(self, params: ProtocolParams, node: Chopsticks | None = None) -> None:
        from chain.keys import load_key
        from chain.substrate import RemarkTransport, SubstrateClient

        self.params = params
        self.node = node or chopsticks_node()
        fresh_chain(self.node)
        # One connection for all accounts: the client serialises its RPCs, and five metadata
        # downloads per test would dominate the suite's run time.
        self.client = SubstrateClient(self.node.url)
        self._transports: dict[str, RemarkTransport] = {}
        try:
            self.client.ensure_connected()
            for name in ACCOUNTS:
                key = load_key(unique_key(name), ss58_format=self.client.ss58_format)
                self._transports[name] = RemarkTransport(self.client, key)
            self.node.fund([t.account for t in self._transports.values()])
        except BaseException:
            self.close()
            raise

    def transport(self, name: str) -> RemarkTransport:
        try:
            return self._transports[name]
        except KeyError:
            raise KeyError(f"no account {name!r}; accounts are {', '.join(ACCOUNTS)}") from None

    def advance(self, n: int = 1) -> int:
        return self.node.new_blocks(n)

    def close(self) -> None:
        self._transports.clear()
        self.client.close()


def make_network(params: ProtocolParams) -> ChopsticksNetwork:
    """A fresh chain on the session's chopsticks with funded accounts miner, v1..v4."""
    return ChopsticksNetwork(params)
