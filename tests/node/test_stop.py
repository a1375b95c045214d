"""A graceful stop: SIGTERM ends `pot node run` in under 3 s whatever work is in flight, with exit
code 0, and the restarted node finishes the challenge with nothing lost (a stopped replay runs
again without the stopped attempt counting, a stopped fetch resumes from its partial file)."""

from __future__ import annotations

import http.server
import json
import signal
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from chain.calls import CommitWitness, RevealWitnessValue
from chain.protocol import ProtocolParams
from commitments.spec import Spec
from node.db import challenges, open_database, stage_log, txs
from node.pipeline import ReplayPool, _Worker
from tests.node import harness
from tests.node.harness import Network, chain_calls

STOP_LIMIT_S = 3.0
# A GPT whose one exact-v1 step takes seconds (about 5 s on an idle two-core machine), so that a
# replay is still running when the stop comes; the run has that one step, challenged by force.
HEAVY = Spec.from_dict({"steps": 1, "model": {"kind": "gpt", "block_size": 64, "n_layer": 4, "n_head": 4,
                                              "n_embd": 256},
                        "batch": {"batch_size": 4, "seq_len": 64}, "rng": {"seed": 7, "schedule_seed": 11}})
PARAMS = ProtocolParams(commit_window=80, reveal_window=16, opening_deadline=20, challenge_delay=2,
                        quorum_min_reveals=1, challenges_per_run=1, forced_challenge_steps=(1,))


def _wait_log(net: Network, name: str, event: str, timeout: float) -> None:
    proc = net.nodes[name]
    deadline = time.monotonic() + timeout
    while f'"event":"{event}"' not in net.log(name):
        assert proc.poll() is None, f"{name} exited ({proc.returncode}):\n{net.log(name)[-3000:]}"
        assert time.monotonic() < deadline, f"no {event} within {timeout} s:\n{net.log(name)[-3000:]}"
        time.sleep(0.05)


def _stop(net: Network, name: str) -> float:
    """SIGTERM the node; the seconds until its process ended (it must end with code 0)."""
    proc = net.nodes[name]
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(60)
    took = time.monotonic() - started
    assert rc == 0, f"exit code {rc}:\n{net.log(name)[-3000:]}"
    return took


def _events(net: Network, name: str) -> list[dict]:
    return [json.loads(line) for line in net.log(name).splitlines() if line.startswith("{")]


def _job(db: Path):
    engine = open_database(f"sqlite:///{db}")
    try:
        with engine.connect() as c:
            job = c.execute(sa.select(challenges)).one()
            stages = [r.stage for r in c.execute(sa.select(stage_log).order_by(stage_log.c.id))]
            states = {(r.kind, r.state) for r in c.execute(sa.select(txs))}
        return job, stages, states
    finally:
        engine.dispose()


def _resolved_once(net: Network, run, name: str, timeout: float) -> None:
    view = net.wait_resolved(run.challenge_id, timeout)
    ch = view.state.challenges[run.challenge_id]
    assert ch.verdict == "honest" and name in ch.reveals and ch.committee == [name]
    calls = [c for _, _, c in chain_calls(net, name)]
    assert sum(isinstance(c, CommitWitness) for c in calls) == 1
    assert sum(isinstance(c, RevealWitnessValue) for c in calls) == 1


@pytest.mark.slow
def test_a_stop_during_a_replay_ends_in_under_3_s_and_the_replay_runs_again(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "tiny_spec", lambda steps, kind: HEAVY)
    net = Network(tmp_path, PARAMS, interval=0.5)
    try:
        cfg = net.node_config("v1")
        net.start_node("v1", cfg)
        run = net.start_run(steps=1)
        _wait_log(net, "v1", "replay_started", 240)
        time.sleep(1.0)
        took = _stop(net, "v1")
        events = [e.get("event") for e in _events(net, "v1")]
        assert took < STOP_LIMIT_S, f"the stop took {took:.2f} s:\n{net.log('v1')[-3000:]}"
        # The replay was stopped, not waited for: no result came before the node stopped.
        assert "stage_replay" not in events and events.index("replay_stopped") < events.index("node_stopped")
        stopped = next(e for e in _events(net, "v1") if e.get("event") == "node_stopped")
        assert stopped["replays_stopped"] == 1 and stopped["seconds"] < STOP_LIMIT_S
        job, _, _ = _job(tmp_path / "v1-data" / "node.db")
        assert (job.stage, job.attempts) == ("replay", 0), "the stopped attempt counts"
        assert "stopped by the node's shutdown" in job.status

        net.start_node("v1", cfg, init=False)
        _resolved_once(net, run, "v1", 240)
        time.sleep(1.5)  # the node ingests the resolution block
        _stop(net, "v1")
        job, stages, states = _job(tmp_path / "v1-data" / "node.db")
        assert job.matches_leaf is True and job.verdict == "honest" and job.attempts == 1
        assert stages.count("replay") == 1 and states == {("commit", "confirmed"), ("reveal", "confirmed")}
    finally:
        net.close()


class _Throttled(harness._Handler):
    """A prover that honours Range and sends a file in small pieces, slowly until `fast` is set;
    it records the Range header of every request for an opening."""

    fast: threading.Event
    ranges: list[str | None]

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        data = self._file()
        if data is None:
            return
        if not self.path.startswith("/openings/"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        rng = self.headers.get("Range")
        self.ranges.append(rng)
        start = int(rng.removeprefix("bytes=").rstrip("-")) if rng else 0
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        try:
            for i in range(start, len(data), 512):
                self.wfile.write(data[i:i + 512])
                self.wfile.flush()
                if not self.fast.is_set():
                    time.sleep(0.05)
        except OSError:  # the verifier stopped reading
            return


@pytest.mark.slow
def test_a_stop_during_a_fetch_keeps_its_partial_file_and_the_fetch_resumes(tmp_path):
    net = Network(tmp_path, PARAMS, interval=0.5)
    fast = threading.Event()
    handler = type("T", (_Throttled,), {"root": net.served, "fast": fast, "ranges": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cfg = net.node_config("v1")
        net.start_node("v1", cfg)
        run = net.start_run(steps=8, opening_base=slow)
        assert run.opened.wait(120), "the miner never saw its challenge"
        part = tmp_path / "v1-data" / "openings" / f"{run.challenge_id.hex()}.opening.part"
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size >= 4096):
            assert time.monotonic() < deadline, f"the fetch did not start:\n{net.log('v1')[-3000:]}"
            time.sleep(0.05)
        took = _stop(net, "v1")
        assert took < STOP_LIMIT_S, f"the stop took {took:.2f} s:\n{net.log('v1')[-3000:]}"
        kept = part.stat().st_size
        opening = next((net.served / "openings").iterdir()).stat().st_size
        assert 4096 <= kept < opening, "the partial file is gone or complete"
        job, _, _ = _job(tmp_path / "v1-data" / "node.db")
        assert job.stage == "fetch" and job.refusal_class is None

        fast.set()
        net.start_node("v1", cfg, init=False)
        _resolved_once(net, run, "v1", 150)
        # The restarted fetch asked for the rest of the file, from where the partial file ended.
        assert handler.ranges[0] is None and handler.ranges[1] == f"bytes={kept}-", handler.ranges
        time.sleep(1.5)
        _stop(net, "v1")
        job, stages, _ = _job(tmp_path / "v1-data" / "node.db")
        assert job.matches_leaf is True and job.opening_bytes == opening and stages.count("fetch") == 1
    finally:
        server.shutdown()
        net.close()


def test_the_replay_pool_stops_a_worker_still_warming_up_within_its_grace():
    """A worker spawned a moment ago is still importing torch and the oracle and reads its pipe only
    after that: the pool's shutdown does not wait for it past its grace."""
    pool = ReplayPool(1, 60.0)
    worker = _Worker(pool._ctx, pool.threads)
    pool._workers.append(worker)
    started = time.monotonic()
    pool.shutdown(grace_s=0.3)
    took = time.monotonic() - started
    assert not worker.proc.is_alive() and pool._workers == [] and pool.free() == 1
    assert took < 1.5, f"shutdown took {took:.2f} s"
