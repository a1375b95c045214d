"""A small live network for node tests: a dev chain sealed every interval, a scripted miner that
registers a run, commits its root and answers its challenge over real HTTP, and verifier nodes
started as real `pot node run` processes.
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chain import protocol as P
from chain.calls import StartTrainingCommitment, SubmitCheckpointRoot, SubmitOpening
from chain.dev import DevChain, DevTransport
from chain.protocol import ProtocolParams
from chain.view import ChainView
from challenges.opening import build_opening, encode_leaves, load_opening
from commitments import merkle
from tests.miner.helpers import corpus, tiny_spec, walk

REPO = Path(__file__).resolve().parents[2]


def chain_calls(net: Network, origin: str | None = None) -> list[tuple[int, str, Any]]:
    """Every call on the chain (block, origin, call), optionally of one origin."""
    t = DevTransport(net.chain_path, "observer")
    out = []
    for n in range(1, t.finalized_head() + 1):
        out += [(n, o, c) for o, c in t.block(n).calls if origin is None or o == origin]
    return out


class _Handler(http.server.BaseHTTPRequestHandler):
    root: Path

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "openings":
            path = self.root / "openings" / parts[1]
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "leaves":
            path = self.root / "leaves" / parts[1]
        else:
            path = None
        if path is None or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class MinerRun:
    run_id: bytes
    walk: Any
    challenge_id: bytes | None = None
    step: int | None = None
    opened: threading.Event = field(default_factory=threading.Event)


class Network:
    def __init__(self, tmp: Path, params: ProtocolParams, *, interval: float = 0.5) -> None:
        self.tmp = tmp
        self.params = params
        self.chain_path = tmp / "chain.db"
        self.url = f"dev:///{self.chain_path}"
        DevTransport(self.chain_path, "miner").record_params(params)
        self._stop = threading.Event()
        self._sealer = threading.Thread(
            target=DevChain(self.chain_path).run_sealer, args=(interval, self._stop.is_set), daemon=True)
        self._sealer.start()
        self.served = tmp / "served"
        (self.served / "openings").mkdir(parents=True)
        (self.served / "leaves").mkdir(parents=True)
        handler = type("H", (_Handler,), {"root": self.served})
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.http.server_address[1]}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.http_listen: dict[str, str] = {}  # node name -> host:port of its HTTP API
        self.miner = DevTransport(self.chain_path, "miner")

    # --- the miner ---------------------------------------------------------------------------
    def start_run(self, *, steps: int = 8, substitute_at: int | None = None, kind: str = "mlp",
                  run_id: bytes = b"\x42" * 32) -> MinerRun:
        spec = tiny_spec(steps, kind)
        w = walk(spec, corpus(self.tmp), substitute_at=substitute_at)
        run = MinerRun(run_id, w)
        (self.served / "leaves" / run_id.hex()).write_bytes(encode_leaves(w.leaves))
        self.miner.submit([StartTrainingCommitment(
            run_id, w.states[0].digest(), w.schedule.commitment, w.dataset.dataset_hash, spec.to_cbor(),
            spec.steps, self.endpoint)])
        self.miner.submit([SubmitCheckpointRoot(run_id, merkle.root(w.leaves), len(w.leaves), ())])
        threading.Thread(target=self._answer, args=(run,), daemon=True).start()
        return run

    def _answer(self, run: MinerRun) -> None:
        view = ChainView(DevTransport(self.chain_path, "miner"), self.params)
        while not self._stop.is_set():
            for ev in view.sync():
                if isinstance(ev, P.ChallengeIssued) and ev.run_id == run.run_id:
                    w = run.walk
                    data = build_opening(spec=w.spec, run_id=run.run_id, step=ev.step, pre_state=w.states[ev.step - 1],
                                         dataset=w.dataset, schedule=w.schedule, leaves=w.leaves)
                    digest = load_opening(data).digest
                    (self.served / "openings" / digest.hex()).write_bytes(data)
                    tree = merkle.MerkleTree.from_leaves(list(w.leaves))
                    self.miner.submit([SubmitOpening(ev.challenge_id, digest, f"{self.endpoint}/openings/{digest.hex()}",
                                                     w.leaves[ev.step], tuple(tree.inclusion_proof(ev.step)))])
                    run.challenge_id, run.step = ev.challenge_id, ev.step
                    run.opened.set()
                    return
            time.sleep(0.2)

    # --- verifier nodes -----------------------------------------------------------------------
    def node_config(self, name: str, *, db_url: str = "", quorum: int | None = None, **node: Any) -> Path:
        p = self.params
        # Each node serves its HTTP API on its own free port (the default one would collide).
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.http_listen[name] = f"127.0.0.1:{s.getsockname()[1]}"
        lines = [
            "[http]", f'listen = "{self.http_listen[name]}"',
            "[node]", f'data_dir = "{name}-data"', 'log_level = "info"', "loop_interval_s = 0.1",
            *[f'{k} = "{v}"' for k, v in node.items()],
            "[chain]", f'url = "{self.url}"', f'account = "{name}"', "poll_s = 0.1", "watchdog_s = 20.0",
            "resend_after_blocks = 4",
            "[database]", f'url = "{db_url}"',
            "[fetch]", 'allow = ["127.0.0.1"]', "attempts = 3", "backoff_base_s = 0.2", "backoff_max_s = 1.0",
            "[protocol]",
            *[f"{k} = {v}" for k, v in (
                ("commit_window", p.commit_window), ("reveal_window", p.reveal_window),
                ("opening_deadline", p.opening_deadline), ("challenges_per_run", p.challenges_per_run),
                ("challenge_delay", p.challenge_delay), ("quorum_min_reveals", quorum or p.quorum_min_reveals),
                ("miner_stake", p.miner_stake), ("verifier_stake", p.verifier_stake),
                ("slash_amount", p.slash_amount), ("forced_challenge_steps", list(p.forced_challenge_steps)))],
            f"quorum_share = [{p.quorum_share.numerator}, {p.quorum_share.denominator}]",
        ]
        path = self.tmp / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_node(self, name: str, config: Path, *, env: dict[str, str] | None = None, init: bool = True) -> subprocess.Popen:
        args = [sys.executable, "-m", "pot", "node", "run", "--config", str(config)]
        if init:
            args.append("--init")
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
        self.nodes[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def view(self) -> ChainView:
        v = ChainView(DevTransport(self.chain_path, "observer"), self.params)
        v.sync()
        return v

    def wait_resolved(self, challenge_id: bytes, timeout: float) -> ChainView:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.view()
            ch = v.state.challenges.get(challenge_id)
            if ch is not None and ch.verdict is not None:
                return v
            time.sleep(0.5)
        raise TimeoutError(f"challenge {challenge_id.hex()[:16]} not resolved within {timeout} s")

    def close(self) -> None:
        for proc in self.nodes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.nodes.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._stop.set()
        self.http.shutdown()
        self._sealer.join(5)
