"""What a verifier spends on one challenge, through the node's own pipeline (default: GPT-2 small).

A miner (miner.trainer.Trainer) walks step 1 of a run of the spec and builds the opening of
step 1; its prover server (miner.prover) serves it over loopback. A separate verifier process
then runs the node's stages on it as the daemon does (node.pipeline): warm-up, fetch (with the
opening gate), validate, replay (in a ReplayPool worker), witness (value hash and the journal in
a SQLite node database). Printed: the opening's size, the seconds of each stage (build, serve,
fetch, validate, replay, witness), the verifier's peak RSS (its own and its replay worker's), and
the replay's ratio to one torch-native step of the same model on the same batch at the same
thread count, measured in the same run. `--json` prints a JSON line last.

The full example batch of GPT-2 small (12 x 1024 tokens) takes tens of minutes per exact step on
two cores; `--batch-size` and `--seq-len` shrink the batch (replay time grows about linearly in
tokens; the opening's size hardly changes: the pre-state is most of it), `--spec` takes another
spec. The schedule is cut to `--steps` steps (its commitment is the miner's cost, not the
verifier's).

    python bench/challenge.py                                  # the example spec, full batch
    python bench/challenge.py --batch-size 1 --seq-len 256     # the shape of bench/oracle.py
    python bench/challenge.py --spec examples/specs/gpt-demo.toml
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPT2_SMALL = ROOT / "examples" / "specs" / "gpt2-small.toml"
MIB = 1024 * 1024

BENCH_CHALLENGE = b"\x42" * 32  # the challenge id the bench replays and witnesses under


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_spec(args):
    from commitments.spec import Spec

    d = Spec.from_toml(args.spec).canonical()
    d["batch"] = {"batch_size": args.batch_size or d["batch"]["batch_size"],
                  "seq_len": args.seq_len or d["batch"]["seq_len"]}
    d["steps"] = min(args.steps, d["steps"])
    return Spec.from_dict(d)


def native_step(spec, batch, threads: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one torch-native step 1 of the same model on the same batch."""
    import torch

    from commitments.spec import Spec
    from oracle.step import init_state, step

    d = spec.canonical()
    d["profile"] = "torch-native"
    d["hardware"] = {"device": "cpu", "threads": threads}
    nspec = Spec.from_dict(d)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        state = init_state(nspec)
        wall, cpu = time.perf_counter(), time.process_time()
        step(state, batch, nspec, 1)
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        torch.set_num_threads(old)


# --- the verifier's side, in a process of its own --------------------------------------------------


def _reset_peak() -> None:
    """Start a new peak-RSS window for this process (Linux: clear_refs 5 resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_mib() -> float:
    """This process's peak RSS since the last reset (VmHWM), in MiB; ru_maxrss where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def verifier(job: dict) -> dict:
    """The node's stages on the served opening, timed one by one; a JSON-able report."""
    from node.pipeline import warm_up

    report: dict = {"warm_up_s": warm_up(), "warm_up_peak_mib": _peak_mib()}
    from challenges.witness import new_salt
    from commitments.leaves import witness_value_hash
    from node.db import open_database
    from node.egress import EgressPolicy
    from node.fetch import FetchPolicy
    from node.journal import check_and_insert_witness
    from node.pipeline import ChainFacts, ReplayPool, stage_fetch, stage_validate

    work = Path(job["work"])
    facts = ChainFacts(**{k: bytes.fromhex(v) if isinstance(v, str) else v for k, v in job["facts"].items()})
    dest, leaves_dest = work / "fetched.opening", work / "fetched.leaves"
    _reset_peak()
    cpu = time.process_time()
    out = stage_fetch(
        uri=f"openings/{job['digest']}",
        endpoint=job["endpoint"],
        run_id=facts.run_id,
        dest=dest,
        leaves_dest=leaves_dest,
        max_opening_bytes=job["max_bytes"],
        max_leaves_bytes=64 * MIB,
        policy=FetchPolicy(egress=EgressPolicy.from_allow(["127.0.0.1/32"])),
        facts=facts,
    )
    if not out.ok:
        raise SystemExit(f"fetch refused the opening: {out.refusal_class}: {out.reason}")
    report["fetch_s"] = out.finished_at - out.started_at
    report["fetch_cpu_s"] = time.process_time() - cpu
    report["fetch_peak_mib"] = _peak_mib()
    _reset_peak()
    cpu = time.process_time()
    report["fetched_bytes"] = out.data["bytes"]
    out = stage_validate(dest, facts, max_bytes=job["max_bytes"])
    if not out.ok:
        raise SystemExit(f"validate refused the opening: {out.refusal_class}: {out.reason}")
    report["validate_s"] = out.finished_at - out.started_at
    report["validate_cpu_s"] = time.process_time() - cpu
    report["validate_peak_mib"] = _peak_mib()
    _reset_peak()

    pool = ReplayPool(1, job["timeout_s"], threads_per_worker=job["threads"])
    try:
        sent = time.time()
        pool.start(BENCH_CHALLENGE, dest, facts, max_bytes=job["max_bytes"])
        while True:
            done = pool.poll()
            if done:
                msg = done[0][1]
                break
            time.sleep(0.05)
        received = time.time()
    finally:
        pool.shutdown()
    if not msg.get("ok") or not msg.get("matches"):
        raise SystemExit(f"the replay did not match leaf t: {msg.get('reason')}")
    report["replay_s"] = msg["finished_at"] - msg["started_at"]  # what the node's stage log records
    report["replay_cpu_s"] = msg["cpu_s"]
    report["replay_with_worker_start_s"] = received - sent  # a cold pool: spawn and imports too

    engine = open_database(f"sqlite:///{work / 'node.db'}", init=True)
    started, cpu = time.time(), time.process_time()
    value_hash = witness_value_hash(bytes(msg["result"]["leaf"]))
    check_and_insert_witness(
        engine,
        challenge_id=BENCH_CHALLENGE,
        verifier="bench-verifier",
        value_hash=value_hash,
        norm_bucket=msg["result"]["norm_bucket"],
        salt=new_salt(),
        proof_hash=bytes(msg["result"]["proof_hash"]),
        origin="bench-verifier",
    )
    report["witness_s"] = time.time() - started
    report["witness_cpu_s"] = time.process_time() - cpu
    engine.dispose()
    report["peak_rss_mib"] = max(
        report["warm_up_peak_mib"], report["fetch_peak_mib"], report["validate_peak_mib"], _peak_mib()
    )  # the node process over all its stages
    report["replay_worker_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return report


# --- the miner's side and the report ---------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(GPT2_SMALL), help="a spec TOML (default: GPT-2 small)")
    ap.add_argument("--batch-size", type=int, default=0, help="override the spec's batch size")
    ap.add_argument("--seq-len", type=int, default=0, help="override the spec's sequence length")
    ap.add_argument("--steps", type=int, default=4, help="the schedule's length (at most the spec's)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of the replay and of the native step (the node's replay workers use 1)")
    ap.add_argument("--workdir", help="keep the run and the downloads here (default: a temporary folder)")
    ap.add_argument("--json", action="store_true", help="print a JSON line last")
    ap.add_argument("--verifier", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.verifier:
        print(json.dumps(verifier(json.loads(Path(args.verifier).read_text()))))
        return 0
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        return run(args, Path(args.workdir))
    with tempfile.TemporaryDirectory(prefix="pot-bench-challenge-") as d:
        return run(args, Path(d))


def run(args, work: Path) -> int:
    import torch

    from challenges.opening import DEFAULT_MAX_BYTES, build_opening, opening_digest
    from commitments import merkle
    from commitments.dataset import Dataset, prepare_default_corpus
    from devnet.procs import free_port
    from miner.prover import BackgroundServer
    from miner.trainer import Trainer

    spec = bench_spec(args)
    corpus = work / "corpus.npy"
    if not corpus.exists():
        # enough samples for the batch and the validation split, whatever the sequence length
        prepare_default_corpus(corpus, max_bytes=max(400_000, 40 * spec.batch.batch_size * spec.sample_len))
    dataset = Dataset.open(corpus, spec.sample_len)
    say(
        f"spec {args.spec}: batch {spec.batch.batch_size}x{spec.batch.seq_len}, schedule of {spec.steps} "
        "steps"
    )

    # The miner: initial state, step 1 (exact-v1), the opening of step 1.
    # A --workdir that holds the run already resumes it: the miner's step is not walked again.
    trainer = Trainer(spec, dataset, work / "run", None, keep_every=1, progress=True, log=say)
    wall = time.perf_counter()
    trainer.prepare()
    init_s = time.perf_counter() - wall
    n_params = sum(t.numel() for t in trainer.state.params().values())
    resumed = trainer.state.step >= 1
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train(steps=1)
    exact_s, exact_cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    if resumed:
        exact_s = exact_cpu_s = float("nan")
    batch = trainer.batch(1)
    leaves = list(trainer.store.leaves)
    facts = dict(
        run_id=trainer.run_id.hex(),
        step=1,
        spec_digest=spec.digest().hex(),
        dataset_hash=dataset.dataset_hash.hex(),
        schedule_commitment=trainer.schedule.commitment.hex(),
        initial_hash=trainer.initial_hash.hex(),
        root=merkle.root(leaves).hex(),
        size=len(leaves),
    )
    trainer.state = None  # the verifier gets the memory
    say(
        f"miner: init {init_s:.1f} s, exact step {exact_s:.1f} s; one torch-native step ({args.threads} "
        "thread(s))"
    )
    native_s, native_cpu_s = native_step(spec, batch, args.threads)

    pre = trainer.store.state(0)
    wall, cpu = time.perf_counter(), time.process_time()
    data = build_opening(spec=spec, run_id=trainer.run_id, step=1, pre_state=pre, dataset=dataset,
                         schedule=trainer.schedule, leaves=leaves, size=len(leaves))
    build_s, build_cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    del pre
    digest, size = opening_digest(data), len(data)
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.store.put_opening(digest, data)
    del data
    port = free_port()
    server = BackgroundServer(work / "run", "127.0.0.1", port).start()
    serve_s, serve_cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    trainer.close()
    say(f"opening of step 1: {size / MIB:.1f} MiB, built in {build_s:.1f} s, served on 127.0.0.1:{port}")

    job = {"work": str(work), "endpoint": f"http://127.0.0.1:{port}", "digest": digest.hex(),
           "facts": {"expected_digest": digest.hex(), **facts}, "max_bytes": DEFAULT_MAX_BYTES,
           "timeout_s": 24 * 3600.0, "threads": args.threads}
    (work / "verifier.json").write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    try:
        say("verifier: fetch, validate, replay, witness (a process of its own)")
        r = subprocess.run([sys.executable, __file__, "--verifier", str(work / "verifier.json")], env=env,
                           capture_output=True, text=True, check=False)
    finally:
        server.stop()
    if r.returncode != 0:
        say(r.stderr[-4000:])
        return 1
    v = json.loads(r.stdout.strip().splitlines()[-1])

    rss = max(v["peak_rss_mib"], v["replay_worker_peak_rss_mib"])
    rows = [("build (miner)", build_s, build_cpu_s), ("serve over loopback (miner)", serve_s, serve_cpu_s),
            ("fetch", v["fetch_s"], v["fetch_cpu_s"]), ("validate", v["validate_s"], v["validate_cpu_s"]),
            ("replay", v["replay_s"], v["replay_cpu_s"]), ("witness", v["witness_s"], v["witness_cpu_s"])]
    print(
        f"spec {args.spec}: {n_params / 1e6:.1f} M parameters, batch "
        f"{spec.batch.batch_size}x{spec.batch.seq_len}, "
        f"{args.threads} replay thread(s), {torch.get_num_threads()} core(s) seen"
    )
    print(f"opening: {size} bytes ({size / MIB:.1f} MiB)")
    print(f"  {'stage':<30} {'wall s':>9} {'CPU s':>9}")
    for name, s, c in rows:
        print(f"  {name:<30} {s:9.2f} {c:9.2f}")
    print(f"  (verifier warm-up at start-up {v['warm_up_s']:.2f} s; replay with a cold worker "
          f"{v['replay_with_worker_start_s']:.2f} s)")
    print(
        f"verifier peak RSS: {v['peak_rss_mib']:.0f} MiB (node process: fetch {v['fetch_peak_mib']:.0f}, "
        f"validate {v['validate_peak_mib']:.0f}), {v['replay_worker_peak_rss_mib']:.0f} MiB (replay worker)"
    )
    print(
        f"one torch-native step: {native_s:.2f} s wall, {native_cpu_s:.2f} s CPU; one exact-v1 step (miner, "
        f"{torch.get_num_threads()} threads): {exact_s:.2f} s wall, {exact_cpu_s:.2f} s CPU"
    )
    print(f"replay / torch-native step: {v['replay_s'] / native_s:.2f} (wall), "
          f"{v['replay_cpu_s'] / native_cpu_s:.2f} (CPU)")
    if args.json:
        print(
            json.dumps(
                {
                    "spec": str(args.spec),
                    "params": n_params,
                    "batch_size": spec.batch.batch_size,
                    "seq_len": spec.batch.seq_len,
                    "threads": args.threads,
                    "opening_bytes": size,
                    "build_s": round(build_s, 3),
                    "serve_s": round(serve_s, 3),
                    "fetch_s": round(v["fetch_s"], 3),
                    "validate_s": round(v["validate_s"], 3),
                    "replay_s": round(v["replay_s"], 3),
                    "witness_s": round(v["witness_s"], 4),
                    **{
                        f"{k}_cpu_s": round(v[f"{k}_cpu_s"], 3)
                        for k in ("fetch", "validate", "replay", "witness")
                    },
                    "build_cpu_s": round(build_cpu_s, 3),
                    "serve_cpu_s": round(serve_cpu_s, 3),
                    "warm_up_s": round(v["warm_up_s"], 3),
                    "replay_with_worker_start_s": round(v["replay_with_worker_start_s"], 3),
                    "verifier_peak_rss_mib": round(rss),
                    "node_peak_rss_mib": round(v["peak_rss_mib"]),
                    "fetch_peak_rss_mib": round(v["fetch_peak_mib"]),
                    "validate_peak_rss_mib": round(v["validate_peak_mib"]),
                    "replay_worker_peak_rss_mib": round(v["replay_worker_peak_rss_mib"]),
                    "native_step_s": round(native_s, 3),
                    "native_step_cpu_s": round(native_cpu_s, 3),
                    "miner_exact_step_s": None if resumed else round(exact_s, 3),
                    "miner_exact_step_cpu_s": None if resumed else round(exact_cpu_s, 3),
                    "miner_init_s": round(init_s, 3),
                    "replay_to_native": round(v["replay_s"] / native_s, 3),
                    "replay_to_native_cpu": round(v["replay_cpu_s"] / native_cpu_s, 3),
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
