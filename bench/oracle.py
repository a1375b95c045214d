"""Benchmark of the oracle, measured side by side in one run; prints ratios, never pass/fail.

- gemm_ratio and the transcendental kernels' ns/element: bench/exact_ops.py's measure(). Beside
  each shape's exact ratio it prints the limit: a float64 GEMM (DGEMM) of the same shape over the
  float32 one (SGEMM), since the exact product on the float64 route is a float64 GEMM of
  integers plus quantisation, and how much of that limit the exact GEMM reaches. Where the CPU's
  default integer-GEMM route is the int8 slice route (AMX, docs/exact-v1.md §13), the exact
  product on the float64 route is printed beside it, and so is a third step child: the exact-v1
  step with POT_EXACT_GEMM=dgemm;
- step_ratio: exact-v1 step time / torch-native step time for each model of STEP_MODELS (GPT-2
  small: 12 layers, 12 heads, 768 wide, vocab 50304, batch 1 x 256 tokens; a Llama of the same
  width and depth with grouped-query attention and a SwiGLU MLP), at each thread count
  of --step-threads (default 1 and 2), each profile in its own child process (alternating), with
  each child's peak RSS. At 1 thread the ratio is of CPU times (a single-threaded process's CPU
  time is its wall time on an idle core, whatever else the machine runs); at more, of wall times
  (CPU times are printed too). Each child times --steps steps after --warmup untimed ones
  (default 3: a process's first steps write most large arrays into fresh pages, and the native
  step's second step took twice its fifth here, the exact one 1.4 times; a miner runs thousands).
  Beside them runs the limit step (LIMIT_STEP, below): the torch-native step with float64 GEMMs,
  the step an exact path on the float64 route would take if only its GEMMs cost more than
  native ones; limit_step_ratio = limit / native and step_of_limit = exact / limit.
  Another model is one more STEP_MODELS entry. The initial state is
  made once per model in its own child and loaded by the step children; the peak RSS printed is
  that of the steps alone (the kernel's mark is reset after loading). --thp asks torch's
  allocator for transparent huge pages (THP_MEM_ALLOC_ENABLE=1) in every process, both profiles.

    .venv/bin/python bench/oracle.py [--json] [--threads N] [--step-threads 1,2] [--steps K]
        [--warmup W] [--quick]
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPT2_SMALL = ROOT / "examples" / "specs" / "gpt2-small.toml"


def _gpt2_small(quick: bool) -> dict:
    """GPT-2 small at batch 1 x 256 (--quick: 2 layers, a smoke run of the script itself)."""
    from commitments.spec import Spec

    d = Spec.from_toml(GPT2_SMALL).canonical()
    d["batch"] = {"batch_size": 1, "seq_len": 256}
    if quick:
        d["model"]["n_layer"] = 2
    return d


LLAMA_TINY = ROOT / "examples" / "specs" / "llama-tiny.toml"


def _llama_small(quick: bool) -> dict:
    """A Llama at GPT-2 small's width and depth (12 layers, 12 heads sharing 4 kv heads, 768 wide,
    SwiGLU 2048, vocab 50304, tied head), batch 1 x 256 (--quick: 2 layers)."""
    from commitments.spec import Spec

    d = Spec.from_toml(LLAMA_TINY).canonical()
    d["model"].update(vocab_size=50304, block_size=1024, n_layer=2 if quick else 12, n_head=12, n_kv_head=4,
                      n_embd=768, intermediate_size=2048, tie_weights=True)
    d["batch"] = {"batch_size": 1, "seq_len": 256}
    return d


# name -> (label, function(quick) -> the spec as a dict, without the profile); one line each in
# the report, in this order
STEP_MODELS = {
    "gpt2-small": ("GPT-2 small width/depth, batch 1x256", _gpt2_small),
    "llama-small": ("Llama at GPT-2 small width/depth (GQA 12/4, SwiGLU 2048), batch 1x256", _llama_small),
}


def _spec(model: str, profile: str, quick: bool):
    from commitments.spec import Spec

    d = STEP_MODELS[model][1](quick)
    d["profile"] = profile
    if profile == "torch-native":
        d["hardware"] = {"device": "cpu", "threads": max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))}
    return Spec.from_dict(d)


def _peak_rss_reset() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process: Linux >= 4.0."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def init_child(model: str, quick: bool, path: str) -> None:
    """Initialise the model's state once and save it, so the step children load it."""
    from oracle.step import init_state

    spec = _spec(model, "exact-v1", quick)
    t0 = time.perf_counter()
    state = init_state(spec)
    init_s = time.perf_counter() - t0
    state.to_safetensors(path)
    print(json.dumps({"init_s": init_s, "peak_rss_mib": _peak_rss_mib()}))


# The limit step: the torch-native step with every GEMM (linear layers, the head, attention's two
# products; forward and backward) a float64 GEMM of its operands cast to float64, the product cast
# back. On the float64 route an exact product is at least that: a float64 GEMM plus a pass that
# reads each float32 operand and writes it as float64. Everything else is the native step's. So
# limit / native is the step ratio of an exact path whose GEMMs ran at their limit and whose other
# ops cost nothing more than native ones, and exact / limit is how much of that limit it reaches.
LIMIT_STEP = "limit"


def _float64_gemms() -> None:
    """Make this process's torch-native GEMMs float64 ones (the limit-step child only)."""
    import torch
    import torch.nn.functional as F

    from oracle import native

    def f64(t):
        return None if t is None else t.to(torch.float64)

    def fp32_only(bf16):
        if bf16:  # the STEP_MODELS specs are float32; a bf16-mixed limit would round as well
            raise SystemExit("the limit step is defined for float32 specs only")

    def linear(x, w, b=None, *, variant="single", bf16=False):
        fp32_only(bf16)
        return F.linear(f64(x), f64(w), f64(b)).to(x.dtype)

    def matmul(a, b, *, variant="single", bf16=False):
        fp32_only(bf16)
        return torch.matmul(f64(a), f64(b)).to(a.dtype)

    native.linear, native.matmul = linear, matmul  # causal_attention looks matmul up at each call


def child(model: str, profile: str, steps: int, quick: bool, warmup: int, state_path: str) -> None:
    """Load the initial state, `warmup` untimed steps, then `steps` timed steps; prints one JSON
    line. The peak RSS is that of the steps (the mark is reset after loading the state)."""
    import torch

    from oracle.state import TrainState
    from oracle.step import step

    if profile == LIMIT_STEP:
        _float64_gemms()
    spec = _spec(model, "torch-native" if profile == LIMIT_STEP else profile, quick)
    state = TrainState.from_safetensors(state_path, spec)
    reset = _peak_rss_reset()
    g = torch.Generator().manual_seed(0)  # benchmark data only
    batch = torch.randint(0, spec.model.vocab_size, (1, spec.sample_len), generator=g)
    times, cpu = [], []
    for t in range(1, warmup + steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        state, loss = step(state, batch, spec, t)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(
        json.dumps(
            {
                "profile": profile,
                "warmup": warmup,
                "step_s": statistics.median(times[warmup:]),
                "step_cpu_s": statistics.median(cpu[warmup:]),
                "peak_rss_mib": _peak_rss_mib(),
                "peak_is_steps_only": reset,
                "loss": float(loss),
                "threads": torch.get_num_threads(),
            }
        )
    )


def _child_env(threads: int | None, thp: bool) -> dict:
    env = os.environ.copy()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env["NUMBA_NUM_THREADS"] = str(threads)
    if thp:  # torch's CPU allocator asks for transparent huge pages for large tensors (both profiles)
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    return env


def _run(cmd: list[str], env: dict, what: str) -> dict:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{what} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run_child(
    model: str, profile: str, a, threads: int | None, state_path: str, route: str | None = None
) -> dict:
    cmd = [sys.executable, __file__, "--child", profile, "--model", model, "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--state", state_path]
    cmd += ["--quick"] if a.quick else []
    env = _child_env(threads, a.thp)
    if route:
        env["POT_EXACT_GEMM"] = route
    return _run(cmd, env, profile)


F64_ROUTE = "exact-v1 (float64 route)"  # the same exact-v1 step with POT_EXACT_GEMM=dgemm


def _exact_ops_measure():
    spec = importlib.util.spec_from_file_location("bench_exact_ops", ROOT / "bench" / "exact_ops.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.measure


def step_ratio(model: str, threads: int, a, state_path: str) -> dict:
    """exact-v1 against torch-native steps of one model at one thread count (alternating children)."""
    import torch

    from oracle.exact import gemm

    runs: dict[str, list[dict]] = {"exact-v1": [], "torch-native": [], LIMIT_STEP: []}
    if gemm.gemm_route(torch.device("cpu")) != "dgemm":  # also measure the float64 route beside it
        runs[F64_ROUTE] = []
    for _ in range(a.rounds):
        for name in runs:
            print(f"step: {model} {name} child, {threads} thread(s) ...", file=sys.stderr, flush=True)
            profile, route = ("exact-v1", "dgemm") if name == F64_ROUTE else (name, None)
            runs[name].append(_run_child(model, profile, a, threads, state_path, route))

    def med(profile, key):
        return statistics.median(r[key] for r in runs[profile])

    step = {
        "model": STEP_MODELS[model][0] + (" (2 layers: --quick)" if a.quick else ""),
        "threads": threads,
        "exact_step_s": med("exact-v1", "step_s"),
        "native_step_s": med("torch-native", "step_s"),
        "exact_step_cpu_s": med("exact-v1", "step_cpu_s"),
        "native_step_cpu_s": med("torch-native", "step_cpu_s"),
        "limit_step_s": med(LIMIT_STEP, "step_s"),
        "limit_step_cpu_s": med(LIMIT_STEP, "step_cpu_s"),
        "exact_peak_rss_mib": max(r["peak_rss_mib"] for r in runs["exact-v1"]),
        "native_peak_rss_mib": max(r["peak_rss_mib"] for r in runs["torch-native"]),
        "peak_rss_of_steps_only": all(r["peak_is_steps_only"] for rs in runs.values() for r in rs),
        "thp": a.thp,
    }
    step["gemm_route"] = gemm.gemm_route(torch.device("cpu"))
    if F64_ROUTE in runs:
        step["exact_f64_step_s"] = med(F64_ROUTE, "step_s")
        step["exact_f64_step_cpu_s"] = med(F64_ROUTE, "step_cpu_s")
        key = "exact_f64_step_cpu_s" if threads == 1 else "exact_f64_step_s"
        step["step_ratio_f64_route"] = step[key] / step[key.replace("exact_f64", "native")]
    step["step_ratio_wall"] = step["exact_step_s"] / step["native_step_s"]
    step["step_ratio_cpu"] = step["exact_step_cpu_s"] / step["native_step_cpu_s"]
    step["rss_ratio"] = step["exact_peak_rss_mib"] / step["native_peak_rss_mib"]
    # A single-threaded child's CPU time is its wall time on an idle core; on a shared machine its
    # wall time mostly measures the scheduler, so that ratio is the one reported.
    step["step_ratio"] = step["step_ratio_cpu"] if threads == 1 else step["step_ratio_wall"]
    key = "cpu_s" if threads == 1 else "s"
    step["limit_step_ratio"] = step[f"limit_step_{key}"] / step[f"native_step_{key}"]
    step["step_of_limit"] = step[f"exact_step_{key}"] / step[f"limit_step_{key}"]
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    ap.add_argument(
        "--threads", type=int, default=None, help="intra-op threads of the GEMM/kernel measurements"
    )
    ap.add_argument("--step-threads", default="1,2", help="comma-separated thread counts of the step ratios")
    ap.add_argument(
        "--models", default=",".join(STEP_MODELS), help=f"step models, of {', '.join(STEP_MODELS)}"
    )
    ap.add_argument("--steps", type=int, default=1, help="timed steps per profile (after the warm-up)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps before the timed ones (the first steps of a process pay its allocator's "
        "transient: fresh pages on every large array; see docs/perf/cpu.md §15.0)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="alternating exact/native child pairs")
    ap.add_argument("--quick", action="store_true", help="2-layer model, one GEMM shape (smoke run)")
    ap.add_argument("--thp", action="store_true",
                    help="THP_MEM_ALLOC_ENABLE=1 (transparent huge pages for large tensors) in every process")
    ap.add_argument("--child", choices=["exact-v1", "torch-native", LIMIT_STEP], help=argparse.SUPPRESS)
    ap.add_argument("--init-child", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="gpt2-small", help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.init_child:
        return init_child(a.model, a.quick, a.init_child)
    if a.child:
        return child(a.model, a.child, a.steps, a.quick, a.warmup, a.state)
    threads_list = [int(t) for t in a.step_threads.split(",") if t.strip()]
    models = [m for m in a.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in STEP_MODELS]
    if unknown or any(t < 1 for t in threads_list):
        raise SystemExit(
            f"--models takes {', '.join(STEP_MODELS)} (got {unknown}); --step-threads positive ints"
        )

    if a.thp:  # read by torch's allocator once, at its first allocation: set before importing torch
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    import torch

    measure = _exact_ops_measure()
    if a.threads:  # set after loading bench/exact_ops.py: set before it, the count did not hold
        torch.set_num_threads(a.threads)
    res = measure(quick=a.quick)
    print(f"threads: {torch.get_num_threads()} ({res['clock']} time: CPU time at 1 thread, else wall time); "
          f"CPU integer-GEMM route: {res['gemm_route']}")
    print("exact GEMM throughput / torch fp32 matmul throughput, [256, K] @ [K, N]; limit = DGEMM/SGEMM "
          "throughput on the same shape:")
    for name, r in res["gemm"].items():
        print(f"  {name:16s} single {r['single_ratio']:.3f} (float64 route {r['single_f64_ratio']:.3f})  "
              f"hilo {r['hilo_ratio']:.3f}  "
              f"limit {r['dgemm_ratio']:.3f}  single/limit {r['single_of_limit']:.2f}")
    print(f"  gemm_ratio (geometric mean, single): {res['gemm_ratio']:.3f}  limit {res['dgemm_ratio']:.3f}  "
          f"single/limit {res['gemm_of_limit']:.2f}")
    print("transcendental chain, ns per element (numba exact-v1 kernel vs torch fp32):")
    for name, d in res["transcendental_ns_per_elem"].items():
        print(f"  {name:18s} " + "  ".join(f"{k} {v:.2f}" for k, v in d.items()))

    steps = []
    for model in models:
        with tempfile.TemporaryDirectory(prefix="pot-bench-") as tmp:
            state_path = str(Path(tmp) / "state_0.safetensors")
            print(f"init: {model} (once, shared by the step children) ...", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--init-child", state_path, "--model", model]
            init = _run(cmd + (["--quick"] if a.quick else []), _child_env(None, a.thp), "init")
            print(f"init {STEP_MODELS[model][0]}: {init['init_s']:.1f} s", flush=True)
            for threads in threads_list:
                st = step_ratio(model, threads, a, state_path)
                st["exact_init_s"] = init["init_s"]
                steps.append(st)
                print(
                    f"step {st['model']}, {threads} thread(s): wall exact-v1 {st['exact_step_s']:.2f} s, "
                    "torch-native "
                    f"{st['native_step_s']:.2f} s (ratio {st['step_ratio_wall']:.2f}); CPU exact "
                    f"{st['exact_step_cpu_s']:.2f} s, native {st['native_step_cpu_s']:.2f} s (ratio "
                    f"{st['step_ratio_cpu']:.2f}); step_ratio {st['step_ratio']:.2f}; limit step (native, "
                    f"float64 GEMMs) {st['limit_step_cpu_s' if threads == 1 else 'limit_step_s']:.2f} s: "
                    f"limit_step_ratio {st['limit_step_ratio']:.2f}, exact / limit "
                    f"{st['step_of_limit']:.2f}; peak RSS exact "
                    f"{st['exact_peak_rss_mib']:.0f} MiB, native {st['native_peak_rss_mib']:.0f} MiB "
                    f"({st['rss_ratio']:.2f}x, steps only: {st['peak_rss_of_steps_only']}); integer-GEMM "
                    "route "
                    f"{st['gemm_route']}"
                    + (
                        f", on the float64 route: step_ratio {st['step_ratio_f64_route']:.2f}"
                        if "step_ratio_f64_route" in st
                        else ""
                    ),
                    flush=True,
                )
    if a.json:
        first = steps[0] if steps else {}
        print(json.dumps({"gemm_ratio": res["gemm_ratio"], "dgemm_ratio": res["dgemm_ratio"],
                          "gemm_of_limit": res["gemm_of_limit"], "gemm": res["gemm"],
                          "transcendental_ns_per_elem": res["transcendental_ns_per_elem"],
                          "step_ratio": first.get("step_ratio"), "step": first, "steps": steps,
                          "threads": res["threads"]}))


if __name__ == "__main__":
    main()
