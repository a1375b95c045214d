"""A small live network for node tests: a dev chain sealed every interval, a scripted miner that
registers a run, commits its root and answers its challenges (every round) over real HTTP, and
verifier nodes started as real `pot node run` processes, which bond before a run registers (a
committee is drawn from bonded verifiers only).
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
from chain.calls import StartTrainingCommitment, SubmitCheckpointRoot, SubmitOpening, derive_run_id
from chain.dev import DevChain, DevTransport
from chain.protocol import ProtocolParams
from chain.view import ChainView
from challenges.opening import MAGIC, OPENING_VERSION, build_opening, encode_leaves, load_opening
from commitments import hashing, merkle
from tests.miner.helpers import corpus, tiny_spec, walk

REPO = Path(__file__).resolve().parents[2]


def run_id_for(nonce: bytes, miner: str = "miner") -> bytes:
    """The run id `miner` registers with `nonce` (protocol v2: run ids belong to their sender)."""
    return derive_run_id(miner, nonce)


def in_process_node(tmp_path: Path, chain_db: Path, toml: str = "", env: dict | None = None, fault: str = "none"):
    """A VerifierNode in this process (account v1) on the dev chain `chain_db`, with a fresh SQLite
    database under `tmp_path`; `toml` is appended to its config; `fault` injects devnet's fault hooks
    (devnet/node_faults.py). Returns (node, engine)."""
    from devnet.node_faults import FaultHooks
    from node.config import load_config, load_secrets
    from node.daemon import VerifierNode
    from node.db import open_database

    cfg_path = tmp_path / "n.toml"
    cfg_path.write_text(f'[chain]\nurl = "dev:///{chain_db}"\naccount = "v1"\n{toml}')
    cfg = load_config(cfg_path, env=env or {})
    engine = open_database(cfg.database_url, init=True)
    return VerifierNode(cfg, load_secrets(None, env={}), engine, hooks=FaultHooks(fault)), engine


def chain_calls(net: Network, origin: str | None = None) -> list[tuple[int, str, Any]]:
    """Every call on the chain (block, origin, call), optionally of one origin."""
    t = DevTransport(net.chain_path, "observer")
    out = []
    for n in range(1, t.finalized_head() + 1):
        out += [(n, o, c) for o, c in t.block(n).calls if origin is None or o == origin]
    return out


class _Handler(http.server.BaseHTTPRequestHandler):
    root: Path

    def _file(self) -> bytes | None:
        """The served file a GET names (an opening or a run's leaves), or None after a 404."""
        parts = self.path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "openings":
            path = self.root / "openings" / parts[1]
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "leaves":
            path = self.root / "leaves" / parts[1]
        else:
            path = None
        if path is None or not path.is_file():
            self.send_error(404)
            return None
        return path.read_bytes()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        data = self._file()
        if data is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class _SlowlorisHandler(_Handler):
    """A hostile prover: announces the whole file, then sends it one byte every `delay_s`, never
    pausing long enough for a read timeout."""

    delay_s: float = 0.2
    stopped: threading.Event

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        data = self._file()
        if data is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            for i in range(len(data)):
                if self.stopped.is_set():
                    return
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(self.delay_s)
        except OSError:  # the verifier gave up on us
            return


@dataclass
class MinerRun:
    run_id: bytes
    walk: Any
    challenge_id: bytes | None = None  # the first challenge answered
    step: int | None = None
    opened: threading.Event = field(default_factory=threading.Event)
    miner: str = "miner"
    endpoint: str = ""
    opening: bytes | None = None  # served instead of the honest opening
    opening_base: str = ""  # the base of the opening's URI (default: the endpoint)
    mirrors: tuple[str, ...] = ()  # bases of the mirrors named on chain
    answered: list[bytes] = field(default_factory=list)  # every challenge id answered, in order


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
        self.bonds: dict[str, int] = {}  # node name -> the bond its config keeps (0: none)
        self._servers = [self.http]
        self._walks: dict[tuple[int, str, int | None], Any] = {}

    def slowloris_endpoint(self, delay_s: float = 0.2) -> str:
        """The base URL of a second prover serving the same files a byte at a time."""
        handler = type("S", (_SlowlorisHandler,), {"root": self.served, "delay_s": delay_s, "stopped": self._stop})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    # --- the miner ---------------------------------------------------------------------------
    def start_run(self, *, steps: int = 8, substitute_at: int | None = None, kind: str = "mlp",
                  nonce: bytes = b"\x42" * 16, miner: str = "miner", endpoint: str | None = None,
                  opening: bytes | None = None, opening_base: str | None = None, mirrors: tuple[str, ...] = (),
                  wait_bonds: float = 120.0) -> MinerRun:
        """Register and answer a run as `miner` (its id derived from `nonce`), served from
        `endpoint` (default: the honest prover); `opening` replaces the honest opening's bytes (a
        hostile file, under its manifest's digest). The opening's URI is under `opening_base`
        (default: the endpoint), each of `mirrors` (bases) names a further address on chain.
        First waits up to `wait_bonds` s for the started nodes to bond (0: no wait)."""
        if wait_bonds:
            self.wait_bonded(timeout=wait_bonds)
        spec = tiny_spec(steps, kind)
        run_id = run_id_for(nonce, miner)
        # A walk does not depend on the run id: runs of the same shape share one (it takes seconds).
        w = self._walks.get((steps, kind, substitute_at))
        if w is None:
            w = self._walks[(steps, kind, substitute_at)] = walk(spec, corpus(self.tmp), substitute_at=substitute_at)
        run = MinerRun(run_id, w, miner=miner, endpoint=endpoint or self.endpoint, opening=opening,
                       mirrors=tuple(mirrors))
        run.opening_base = opening_base or run.endpoint
        (self.served / "leaves" / run_id.hex()).write_bytes(encode_leaves(w.leaves))
        t = self.miner if miner == "miner" else DevTransport(self.chain_path, miner)
        t.submit([StartTrainingCommitment(
            run_id, nonce, w.states[0].digest(), w.schedule.commitment, w.dataset.dataset_hash, spec.to_cbor(),
            spec.steps, run.endpoint)])
        t.submit([SubmitCheckpointRoot(run_id, merkle.root(w.leaves), len(w.leaves), ())])
        threading.Thread(target=self._answer, args=(run, t), daemon=True).start()
        return run

    def _answer(self, run: MinerRun, transport: DevTransport) -> None:
        """Open every challenge of the run, re-challenges included, until the network closes."""
        view = ChainView(DevTransport(self.chain_path, "miner"), self.params)
        while not self._stop.is_set():
            for ev in view.sync():
                if isinstance(ev, P.ChallengeIssued) and ev.run_id == run.run_id:
                    w = run.walk
                    if run.opening is None:
                        data = build_opening(spec=w.spec, run_id=run.run_id, step=ev.step,
                                             pre_state=w.states[ev.step - 1], dataset=w.dataset,
                                             schedule=w.schedule, leaves=w.leaves)
                        digest = load_opening(data).digest
                    else:
                        data = run.opening
                        mlen = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "big")
                        digest = hashing.digest(OPENING_VERSION, data[len(MAGIC) + 4:len(MAGIC) + 4 + mlen])
                    (self.served / "openings" / digest.hex()).write_bytes(data)
                    tree = merkle.MerkleTree.from_leaves(list(w.leaves))
                    transport.submit([SubmitOpening(
                        ev.challenge_id, digest, f"{run.opening_base}/openings/{digest.hex()}", w.leaves[ev.step],
                        tuple(tree.inclusion_proof(ev.step)),
                        tuple(f"{m}/openings/{digest.hex()}" for m in run.mirrors))])
                    run.answered.append(ev.challenge_id)
                    if run.challenge_id is None:
                        run.challenge_id, run.step = ev.challenge_id, ev.step
                        run.opened.set()
            time.sleep(0.2)

    # --- verifier nodes -----------------------------------------------------------------------
    def node_config(self, name: str, *, db_url: str = "", quorum: int | None = None,
                    schedule: dict[str, Any] | None = None, fetch: dict[str, Any] | None = None,
                    replay: dict[str, Any] | None = None, bond: int | None = None, **node: Any) -> Path:
        """A node's TOML; `schedule`, `fetch` and `replay` add keys to those sections; `bond` is its
        [verifier] bond (default: the chain's verifier_stake)."""
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
            *[f"{k} = {v}" for k, v in (fetch or {}).items()],
            *(["[schedule]", *[f"{k} = {v}" for k, v in schedule.items()]] if schedule else []),
            *(["[replay]", *[f"{k} = {v}" for k, v in replay.items()]] if replay else []),
            *(["[verifier]", f"bond = {bond}"] if bond is not None else []),
            "[protocol]",
            *[f"{k} = {v}" for k, v in p.to_dict().items() if k not in ("quorum_share", "quorum_min_reveals")],
            f"quorum_min_reveals = {quorum or p.quorum_min_reveals}",
            f"quorum_share = [{p.quorum_share.numerator}, {p.quorum_share.denominator}]",
        ]
        self.bonds[name] = p.verifier_stake if bond is None else bond
        path = self.tmp / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start_node(self, name: str, config: Path, *, env: dict[str, str] | None = None, init: bool = True,
                   wrap: list[str] | None = None, fault: str = "none", kill_at: str | None = None) -> subprocess.Popen:
        """`pot node run` for `name`; `wrap` is a command line the node runs under (its arguments follow).
        With a `fault` or a `kill_at` point the node is `pot devnet node` (devnet/node_faults.py)."""
        command = ["node", "run"]
        if fault != "none" or kill_at is not None:
            command = ["devnet", "node", "--fault", fault, *(["--kill-at", kill_at] if kill_at else [])]
        args = [*(wrap or []), sys.executable, "-m", "pot", *command, "--config", str(config)]
        if init:
            args.append("--init")
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
        self.nodes[name] = proc
        return proc

    def wait_bonded(self, names: list[str] | None = None, timeout: float = 120.0) -> ChainView:
        """Wait until each of `names` (default: every started node whose config keeps a bond) has
        its active bond on chain; a node that exited fails at once with its log."""
        names = [n for n in self.nodes if self.bonds.get(n, 0) > 0] if names is None else names
        deadline = time.monotonic() + timeout
        while True:
            v = self.view()
            missing = [n for n in names if v.state.vbonds.get(n, 0) < self.bonds.get(n, self.params.verifier_stake)]
            if not missing:
                return v
            for n in missing:
                proc = self.nodes.get(n)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"node {n} exited ({proc.returncode}) before bonding:\n{self.log(n)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes {missing} did not bond within {timeout} s")
            time.sleep(0.3)

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
        for server in self._servers:
            server.shutdown()
        self._sealer.join(5)
