"""Replays on a real Ray cluster on localhost (`ray start --head` and a second node, shared by the
module): a whole protocol round through the cluster with its replay worker killed mid-task, and
a task past its budget cancelled across the cluster boundary. The request sizing is pure."""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time

import pytest
import sqlalchemy as sa

from chain.protocol import ProtocolParams
from tests.miner.helpers import tiny_spec
from tests.node.harness import Network, in_process_node

# Blocks every 0.25 s: a 60 s commit window leaves the stages room on a loaded machine.
PARAMS = ProtocolParams(commit_window=240, reveal_window=24, opening_deadline=40, challenge_delay=4,
                        quorum_min_reveals=1, challenges_per_run=1, forced_challenge_steps=(7,))


def test_requests_are_sized_from_the_spec():
    from commitments.spec import Spec
    from node.cluster import MIB, fallback_resources, replay_resources

    small = tiny_spec(8)
    r = replay_resources(small, 100_000)
    assert r.cpus == 1 and r.memory % MIB == 0 and r.memory > 100_000
    big = Spec.from_dict(
        {
            "model": {
                "kind": "gpt",
                "vocab_size": 50304,
                "block_size": 1024,
                "n_layer": 12,
                "n_head": 12,
                "n_embd": 768,
            },
            "batch": {"batch_size": 8, "seq_len": 1024},
        }
    )
    rb = replay_resources(big, 2_000_000_000)
    assert rb.cpus == 5  # 124M parameters: one CPU per 25M
    assert rb.memory > 8 * 124_000_000 * 8  # the batch's float64 partials dominate
    native = Spec.from_dict(small.canonical() | {"profile": "torch-native",
                                                 "hardware": {"device": "cpu", "threads": 3}})
    assert replay_resources(native, 1).cpus == 3
    assert fallback_resources(10 * MIB).memory >= 60 * MIB


def test_config_needs_an_address_for_ray(tmp_path):
    from node.config import ConfigError, load_config

    p = tmp_path / "node.toml"
    p.write_text('[replay]\nbackend = "ray"\n')
    with pytest.raises(ConfigError, match="address"):
        load_config(p)
    p.write_text('[replay]\nbackend = "ray"\naddress = "127.0.0.1:6379"\n')
    assert load_config(p).replay.backend == "ray"
    assert load_config(None).replay.backend == "local"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from devnet.ray_cluster import start_cluster

    c = start_cluster(tmp_path_factory.mktemp("ray-logs"))
    yield c
    c.stop()


@pytest.mark.slow
@pytest.mark.e2e
def test_round_through_the_cluster_survives_a_killed_worker(tmp_path, cluster):
    from node.db import challenges, open_database, stage_log

    net = Network(tmp_path, PARAMS, interval=0.25)
    try:
        cfg = net.node_config(
            "v1",
            replay={"backend": '"ray"', "address": f'"{cluster.address}"', "timeout_s": 300},
            schedule={"block_time_s": 0.25},
        )
        net.start_node("v1", cfg)
        run = net.start_run(steps=8)
        assert run.opened.wait(120), "the miner never saw its challenge"
        killed = None
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline:
            for pid in cluster.worker_pids("ray::pot-replay-"):
                os.kill(pid, signal.SIGKILL)  # the worker process running the challenge's task
                killed = pid
                break
            time.sleep(0.05)
        assert killed is not None, "no cluster worker ever ran the replay:\n" + net.log("v1")[-3000:]
        view = net.wait_resolved(run.challenge_id, 180)
        ch = view.state.challenges[run.challenge_id]
        assert ch.verdict == "honest" and "v1" in ch.reveals, net.log("v1")[-3000:]
        engine = open_database(f"sqlite:///{tmp_path / 'v1-data' / 'node.db'}")
        with engine.connect() as c:
            job = c.execute(sa.select(challenges)).one()
            rows = list(c.execute(sa.select(stage_log).order_by(stage_log.c.id)))
        engine.dispose()
        assert job.matches_leaf is True and job.opening_path is None  # the node kept no opening
        # validation ran on the worker, inside the replay task
        assert [r.stage for r in rows][:4] == ["awaiting_opening", "fetch", "losschecks", "replay"]
        replay = next(r for r in rows if r.stage == "replay")
        assert replay.detail.startswith("matches leaf t (on ") and "fetch_s" in replay.detail
        assert f":{killed}:" not in replay.detail  # a new worker process ran the retried task
    finally:
        net.close()


class _Trickle(http.server.BaseHTTPRequestHandler):
    """A prover that sends an opening's header (a 4000-byte manifest to come), then a byte every 0.2 s."""

    stopped = threading.Event()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        from challenges.opening import MAGIC

        self.send_response(200)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        try:
            self.wfile.write(MAGIC + (4000).to_bytes(4, "big"))
            while not self.stopped.wait(0.2):
                self.wfile.write(b"P")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
@pytest.mark.e2e
def test_a_task_past_its_budget_is_cancelled_on_the_cluster(cluster):
    from node.cluster import ClusterReplays, RemoteOpening, Resources
    from node.egress import EgressPolicy
    from node.fetch import FetchPolicy
    from node.pipeline import ChainFacts

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    replays = ClusterReplays(cluster.address, 1, 600.0)
    try:
        facts = ChainFacts(
            b"\x01" * 32,
            b"\x02" * 32,
            1,
            b"\x03" * 32,
            b"\x04" * 32,
            b"\x05" * 32,
            b"\x06" * 32,
            b"\x07" * 32,
            2,
        )
        policy = FetchPolicy(egress=EgressPolicy.from_allow(["127.0.0.1"]), attempts=1)
        uri = f"http://127.0.0.1:{server.server_address[1]}/openings/x"
        replays.start(b"k" * 32, None, facts, max_bytes=10**7, timeout_s=15.0,
                      remote=RemoteOpening(uri, uri, policy, Resources(1, 256 << 20)))
        assert replays.free() == 0 and replays.running(b"k" * 32)
        done = []
        end = time.monotonic() + 60
        while not done and time.monotonic() < end:
            done = replays.poll()
            time.sleep(0.2)
        assert done, "the task was neither finished nor cancelled"
        (key, msg) = done[0]
        assert key == b"k" * 32 and msg["ok"] is False and msg["timeout"] is True, msg
        assert replays.free() == 1
        end = time.monotonic() + 30
        while cluster.worker_pids("ray::pot-replay-") and time.monotonic() < end:
            time.sleep(0.2)
        assert not cluster.worker_pids("ray::pot-replay-")
    finally:
        replays.shutdown()
        _Trickle.stopped.set()
        server.shutdown()


@pytest.fixture
def local_node(tmp_path):
    """An in-process daemon with the local pool, on its own dev chain and database."""
    n, engine = in_process_node(tmp_path, tmp_path / "c.db")
    n.head = 100
    yield n
    n.shutdown()
    engine.dispose()


def test_a_job_fetched_on_the_cluster_is_fetched_again_by_a_local_pool(local_node):
    """A node switched from the cluster back to its local pool holds no opening file for a job at
    replay: it goes back to fetch, never to a replay of a missing file."""
    from tests.node.test_deadlines import _add_job, _job

    node = local_node
    cid = b"\x0c" * 32
    _add_job(node, cid, "replay", "a")
    assert not node.cluster
    node.schedule()
    job = _job(node, cid)
    assert job.stage == "fetch" and "cluster" in job.status
    assert not node.replays.running(cid)
