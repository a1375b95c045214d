"""Child processes of a local network: `python -m pot ...` started in their own sessions with a
log file each, stopped in order (SIGTERM, a grace period, SIGKILL of the group), and free ports
to give them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (another process may still take it before the child binds)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, host: str = "127.0.0.1", avoid: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """n distinct ports, none in `avoid`, each free a moment ago. Every socket stays bound until all n
    are chosen, so the kernel cannot hand one port out twice (n calls of free_port can)."""
    chosen: list[socket.socket] = []
    skipped: list[socket.socket] = []  # bound too, so that they are not offered again
    try:
        while len(chosen) < n:
            if len(skipped) > 1000:
                raise OSError(f"no {n} free ports outside the {len(avoid)} to avoid")
            s = socket.socket()
            s.bind((host, 0))
            (skipped if s.getsockname()[1] in avoid else chosen).append(s)
        return [s.getsockname()[1] for s in chosen]
    finally:
        for s in chosen + skipped:
            s.close()


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 2500) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class Children:
    """Processes a local network started, each in its own session so a terminal's Ctrl-C reaches
    only the parent, which then stops them in order: SIGTERM, a grace period, then SIGKILL of the
    whole group (a node's replay workers included)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.items: list[Child] = []
        self._lock = threading.Lock()

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Child:
        """Start `python -m pot *args` in the work folder, logging to logs/<name>.log."""
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # The children's settings are the files the parent wrote: a POT_* variable left in the shell
        # (an operator's POT_CHAIN_URL, say) would otherwise override them.
        base = {k: v for k, v in os.environ.items() if not k.startswith("POT_")}
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pot", *args], cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                env={**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get(
                    "PYTHONPATH")])), "PYTHONUNBUFFERED": "1", **(env or {})})
        child = Child(name, proc, log)
        with self._lock:
            self.items.append(child)
        return child

    def stop(self, children: list[Child] | None = None, grace: float = 20.0) -> None:
        with self._lock:
            targets = list(self.items if children is None else children)
        for c in targets:
            if c.proc.poll() is None:
                try:
                    c.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for c in targets:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            # The leader may be gone while its workers linger: clear the group it led.
            try:
                os.killpg(c.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                c.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
