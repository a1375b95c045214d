"""A real Ray cluster on localhost (tests, bench/load.py): `ray start --head` and more nodes
(`ray start --address`), each a process group of its own with free ports and a private temp dir,
stopped by killing exactly those groups (never `ray stop`, which stops every Ray on the host).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devnet.procs import free_port

REPO = Path(__file__).resolve().parents[1]


def _ray_bin() -> str:
    import sys

    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else "ray"


def _ports() -> list[str]:
    # Every port a Ray node listens on, free a moment ago; worker ports are a list of free ones.
    workers = ",".join(str(free_port()) for _ in range(6))
    return ["--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-agent-grpc-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
            "--worker-port-list", workers]


@dataclass
class RayCluster:
    address: str
    temp: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def worker_pids(self, title: str) -> list[int]:
        """PIDs of this cluster's worker processes whose title is `title` (e.g. ray::pot-replay-: a replay task of node.cluster)."""
        sids = {os.getsid(p.pid) for p in self.procs.values() if p.poll() is None}
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if cmd.startswith(title) and os.getsid(int(d.name)) in sids:
                    out.append(int(d.name))
            except (OSError, ProcessLookupError):
                continue
        return out

    def stop(self) -> None:
        """SIGTERM, a short grace, then SIGKILL to each node's process group (raylet, GCS, workers)."""
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 3
        for p in self.procs.values():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
        shutil.rmtree(self.temp, ignore_errors=True)


def start_cluster(log_dir: Path, *, nodes: int = 2, timeout: float = 150.0) -> RayCluster:
    """`nodes` Ray nodes of 1 CPU each on 127.0.0.1 (the head and nodes - 1 more); returns once all are up."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths must fit
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    common = ["--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    cluster = RayCluster(f"127.0.0.1:{port}", temp)
    ray = _ray_bin()

    def launch(name: str, args: list[str]) -> None:
        log = open(log_dir / f"ray-{name}.log", "ab")  # noqa: SIM115 - the process owns it
        cluster.procs[name] = subprocess.Popen([ray, "start", *args, *common, *_ports()], cwd=REPO, env=env,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    try:
        launch("head", ["--head", "--port", str(port), "--temp-dir", str(temp), "--include-dashboard", "false",
                        "--ray-client-server-port", str(free_port())])
        _wait_nodes(cluster, 1, timeout, log_dir)
        for k in range(1, nodes):
            launch(f"worker{k}", ["--address", cluster.address])
            _wait_nodes(cluster, k + 1, timeout, log_dir)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_nodes(cluster: RayCluster, n: int, timeout: float, log_dir: Path) -> None:
    """Until the head's GCS lists n live nodes (asked by `ray status`, a separate short process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p in cluster.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"ray {name} exited with {p.returncode}: "
                                   f"{(log_dir / f'ray-{name}.log').read_text(errors='replace')[-2000:]}")
        r = subprocess.run([_ray_bin(), "status", "--address", cluster.address], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
        if r.returncode == 0 and r.stdout.count("node_") >= n:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the Ray cluster did not show {n} node(s) within {timeout:.0f} s")
