"""Benchmark of the exact-v1 ops against torch's own float32 kernels, measured side by side.

Prints ratios (exact GEMM throughput / torch fp32 matmul throughput on GPT-2-small shapes; ns per
element of the numba transcendental and square-root kernels, the eager definitions and torch's
kernels). With --json the last line is a JSON object. `measure()` returns the same dict for bench/oracle.py.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oracle.exact import gemm, kernels, ops  # noqa: E402
from oracle.exact import sqrt as xsqrt  # noqa: E402
from oracle.exact import transcendental as tx  # noqa: E402
from oracle.exact.gemm import exact_matmul  # noqa: E402

GEMM_SHAPES = {  # [M, K] @ [K, N] with M = 256 tokens (batch 1 x 256): (M, K, N)
    "768x768": (256, 768, 768),
    "768x3072": (256, 768, 3072),
    "3072x768": (256, 3072, 768),
    "head_768x50304": (256, 768, 50304),
}


def _time(fn, reps: int) -> float:
    """Median seconds of `reps` calls (one warm-up call first)."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _clock():
    """CPU time when torch runs one thread (a single-threaded call's CPU time is its time on an
    idle core, whatever else the machine runs), else wall time."""
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


# Rounds of _interleaved take at least this long together (more rounds for short calls, so a
# short call's median holds still: docs/perf/bench-notes.md), at most MAX_REPS rounds.
MIN_ROUNDS_S = 2.0
MAX_REPS = 60


def _interleaved(fns: dict, reps: int) -> dict:
    """Median seconds per function, the functions alternating so load changes hit all alike (in
    an order shuffled each round): at least `reps` rounds, more while the rounds take
    under MIN_ROUNDS_S together."""
    clock = _clock()
    t0 = clock()
    for f in fns.values():
        f()
    round_s = clock() - t0  # the warm-up round
    reps = max(reps, min(MAX_REPS, int(MIN_ROUNDS_S / max(round_s, 1e-6))))
    samples = {k: [] for k in fns}
    names = list(fns)
    order = random.Random(0)  # the same orders in every run
    for _ in range(reps):
        # a new order each round: what ran just before a call (the caches it left) moved the
        # median of the same product by up to 6% here when the order was fixed
        order.shuffle(names)
        for k in names:
            f = fns[k]
            t0 = clock()
            f()
            samples[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def _on_float64_route(fn, *args):
    with gemm.route("dgemm"):
        return fn(*args)


def measure(json: bool = False, reps: int = 5, quick: bool = False) -> dict:  # noqa: A002 - CLI mirror
    torch.manual_seed(0)
    res: dict = {"threads": torch.get_num_threads(), "gemm": {}, "transcendental_ns_per_elem": {},
                 "gemm_route": gemm.gemm_route(torch.device("cpu")),
                 "clock": "cpu" if _clock() is time.process_time else "wall"}
    shapes = dict(list(GEMM_SHAPES.items())[:1]) if quick else GEMM_SHAPES
    ratios = []
    for name, (m, k, n) in shapes.items():
        # the linear layout: activations [M, K] times a weight stored [N, K]
        x = torch.randn(m, k)
        w = torch.randn(n, k) * 0.02
        x64, w64 = x.double(), w.double()
        t = _interleaved({
            "torch": lambda x=x, w=w: F.linear(x, w),
            "dgemm": lambda x=x64, w=w64: F.linear(x, w),  # the limit: float64 GEMM, same layout
            "single": lambda x=x, w=w: exact_matmul(x, w.t(), "single"),
            "single_f64": lambda x=x, w=w: _on_float64_route(exact_matmul, x, w.t(), "single"),
            "hilo": lambda x=x, w=w: exact_matmul(x, w.t(), "hilo"),
        }, reps)
        r = {"torch_s": t["torch"], "dgemm_s": t["dgemm"], "single_s": t["single"], "hilo_s": t["hilo"],
             "single_f64_s": t["single_f64"],
             "single_ratio": t["torch"] / t["single"], "hilo_ratio": t["torch"] / t["hilo"],
             "single_f64_ratio": t["torch"] / t["single_f64"], "dgemm_ratio": t["torch"] / t["dgemm"]}
        r["single_of_limit"] = r["single_ratio"] / r["dgemm_ratio"]  # = dgemm_s / single_s
        res["gemm"][name] = r
        ratios.append(r["single_ratio"])
    res["gemm_ratio"] = statistics.geometric_mean(ratios)
    res["dgemm_ratio"] = statistics.geometric_mean([r["dgemm_ratio"] for r in res["gemm"].values()])
    res["gemm_of_limit"] = statistics.geometric_mean([r["single_of_limit"] for r in res["gemm"].values()])

    n = 1 << 18 if quick else 1 << 20
    x = torch.randn(n) * 3
    g = torch.randn(n)
    rows = torch.randn(n // 1024, 1024) * 3
    pos, pos64 = x.abs(), x.abs().double()
    cases = {
        "exp": (lambda: kernels.exp(x), lambda: tx.exp32(x), lambda: torch.exp(x)),
        "gelu_tanh": (lambda: kernels.gelu(x, "tanh"), lambda: tx.gelu32(x, "tanh"),
                      lambda: F.gelu(x, approximate="tanh")),
        "gelu_erf": (lambda: kernels.gelu(x, "erf"), lambda: tx.gelu32(x, "erf"), lambda: F.gelu(x)),
        "gelu_tanh_bwd": (lambda: kernels.gelu_grad(x, g, "tanh"), lambda: tx.gelu_grad32(x, g, "tanh"),
                          lambda: torch.ops.aten.gelu_backward(g, x, approximate="tanh")),
        "silu": (lambda: kernels.silu(x), lambda: tx.silu32(x), lambda: F.silu(x)),
        "silu_bwd": (lambda: kernels.silu_grad(x, g), lambda: tx.silu_grad32(x, g),
                     lambda: torch.ops.aten.silu_backward(g, x)),
        "softmax_rows": (lambda: kernels.softmax_rows(rows), lambda: ops.softmax_rows_eager(rows),
                         lambda: torch.softmax(rows, -1)),
        "log_softmax_rows": (lambda: kernels.log_softmax_rows(rows), lambda: ops.log_softmax_rows_eager(rows),
                             lambda: torch.log_softmax(rows, -1)),
        # correctly rounded square roots (torch's is not on x86 builds: MKL)
        "sqrt_f32": (lambda: kernels.sqrt(pos), lambda: xsqrt.sqrt32(pos), lambda: torch.sqrt(pos)),
        "sqrt_f64": (lambda: kernels.sqrt(pos64), lambda: xsqrt.sqrt64(pos64), lambda: torch.sqrt(pos64)),
    }
    for name, (kern, eager, native) in cases.items():
        fns = {"torch": native, "eager": eager}
        if kernels.enabled():
            fns["kernel"] = kern
        t = _interleaved(fns, max(3, reps // 2))
        d = {k + "_ns": v / n * 1e9 for k, v in t.items()}
        if "kernel" in t:
            d["kernel_over_torch"] = t["kernel"] / t["torch"]
            d["eager_over_kernel"] = t["eager"] / t["kernel"]
        res["transcendental_ns_per_elem"][name] = d
    return res


def _print(res: dict) -> None:
    print(f"threads: {res['threads']}; CPU integer-GEMM route: {res['gemm_route']}")
    print("exact GEMM throughput / torch fp32 matmul throughput (higher is better; target >= 0.4)")
    for name, r in res["gemm"].items():
        print(
            f"  {name:16s} single {r['single_ratio']:.3f} (float64 route {r['single_f64_ratio']:.3f})  "
            f"hilo {r['hilo_ratio']:.3f}  limit (DGEMM/SGEMM) "
            f"{r['dgemm_ratio']:.3f}  single/limit {r['single_of_limit']:.2f}  (torch "
            f"{r['torch_s'] * 1e3:.1f} ms, "
            f"dgemm {r['dgemm_s'] * 1e3:.1f} ms, single {r['single_s'] * 1e3:.1f} ms, hilo "
            f"{r['hilo_s'] * 1e3:.1f} ms)"
        )
    print(f"  gemm_ratio (geometric mean, single): {res['gemm_ratio']:.3f}; limit {res['dgemm_ratio']:.3f}; "
          f"single/limit {res['gemm_of_limit']:.2f}")
    print("transcendentals and square roots, ns per element (kernel = numba exact-v1, eager = the torch "
          "reference definition)")
    for name, d in res["transcendental_ns_per_elem"].items():
        parts = "  ".join(f"{k} {v:.2f}" for k, v in d.items())
        print(f"  {name:18s} {parts}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one GEMM shape, smaller vectors")
    args = ap.parse_args(argv)
    res = measure(reps=args.reps, quick=args.quick)
    _print(res)
    if args.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
