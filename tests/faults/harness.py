"""The node test network with faults to inject: the dev chain sealed by a process of its own (so the
chain node can be killed and restarted), a prover that can hang, throttle or refuse per run, and
helpers to SIGKILL a node from outside and to cut a PostgreSQL database off its clients.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from chain.protocol import ProtocolParams
from challenges.opening import OpeningRefused, load_opening
from tests.node.harness import REPO, Network


class FaultyProver:
    """Serves a Network's openings and leaves over HTTP; per run it can hang a number of opening
    requests (or all of them) and throttle bodies, and it records every request it saw."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hang_first: dict[bytes, int] = {}  # run id -> opening requests still to hang
        self.hang_always: set[bytes] = set()
        self.throttle_bps: int | None = None
        self.requests: list[dict[str, Any]] = []
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._runs: dict[str, bytes] = {}
        prover = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                prover._serve(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.http.server_address[1]}"

    def _run_of(self, path: Path) -> bytes | None:
        with self._lock:
            if path.name not in self._runs:
                try:
                    self._runs[path.name] = load_opening(path).run_id
                except OpeningRefused:
                    return None
            return self._runs[path.name]

    def _serve(self, req: http.server.BaseHTTPRequestHandler) -> None:
        parts = req.path.strip("/").split("/")
        run_id = None
        if len(parts) == 2 and parts[0] == "openings":
            path = self.root / "openings" / parts[1]
            run_id = self._run_of(path) if path.is_file() else None
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "leaves":
            path = self.root / "leaves" / parts[1]
        else:
            path = None
        rng = req.headers.get("Range")
        with self._lock:
            self.requests.append({"path": req.path, "range": rng, "run_id": run_id, "at": time.monotonic()})
            hang = run_id is not None and (run_id in self.hang_always or self.hang_first.get(run_id, 0) > 0)
            if run_id is not None and self.hang_first.get(run_id, 0) > 0:
                self.hang_first[run_id] -= 1
        if hang:
            # Accept and never answer: the client's read timeout has to fire.
            self._release.wait(120)
            return
        if path is None or not path.is_file():
            req.send_error(404)
            return
        data = path.read_bytes()
        start = 0
        if rng and rng.startswith("bytes=") and rng.endswith("-") and rng[6:-1].isdigit():
            start = int(rng[6:-1])
            if start >= len(data):
                req.send_error(416)
                return
            req.send_response(206)
            req.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            req.send_response(200)
        req.send_header("Content-Length", str(len(data) - start))
        req.end_headers()
        try:
            if self.throttle_bps and run_id is not None:
                chunk = max(1024, self.throttle_bps // 20)
                for i in range(start, len(data), chunk):
                    req.wfile.write(data[i:i + chunk])
                    req.wfile.flush()
                    time.sleep(chunk / self.throttle_bps)
            else:
                req.wfile.write(data[start:])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-body (a killed node): it resumes later

    def close(self) -> None:
        self._release.set()
        self.http.shutdown()
        self.http.server_close()


class FaultNetwork(Network):
    """tests/node/harness.Network with the faulty prover and a sealer process instead of a thread."""

    def __init__(self, tmp: Path, params: ProtocolParams, *, interval: float = 0.5) -> None:
        super().__init__(tmp, params, interval=interval)
        # The base class seals from a thread and serves from a plain server; swap both before any
        # run registers its endpoint. Its miner threads read self._stop, so they get a fresh one.
        self._stop.set()
        self._sealer.join(10)
        self._stop = threading.Event()
        self.http.shutdown()
        self.http.server_close()
        self.prover = FaultyProver(self.served)
        self.endpoint = self.prover.endpoint
        self.interval = interval
        self.sealer: subprocess.Popen | None = None
        self.start_sealer()

    def start_sealer(self) -> None:
        log = open(self.tmp / "sealer.log", "ab")  # noqa: SIM115 - the process owns it
        self.sealer = subprocess.Popen(
            [sys.executable, "-m", "pot", "chain", "dev", "--db", str(self.chain_path), "--interval",
             str(self.interval)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)})

    def kill_sealer(self) -> None:
        assert self.sealer is not None
        self.sealer.send_signal(signal.SIGKILL)
        self.sealer.wait(10)

    def head(self) -> int:
        from chain.dev import DevTransport

        t = DevTransport(self.chain_path, "observer")
        try:
            return t.finalized_head()
        finally:
            t.close()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.prover.close()
            if self.sealer is not None and self.sealer.poll() is None:
                self.sealer.terminate()
                try:
                    self.sealer.wait(10)
                except subprocess.TimeoutExpired:
                    self.sealer.kill()
                    self.sealer.wait(5)


def children(pid: int) -> list[int]:
    """Direct child processes of `pid` (from /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill9(proc: subprocess.Popen) -> list[int]:
    """SIGKILL a node process from outside; returns the children it left behind (replay workers)."""
    kids = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(20) == -9
    return kids


def wait_for(predicate, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what}: not within {timeout:g} s")


def pg_restart(admin: sa.Engine, down_seconds: float) -> None:
    """Restart the PostgreSQL server itself (Debian's pg_ctlcluster): every session is cut, the
    server refuses connections for `down_seconds`, then comes back. Needs root, as CI runs."""
    ctl = shutil.which("pg_ctlcluster")
    clusters = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if ctl is None or not clusters or os.geteuid() != 0:
        raise RuntimeError("restarting PostgreSQL needs root and Debian's pg_ctlcluster with a cluster "
                           "under /etc/postgresql (the database test machines have both)")
    version = clusters[-1]

    def ctl_run(action: str, *extra: str) -> None:
        subprocess.run([ctl, "--skip-systemctl-redirect", version, "main", action, *extra],
                       check=True, timeout=60, capture_output=True)

    admin.dispose()
    ctl_run("stop", "--mode", "fast")
    try:
        time.sleep(down_seconds)
    finally:
        ctl_run("start")

    def accepting() -> bool:
        try:
            with admin.connect() as c:
                c.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.OperationalError:
            admin.dispose()
            return False

    wait_for(accepting, 60, "PostgreSQL accepting connections after the restart", poll=0.25)
