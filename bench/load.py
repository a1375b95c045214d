"""Load on one verifier node: N challenges in flight at once on a dev chain, while clients poll the API.

The node bonds on start (`[verifier] bond`); the runs are registered once its bond is on chain, so
it sits alone on every challenge's committee (committee_size 1), a re-challenge round included.

Measures, side by side in one run, the latency of /api/v1/status and /api/v1/challenges idle and
under load (p50/p99/max), the node's peak RSS (daemon + replay workers), its queue depth over time
(challenges in a work stage), and how long the node takes to witness every challenge. Prints the
results; never pass/fail. With several `--workers` counts it runs once per count, side by side,
and prints the challenges witnessed per hour of each and their ratio; `--backend ray` runs the
replays on a Ray cluster on this machine with that many worker nodes (1 CPU each).

    .venv/bin/python bench/load.py [--challenges 50] [--clients 4] [--json]
    .venv/bin/python bench/load.py --backend ray --workers 1,2 --challenges 8
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = {"steps": 8, "model": {"kind": "mlp", "block_size": 16, "hidden": [32]},
        "batch": {"batch_size": 4, "seq_len": 16}, "rng": {"seed": 7, "schedule_seed": 11}}
WORK = ("awaiting_opening", "fetch", "validate", "losschecks", "replay", "witness", "commit")
ENDPOINTS = ("/api/v1/status", "/api/v1/challenges")
BOND = 1000  # what the node bonds on start


class Files(http.server.BaseHTTPRequestHandler):
    """The miners' provers: openings and leaf lists from a folder."""

    root: Path

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        parts = self.path.strip("/").split("/")
        path = None
        if len(parts) == 2 and parts[0] == "openings":
            path = self.root / "openings" / parts[1]
        elif len(parts) == 3 and parts[0] == "runs" and parts[2] == "leaves":
            path = self.root / "leaves" / parts[1]
        if path is None or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: Any) -> None:
        pass


def rss_bytes(pid: int, *, descendants: bool = True) -> int:
    """Resident memory of a process (and, by default, all its descendants) from /proc."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            if descendants:
                for task in Path(f"/proc/{p}/task").iterdir():
                    todo += [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Poller:
    """`clients` threads polling the API endpoints round-robin, recording each latency."""

    def __init__(self, base: str, clients: int) -> None:
        self.base = base
        self.clients = clients
        self.lat: dict[str, list[float]] = {e: [] for e in ENDPOINTS}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _loop(self, offset: int) -> None:
        import httpx

        with httpx.Client(base_url=self.base, timeout=30.0) as client:
            i = offset
            while not self._stop.is_set():
                path = ENDPOINTS[i % len(ENDPOINTS)]
                i += 1
                t0 = time.perf_counter()
                try:
                    r = client.get(path)
                    dt = time.perf_counter() - t0
                    if r.status_code == 200:
                        self.lat[path].append(dt)
                    else:
                        self.errors.append(f"{path}: HTTP {r.status_code}")
                except httpx.HTTPError as exc:
                    self.errors.append(f"{path}: {type(exc).__name__}")
                    time.sleep(0.1)

    def start(self) -> Poller:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._loop, args=(k,), daemon=True) for k in range(self.clients)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for t in self._threads:
            t.join(35)
        out = {path: {"n": len(xs), "p50_ms": pct(xs, 50) * 1000, "p99_ms": pct(xs, 99) * 1000,
                      "max_ms": max(xs, default=float("nan")) * 1000} for path, xs in self.lat.items()}
        out["errors"] = len(self.errors)
        self.lat = {e: [] for e in ENDPOINTS}
        self.errors = []
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--challenges", type=int, default=50, help="challenges in flight (default 50)")
    ap.add_argument("--per-run", type=int, default=5, help="challenges per run (default 5)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent API clients (default 4)")
    ap.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle API measurement first")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="give up after this long under load")
    ap.add_argument("--interval", type=float, default=0.5, help="dev chain block interval (s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it")
    ap.add_argument(
        "--workers", default="1", help="replay workers, or several counts to compare: 1,2 (default 1)"
    )
    ap.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="local worker processes, or a Ray cluster on this machine with one node per worker")
    args = ap.parse_args()
    if args.challenges < 1 or args.per_run < 1 or args.clients < 1:
        ap.error("--challenges, --per-run and --clients must be positive")
    try:
        counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error("--workers must be a comma-separated list of counts")
    if not counts or min(counts) < 1:
        ap.error("--workers counts must be positive")
    results = []
    for w in counts:
        if args.keep is not None:
            (args.keep / f"w{w}").mkdir(parents=True, exist_ok=True)
            results.append(run_with(args, args.keep / f"w{w}", w))
        else:
            with tempfile.TemporaryDirectory(prefix="pot-load-") as tmp:
                results.append(run_with(args, Path(tmp), w))
        report(results[-1], args.json and len(counts) == 1)
    if len(counts) > 1:
        throughput(results, args.json)


def run_with(args: argparse.Namespace, tmp: Path, workers: int) -> dict[str, Any]:
    """One load run with `workers` replay workers (local processes, or Ray nodes started here)."""
    if args.backend == "local":
        return {**run(args, tmp, {"workers": workers}), "backend": "local", "workers": workers}
    from devnet.ray_cluster import start_cluster

    print(f"starting a Ray cluster of {workers} node(s) of 1 CPU", file=sys.stderr)
    cluster = start_cluster(tmp, nodes=workers)
    try:
        replay = {"workers": workers, "backend": "ray", "address": cluster.address}
        return {**run(args, tmp, replay), "backend": "ray", "workers": workers}
    finally:
        cluster.stop()


def throughput(results: list[dict[str, Any]], as_json: bool) -> None:
    """Challenges witnessed per hour of each run, and each run's ratio to the first."""
    rows = []
    for r in results:
        per_h = None if not r["drained_s"] else r["witnessed"] / r["drained_s"] * 3600
        rows.append({"backend": r["backend"], "workers": r["workers"], "witnessed": r["witnessed"],
                     "drained_s": r["drained_s"], "challenges_per_hour": per_h})
    base = rows[0]["challenges_per_hour"]
    print(f"{'backend':<9}{'workers':>8}{'witnessed':>11}{'drained s':>11}{'per hour':>10}{'ratio':>8}")
    for row in rows:
        ph = row["challenges_per_hour"]
        row["ratio"] = ph / base if ph and base else None
        print(f"{row['backend']:<9}{row['workers']:>8}{row['witnessed']:>11}"
              f"{(row['drained_s'] or float('nan')):>11.0f}{(ph or float('nan')):>10.0f}"
              f"{(row['ratio'] or float('nan')):>8.2f}")
    if as_json:
        print(json.dumps(_finite({"throughput": rows}), sort_keys=True))


def walk(tmp: Path):
    """One tiny run walked from its seed: spec, dataset, schedule, states, leaves."""
    import torch

    from commitments.dataset import Dataset, prepare_default_corpus, train_validation_split
    from commitments.leaves import initial_leaf, loss_bits, step_leaf
    from commitments.schedule import derive_schedule
    from commitments.spec import Spec
    from oracle.step import init_state, step

    torch.set_num_threads(1)
    spec = Spec.from_dict(SPEC)
    corpus = tmp / "corpus.npy"
    prepare_default_corpus(corpus, max_bytes=200_000)
    ds = Dataset.open(corpus, spec.sample_len)
    train, _ = train_validation_split(ds.num_samples)
    schedule = derive_schedule(spec.rng.schedule_seed, len(train), spec.steps, spec.batch.batch_size)
    state = init_state(spec)
    states, leaves = [state], [initial_leaf(state.digest())]
    for t in range(1, spec.steps + 1):
        state, loss = step(state, ds.batch(schedule.batch(t)), spec, t)
        states.append(state)
        leaves.append(step_leaf(t, state.digest(), loss_bits(loss)))
    return spec, ds, schedule, states, leaves


def run(args: argparse.Namespace, tmp: Path, replay: dict[str, Any] | None = None) -> dict[str, Any]:
    from chain import protocol as P
    from chain.calls import StartTrainingCommitment, SubmitCheckpointRoot, SubmitOpening, derive_run_id
    from chain.dev import DevChain, DevTransport
    from chain.protocol import ProtocolParams
    from chain.view import ChainView
    from challenges.opening import build_opening, encode_leaves, load_opening
    from commitments import merkle
    from commitments.files import atomic_write_text
    from commitments.hashing import digest
    from devnet.procs import free_port
    from devnet.toml import to_toml

    n_runs = -(-args.challenges // args.per_run)
    total = n_runs * args.per_run
    params = ProtocolParams(
        commit_window=1200,
        reveal_window=120,
        opening_deadline=240,
        challenges_per_run=args.per_run,
        challenge_delay=2,
        quorum_min_reveals=1,
        committee_size=1,
    )
    print(
        f"walking the tiny run; {n_runs} runs x {args.per_run} challenges = {total} in flight",
        file=sys.stderr,
    )
    spec, ds, schedule, states, leaves = walk(tmp)
    root = merkle.root(leaves)
    tree = merkle.MerkleTree.from_leaves(list(leaves))

    chain_path = tmp / "chain.db"
    miner = DevTransport(chain_path, "miner")
    miner.record_params(params)
    stop = threading.Event()
    sealer = threading.Thread(
        target=DevChain(chain_path).run_sealer, args=(args.interval, stop.is_set), daemon=True
    )
    sealer.start()
    served = tmp / "served"
    (served / "openings").mkdir(parents=True)
    (served / "leaves").mkdir(parents=True)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (Files,), {"root": served}))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"

    api_port = free_port()
    data = tmp / "node"
    cfg = tmp / "node.toml"
    atomic_write_text(cfg, to_toml({
        "node": {"data_dir": str(data), "log_level": "info", "loop_interval_s": 0.2},
        "chain": {"url": f"dev:///{chain_path}", "account": "verifier", "poll_s": 0.2, "watchdog_s": 60.0},
        "database": {"url": ""}, "http": {"listen": f"127.0.0.1:{api_port}"},
        "replay": replay or {"workers": 1},
        "fetch": {"allow": ["127.0.0.1"], "attempts": 3, "backoff_base_s": 0.2, "backoff_max_s": 2.0},
        "verifier": {"bond": BOND},  # bonded on start: the committee of every challenge below
        "protocol": params.to_dict()}))
    log = open(tmp / "node.log", "ab")  # noqa: SIM115 - the process owns it
    node = subprocess.Popen(
        [sys.executable, "-m", "pot", "node", "run", "--config", str(cfg), "--init"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    base = f"http://127.0.0.1:{api_port}"
    poller = Poller(base, args.clients)
    samples: list[dict[str, float]] = []
    try:
        _wait_api(base, node, tmp / "node.log")
        print(f"idle: polling the API for {args.idle_s:g} s", file=sys.stderr)
        poller.start()
        time.sleep(args.idle_s)
        idle = poller.stop()
        rss_idle = rss_bytes(node.pid)
        _wait_bonded(chain_path, params, "verifier", node, tmp / "node.log")

        # Each run id is the miner's own: derive_run_id(miner, nonce).
        nonces = [digest("pot/bench/load-nonce/v1", k)[:16] for k in range(n_runs)]
        run_ids = [derive_run_id(miner.account, n) for n in nonces]
        for rid in run_ids:
            (served / "leaves" / rid.hex()).write_bytes(encode_leaves(leaves))
        answered: set[bytes] = set()

        built: dict[tuple[bytes, int], bytes] = {}  # (run id, step) -> opening digest: every round reuses it

        def answer() -> None:
            # Every ChallengeIssued of the runs, re-challenge rounds (new ids, same step) included.
            view = ChainView(DevTransport(chain_path, "miner"), params)
            while not stop.is_set():
                for ev in view.sync():
                    if isinstance(ev, P.ChallengeIssued) and ev.run_id in run_ids:
                        d = built.get((ev.run_id, ev.step))
                        if d is None:
                            blob = build_opening(spec=spec, run_id=ev.run_id, step=ev.step,
                                                 pre_state=states[ev.step - 1], dataset=ds, schedule=schedule,
                                                 leaves=leaves)
                            d = built[ev.run_id, ev.step] = load_opening(blob).digest
                            (served / "openings" / d.hex()).write_bytes(blob)
                        miner.submit([SubmitOpening(ev.challenge_id, d, f"{endpoint}/openings/{d.hex()}",
                                                    leaves[ev.step], tuple(tree.inclusion_proof(ev.step)))],
                                     wait=False)
                        answered.add(ev.challenge_id)
                time.sleep(0.2)

        threading.Thread(target=answer, daemon=True).start()
        t_load = time.monotonic()
        for rid, nonce in zip(run_ids, nonces, strict=True):
            miner.submit(
                [
                    StartTrainingCommitment(
                        rid,
                        nonce,
                        states[0].digest(),
                        schedule.commitment,
                        ds.dataset_hash,
                        spec.to_cbor(),
                        spec.steps,
                        endpoint,
                    )
                ],
                wait=False,
            )
            miner.submit([SubmitCheckpointRoot(rid, root, len(leaves), ())], wait=False)
        print(
            f"load: {total} challenges; polling the API with {args.clients} clients until all are witnessed",
            file=sys.stderr,
        )
        poller.start()
        db = data / "node.db"
        done_at = None
        while time.monotonic() - t_load < args.timeout_s:
            s = _sample(db, node.pid, time.monotonic() - t_load)
            samples.append(s)
            if s["issued"] >= total and s["queue"] == 0:
                done_at = s["t"]
                break
            if node.poll() is not None:
                raise RuntimeError(f"the node exited with {node.returncode}; see {tmp / 'node.log'}")
            time.sleep(1.0)
        loaded = poller.stop()
        final = samples[-1] if samples else {}
    finally:
        poller.stop()  # a no-op after a normal finish; stops the clients after an error
        stop.set()
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(10)
        log.close()
        httpd.shutdown()
        sealer.join(10)
    return {
        "challenges": total,
        "runs": n_runs,
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "api_idle": idle,
        "api_loaded": loaded,
        "p99_ratio_loaded_over_idle": {e: loaded[e]["p99_ms"] / idle[e]["p99_ms"] for e in ENDPOINTS},
        "rss_idle_mib": rss_idle / 2**20,
        "rss_peak_mib": max(s["rss"] for s in samples) / 2**20,
        "rss_daemon_peak_mib": max(s["rss_daemon"] for s in samples) / 2**20,
        "rss_final_mib": samples[-1]["rss"] / 2**20,
        "queue_peak": max(s["queue"] for s in samples),
        "queue_series": [(round(s["t"], 1), s["queue"]) for s in samples],
        "drained_s": done_at,
        "witnessed": final.get("witnessed"),
        "missed": final.get("missed"),
    }


def _wait_bonded(chain_path: Path, params: Any, account: str, node: subprocess.Popen, log: Path,
                 timeout: float = 120.0) -> None:
    """Until the chain shows `account` (the node) with an active bond of at least verifier_stake."""
    from chain.dev import DevTransport
    from chain.view import ChainView

    view = ChainView(DevTransport(chain_path, "bench-observer"), params, keep_events=False)
    deadline = time.monotonic() + timeout
    while view.state.vbonds.get(account, 0) < params.verifier_stake:
        if node.poll() is not None:
            raise RuntimeError(
                f"the node exited with {node.returncode} before bonding:\n{log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node's bond was not on chain within {timeout:g} s ([verifier] bond)")
        time.sleep(0.5)
        view.sync()


def _wait_api(base: str, node: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise RuntimeError(f"the node exited with {node.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the node's API did not answer within {timeout:g} s")


def _sample(db: Path, pid: int, t: float) -> dict[str, float]:
    """Queue depth (challenges in a work stage), witnessed and missed counts, and RSS, now."""
    out = {
        "t": t,
        "rss": rss_bytes(pid),
        "rss_daemon": rss_bytes(pid, descendants=False),
        "queue": 0,
        "issued": 0,
        "witnessed": 0,
        "missed": 0,
    }
    if not db.exists():
        return out
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            rows = dict(con.execute("SELECT stage, count(*) FROM challenges GROUP BY stage").fetchall())
        finally:
            con.close()
    except sqlite3.Error:
        return out
    out["issued"] = sum(rows.values())
    out["queue"] = sum(rows.get(s, 0) for s in WORK)
    out["witnessed"] = sum(rows.get(s, 0) for s in ("reveal", "revealed", "done"))
    out["missed"] = rows.get("missed", 0)
    return out


def report(r: dict[str, Any], as_json: bool) -> None:
    print(f"{r['challenges']} challenges in flight ({r['runs']} runs), {r['clients']} API clients, "
          f"{r['cpus']} CPUs")
    print(f"{'endpoint':<22}{'idle p50':>10}{'idle p99':>10}{'load p50':>10}{'load p99':>10}{'load max':>10}"
          f"{'n':>7}{'p99 x':>8}")
    for e in ENDPOINTS:
        i, lo = r["api_idle"][e], r["api_loaded"][e]
        print(f"{e:<22}{i['p50_ms']:>10.1f}{i['p99_ms']:>10.1f}{lo['p50_ms']:>10.1f}{lo['p99_ms']:>10.1f}"
              f"{lo['max_ms']:>10.1f}{lo['n']:>7}{r['p99_ratio_loaded_over_idle'][e]:>8.2f}")
    print(f"API errors: idle {r['api_idle']['errors']}, loaded {r['api_loaded']['errors']}")
    print(
        f"RSS (daemon + replay workers): idle {r['rss_idle_mib']:.0f} MiB, peak {r['rss_peak_mib']:.0f} MiB, "
        f"at the end {r['rss_final_mib']:.0f} MiB; the daemon alone peaked at {r['rss_daemon_peak_mib']:.0f} "
        "MiB"
    )
    series = r["queue_series"]
    step = max(1, len(series) // 12)
    print(f"queue depth: peak {r['queue_peak']}; over time (s, depth): "
          + ", ".join(f"{t:g}:{q}" for t, q in series[::step]))
    drained = "not within the timeout" if r["drained_s"] is None else f"{r['drained_s']:.0f} s"
    print(f"witnessed {r['witnessed']}/{r['challenges']}, missed {r['missed']}, queue drained in {drained}")
    if as_json:
        print(json.dumps(_finite(r), sort_keys=True))


def _finite(v: Any) -> Any:
    """NaN (an endpoint never answered) as null, so the line stays valid JSON."""
    if isinstance(v, float):
        return None if v != v else v
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


if __name__ == "__main__":
    main()
