"""A real Ray cluster on localhost (tests, bench/load.py): `ray start --head` and more nodes
(`ray start --address`), each a process group of its own with free ports and a private temp dir,
stopped by killing exactly those groups (never `ray stop`, which stops every Ray on the host).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devnet.procs import free_ports

REPO = Path(__file__).resolve().parents[1]


def _ray_bin() -> str:
    import sys

    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else "ray"


# A node that dies on a port another process took between our choice and its bind is started
# again with fresh ports, at most this many times in all, after a short jittered pause.
PORT_CLASH = "is trying to use a port number"
LAUNCH_TRIES = 3


class _Ports:
    """Ports for one cluster's nodes: distinct from each other and from every port handed out before."""

    def __init__(self) -> None:
        self.given: set[int] = set()

    def take(self, n: int) -> list[int]:
        out = free_ports(n, avoid=self.given)
        self.given.update(out)
        return out

    def node_args(self) -> list[str]:
        # Every port a Ray node listens on; worker ports are a list of six.
        p = self.take(12)
        return ["--node-manager-port", str(p[0]), "--object-manager-port", str(p[1]),
                "--dashboard-agent-grpc-port", str(p[2]), "--dashboard-agent-listen-port", str(p[3]),
                "--metrics-export-port", str(p[4]), "--runtime-env-agent-port", str(p[5]),
                "--worker-port-list", ",".join(str(x) for x in p[6:12])]


@dataclass
class RayCluster:
    address: str
    temp: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def worker_pids(self, title: str) -> list[int]:
        """PIDs of this cluster's worker processes whose title is `title` (e.g. ray::pot-replay-: a
        replay task of node.cluster)."""
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
    ports = _Ports()
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    common = ["--block", "--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
    cluster = RayCluster("", temp)
    ray = _ray_bin()

    def launch(name: str, args: list[str]) -> None:
        log = open(log_dir / f"ray-{name}.log", "ab")  # noqa: SIM115 - the process owns it
        cluster.procs[name] = subprocess.Popen([ray, "start", *args, *common, *ports.node_args()], cwd=REPO,
                                               env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)

    def head() -> None:
        gcs, client = ports.take(2)
        cluster.address = f"127.0.0.1:{gcs}"
        launch("head", ["--head", "--port", str(gcs), "--temp-dir", str(temp), "--include-dashboard", "false",
                        "--ray-client-server-port", str(client)])

    def up(name: str, start, n: int) -> None:
        for attempt in range(1, LAUNCH_TRIES + 1):
            start()
            try:
                _wait_nodes(cluster, n, timeout, log_dir)
                return
            except RuntimeError as e:
                if PORT_CLASH not in str(e) or attempt == LAUNCH_TRIES:
                    raise
                cluster.procs.pop(name).wait(10)
                time.sleep(0.5 * attempt + random.uniform(0, 0.5))

    try:
        up("head", head, 1)
        for k in range(1, nodes):
            up(f"worker{k}", lambda k=k: launch(f"worker{k}", ["--address", cluster.address]), k + 1)
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
        r = subprocess.run(
            [_ray_bin(), "status", "--address", cluster.address],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )
        if r.returncode == 0 and r.stdout.count("node_") >= n:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the Ray cluster did not show {n} node(s) within {timeout:.0f} s")
