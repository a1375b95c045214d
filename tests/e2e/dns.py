"""A name server that takes every query and answers none, for a node process that runs in a mount
namespace of its own whose /etc/resolv.conf names it: every name the node looks up through the
system resolver stalls until the resolver's own timeout, as a miner's stalling DNS would. The
rest of the machine keeps its resolver. Needs root and `unshare` (util-linux); `unavailable()`
says why not, for a test to skip that part with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

HOST = "127.0.0.153"  # a loopback address of its own, so port 53 is free for it
# Under `sh -c`, $0 is the resolv.conf to mount and "$@" the command the node runs.
_MOUNT = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'


class SilentNameServer:
    """UDP port 53 on HOST: counts the queries, never sends a byte."""

    def __init__(self, tmp: Path) -> None:
        self.resolv = tmp / "resolv.conf"
        # glibc's defaults, written out: 5 s a try, two tries, A and AAAA in parallel.
        self.resolv.write_text(f"nameserver {HOST}\noptions timeout:5 attempts:2\n")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((HOST, 53))
        self.sock.settimeout(0.2)
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1

    def wrap(self) -> list[str]:
        """The command line a process runs under to see this server as its only resolver."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT, str(self.resolv)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def unavailable(tmp: Path) -> str | None:
    """Why a silent name server cannot be set up here (None: it can)."""
    if os.geteuid() != 0:
        return "a private /etc/resolv.conf needs root"
    if shutil.which("unshare") is None:
        return "no unshare (util-linux) on PATH"
    probe = tmp / "resolv-probe.conf"
    probe.write_text(f"nameserver {HOST}\n")
    try:
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT, str(probe),
                              "cat", "/etc/resolv.conf"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if out.returncode != 0 or HOST not in out.stdout:
        return f"unshare --mount could not replace /etc/resolv.conf: {out.stderr.strip()[:200]}"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((HOST, 53))
    except OSError as exc:
        return f"cannot listen on {HOST}:53: {exc}"
    return None
