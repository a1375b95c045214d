"""Benchmark of the oracle, measured side by side in one run; prints ratios, never pass/fail.

- gemm_ratio and the transcendental kernels' ns/element: bench/exact_ops.py's measure();
- step_ratio: exact-v1 step time / torch-native step time at GPT-2-small width and depth
  (12 layers, 12 heads, 768 wide, vocab 50304) on a batch of 1 x 256 tokens, each profile in its
  own child process (alternating), with each child's peak RSS. With --threads 1 the ratio is of
  CPU times (a single-threaded process's CPU time is its wall time on an idle core, whatever else
  the machine runs); otherwise of wall times. Both are printed.

    .venv/bin/python bench/oracle.py [--json] [--threads N] [--steps K] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPT2_SMALL = ROOT / "examples" / "specs" / "gpt2-small.toml"


def _spec(profile: str, quick: bool):
    from commitments.spec import Spec

    d = Spec.from_toml(GPT2_SMALL).canonical()
    d["profile"] = profile
    d["batch"] = {"batch_size": 1, "seq_len": 256}
    if quick:  # a smoke run of the script itself: 2 layers
        d["model"]["n_layer"] = 2
    if profile == "torch-native":
        d["hardware"] = {"device": "cpu", "threads": max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))}
    return Spec.from_dict(d)


def child(profile: str, steps: int, quick: bool, warmup: int) -> None:
    """Init, `warmup` untimed steps, then `steps` timed steps; prints one JSON line."""
    import torch

    from oracle.step import init_state, step

    spec = _spec(profile, quick)
    t0 = time.perf_counter()
    state = init_state(spec)
    init_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)  # benchmark data only
    batch = torch.randint(0, spec.model.vocab_size, (1, spec.sample_len), generator=g)
    times, cpu = [], []
    for t in range(1, warmup + steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        state, loss = step(state, batch, spec, t)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps({"profile": profile, "init_s": init_s, "warmup": warmup,
                      "step_s": statistics.median(times[warmup:]), "step_cpu_s": statistics.median(cpu[warmup:]),
                      "peak_rss_mib": rss_mib,
                      "loss": float(loss), "threads": torch.get_num_threads()}))


def _run_child(profile: str, steps: int, quick: bool, threads: int | None, warmup: int) -> dict:
    env = os.environ.copy()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env["NUMBA_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, __file__, "--child", profile, "--steps", str(steps), "--warmup", str(warmup)]
    cmd += ["--quick"] if quick else []
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{profile} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _exact_ops_measure():
    spec = importlib.util.spec_from_file_location("bench_exact_ops", ROOT / "bench" / "exact_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads for every measurement")
    ap.add_argument("--steps", type=int, default=1, help="timed steps per profile (after one warm-up)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before the timed ones")
    ap.add_argument("--rounds", type=int, default=1, help="alternating exact/native child pairs")
    ap.add_argument("--quick", action="store_true", help="2-layer model, one GEMM shape (smoke run)")
    ap.add_argument("--child", choices=["exact-v1", "torch-native"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.steps, a.quick, a.warmup)

    import torch

    measure = _exact_ops_measure()
    if a.threads:  # set after loading bench/exact_ops.py: set before it, the count did not hold
        torch.set_num_threads(a.threads)
    res = measure(quick=a.quick)
    print(f"threads: {torch.get_num_threads()}")
    print("exact GEMM throughput / torch fp32 matmul throughput, [256, K] @ [K, N]:")
    for name, r in res["gemm"].items():
        print(f"  {name:16s} single {r['single_ratio']:.3f}  hilo {r['hilo_ratio']:.3f}")
    print(f"  gemm_ratio (geometric mean, single): {res['gemm_ratio']:.3f}")
    print("transcendental chain, ns per element (numba exact-v1 kernel vs torch fp32):")
    for name, d in res["transcendental_ns_per_elem"].items():
        print(f"  {name:18s} " + "  ".join(f"{k} {v:.2f}" for k, v in d.items()))

    runs: dict[str, list[dict]] = {"exact-v1": [], "torch-native": []}
    for _ in range(a.rounds):
        for profile in ("exact-v1", "torch-native"):
            print(f"step: {profile} child ...", file=sys.stderr, flush=True)
            runs[profile].append(_run_child(profile, a.steps, a.quick, a.threads, a.warmup))
    ex = statistics.median(r["step_s"] for r in runs["exact-v1"])
    nat = statistics.median(r["step_s"] for r in runs["torch-native"])
    step = {
        "model": "gpt2-small width/depth" + (" (2 layers: --quick)" if a.quick else ""), "batch": "1x256",
        "exact_step_s": ex, "native_step_s": nat, "step_ratio_wall": ex / nat,
        "exact_step_cpu_s": statistics.median(r["step_cpu_s"] for r in runs["exact-v1"]),
        "native_step_cpu_s": statistics.median(r["step_cpu_s"] for r in runs["torch-native"]),
        "exact_peak_rss_mib": max(r["peak_rss_mib"] for r in runs["exact-v1"]),
        "native_peak_rss_mib": max(r["peak_rss_mib"] for r in runs["torch-native"]),
        "exact_init_s": runs["exact-v1"][0]["init_s"],
    }
    step["step_ratio_cpu"] = step["exact_step_cpu_s"] / step["native_step_cpu_s"]
    # A single-threaded child's CPU time is its wall time on an idle core; on a shared machine its
    # wall time mostly measures the scheduler, so that ratio is the one reported.
    step["step_ratio"] = step["step_ratio_cpu"] if a.threads == 1 else step["step_ratio_wall"]
    print(f"step (batch 1x256): wall exact-v1 {ex:.2f} s, torch-native {nat:.2f} s (ratio {ex / nat:.2f}); "
          f"CPU exact {step['exact_step_cpu_s']:.2f} s, native {step['native_step_cpu_s']:.2f} s "
          f"(ratio {step['step_ratio_cpu']:.2f}); step_ratio {step['step_ratio']:.2f}; "
          f"peak RSS exact {step['exact_peak_rss_mib']:.0f} MiB, native {step['native_peak_rss_mib']:.0f} MiB")
    if a.json:
        print(json.dumps({"gemm_ratio": res["gemm_ratio"], "gemm": res["gemm"],
                          "transcendental_ns_per_elem": res["transcendental_ns_per_elem"],
                          "step_ratio": step["step_ratio"], "step": step, "threads": res["threads"]}))


if __name__ == "__main__":
    main()
