"""The deployment files for real: `deploy/image` builds the base image from Debian packages
(debootstrap + docker import), fills the wheelhouse and builds the pot and PostgreSQL images; the
stack of docker-compose.stack.yml (a verifier node on PostgreSQL, the dev chain, a miner) comes up,
the node answers /readyz, the miner's challenge resolves honest in the node's API (and its row is in
PostgreSQL), the node container restarts and comes back ready with what it knew. Everything the
stack made (containers, network, volumes) is removed at the end, pass or fail.

Skipped, with the reason, where no container engine can start (no docker client or dockerd, or not
root to start one). The images are built once and found again by later runs (the base image by the
hash of its recipe, the wheelhouse by pyproject.toml, the image layers by the builder's cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from devnet.procs import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "docker-compose.stack.yml"
IMAGE = REPO / "deploy/image"
BUILD_TIMEOUT_S = 1800  # cold: debootstrap with PostgreSQL, pip download, the torch layer
READY_TIMEOUT_S = 240
RESOLVE_TIMEOUT_S = 420


def compose_command() -> list[str] | None:
    """`docker compose` (the v2 plugin) where the client has it, else `docker-compose`, else None."""
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def engine_or_skip() -> list[str]:
    """The compose command, once a Docker daemon answers (started by `deploy/image daemon` if need be)."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client (apt-get install docker.io; ./scripts/setup --test does as root)")
    r = subprocess.run([str(IMAGE), "daemon"], cwd=REPO, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"no container engine can start here: {r.stderr.strip().splitlines()[-1:]}")
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no docker compose plugin and no docker-compose (apt-get install docker-compose)")
    return cmd


def get(url: str, timeout: float = 5.0) -> tuple[int, dict]:
    """Status and JSON body of a GET; (0, {error}) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.load(exc)
        except ValueError:
            return exc.code, {}
    except (OSError, ValueError) as exc:
        return 0, {"error": f"{type(exc).__name__}: {exc}"}


def wait_for(what: str, probe, timeout: float, interval: float = 1.0):
    """Call probe() until it returns something truthy; its last value goes in the timeout's message."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last and last[0]:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s; last: {last}")


class Stack:
    def __init__(self, cmd: list[str], port: int) -> None:
        self.project = f"potstack{uuid.uuid4().hex[:8]}"
        self.base = [*cmd, "-p", self.project, "-f", str(STACK)]
        self.env = {**os.environ, "POT_STACK_PORT": str(port)}
        self.url = f"http://127.0.0.1:{port}"

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([*self.base, *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check:
            assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        return r

    def logs(self) -> str:
        r = self.run("logs", "--no-color", "--tail", "60", timeout=120, check=False)
        return r.stdout[-12000:] + r.stderr[-2000:]

    def ready(self) -> tuple[bool, dict]:
        code, body = get(f"{self.url}/readyz")
        return code == 200 and body.get("ready") is True, body


# Cold (no base image, wheelhouse or layers yet), deploy/image alone takes about nine minutes on two
# busy cores: past the suite's 900 s default.
@pytest.mark.timeout(BUILD_TIMEOUT_S + READY_TIMEOUT_S * 2 + RESOLVE_TIMEOUT_S + 600)
def test_docker_stack_builds_runs_resolves_and_restarts():
    cmd = engine_or_skip()
    t0 = time.monotonic()
    r = subprocess.run([str(IMAGE)], cwd=REPO, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, f"deploy/image failed ({r.returncode}):\n{r.stderr[-6000:]}"
    built_s = time.monotonic() - t0
    stack = Stack(cmd, free_port())
    try:
        stack.run("up", "-d", "--no-build", timeout=600)
        _, ready = wait_for("the node's /readyz passing", stack.ready, READY_TIMEOUT_S)
        assert set(ready["checks"]) >= {"database", "chain_head", "worker_pool", "determinism"}
        up_s = time.monotonic() - t0

        def resolved() -> tuple[bool, dict]:
            code, body = get(f"{stack.url}/api/v1/challenges?status=honest")
            return code == 200 and body.get("total", 0) >= 1, body

        _, listing = wait_for("a challenge resolving honest", resolved, RESOLVE_TIMEOUT_S, interval=2.0)
        challenge = listing["items"][0]
        assert challenge["step"] == 4 and challenge["verdict"] == "honest", challenge
        cid = challenge["challenge_id"]
        code, detail = get(f"{stack.url}/api/v1/challenges/{cid}")
        assert code == 200 and detail["verdict"] == "honest", detail
        # The node keeps its jobs in the stack's PostgreSQL, not in a file of its own.
        r = stack.run("exec", "-T", "postgres", "psql", "-U", "pot", "-d", "potnode", "-tAc",
                      "SELECT count(*) FROM challenges", timeout=60)
        assert int(r.stdout.strip()) >= 1, r.stdout
        resolved_s = time.monotonic() - t0
        code, status = get(f"{stack.url}/api/v1/status")
        assert code == 200, status
        cursor = status["cursor"]["block"]

        stack.run("restart", "node", timeout=180)
        _, ready = wait_for("the restarted node's /readyz passing", stack.ready, READY_TIMEOUT_S)
        code, again = get(f"{stack.url}/api/v1/challenges/{cid}")
        assert code == 200 and again["verdict"] == "honest", again
        code, status = get(f"{stack.url}/api/v1/status")
        assert code == 200 and status["cursor"]["block"] >= cursor, (cursor, status)
        # The miner trained, answered its challenge and went on to serve its run (its script stops
        # at the first command that fails).
        miner = stack.run("ps", "-q", "miner", timeout=60).stdout.strip()
        state = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}}", miner], capture_output=True,
                               text=True, timeout=60).stdout.strip()
        assert state == "running", f"the miner container is {state!r}"
        print(f"docker stack: images {built_s:.0f} s, ready at {up_s:.0f} s, resolved at {resolved_s:.0f} s, "
              f"restarted ready at {time.monotonic() - t0:.0f} s")
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.run("down", "-v", "--remove-orphans", "-t", "20", timeout=300, check=False)
    left = {kind: subprocess.run(["docker", kind, "ls", "-q", "--filter", f"label=com.docker.compose.project={stack.project}"]
                                 + (["-a"] if kind == "container" else []),
                                 capture_output=True, text=True, timeout=60).stdout.split()
            for kind in ("container", "network", "volume")}
    assert not any(left.values()), f"{stack.project} left behind: {left}"
