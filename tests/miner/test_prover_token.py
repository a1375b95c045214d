"""A verifier node's fetch (stage_fetch: the opening, then the run's leaf list) against a prover
started as `pot miner serve --token`: it succeeds with no token, as every verifier's must."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from challenges.opening import load_opening, verify_leaves
from commitments import merkle
from node.config import NodeConfig
from node.pipeline import stage_fetch
from tests.miner.helpers import served_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _node_policy():
    """The node's own fetch policy with 127.0.0.1 opened in its egress allow-list, as the tests and
    the demo name it."""
    return NodeConfig.model_validate({"fetch": {"allow": ["127.0.0.1"], "attempts": 1}}).fetch.policy()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return served_run(tmp_path_factory.mktemp("prover-token"))


def test_a_node_fetch_succeeds_against_a_prover_started_with_a_token(run, tmp_path):
    run_dir, run_id, d, data, leaves = run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": ROOT, "POT_PROVER_TOKEN": ""}
    cmd = [
        sys.executable,
        "-m",
        "pot",
        "miner",
        "serve",
        str(run_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--token",
        "prover-admin-token-0123456789",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "the prover exited"
            try:
                if httpx.get(f"{endpoint}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the prover did not start"
            time.sleep(0.2)
        out = stage_fetch(
            uri=f"openings/{d.hex()}",
            endpoint=endpoint,
            run_id=run_id,
            dest=tmp_path / "o.opening",
            leaves_dest=tmp_path / "leaves.cbor",
            max_opening_bytes=len(data) + 1024,
            max_leaves_bytes=1 << 20,
            policy=_node_policy(),
        )
        assert out.ok, (out.refusal_class, out.reason)
        assert "leaves_error" not in out.data, out.data["leaves_error"]
        assert (tmp_path / "o.opening").read_bytes() == data
        assert load_opening(tmp_path / "o.opening").digest == d
        got = verify_leaves((tmp_path / "leaves.cbor").read_bytes(), merkle.root(leaves), len(leaves))
        assert [x.to_bytes() for x in got] == leaves
        # The token still guards the miner's private listing.
        assert httpx.get(f"{endpoint}/admin/store", timeout=5).status_code == 401
        r = httpx.get(
            f"{endpoint}/admin/store",
            headers={"Authorization": "Bearer prover-admin-token-0123456789"},
            timeout=5,
        )
        assert r.status_code == 200 and r.json()["openings"][0]["digest"] == d.hex()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
