"""exact-v1 on a GPU, against the CPU and against stock PyTorch on the same GPU (bench/gpu.sh).

1. Digests: gpt-tiny (examples/specs/gpt-tiny.toml, 3 steps) and a GPT-2-small step
   (examples/specs/gpt2-small.toml at batch 1 x 256) are walked from their seeds on the CPU
   (float64 GEMM route) and on CUDA (every integer-GEMM route: int7 slices, the default there;
   int8 slices; float64 GEMMs); every walk must give the CPU's digests, init state included.
2. Timing, on CUDA: one GPT-2-small exact-v1 step (each route) against stock PyTorch fp32, TF32
   and bf16-autocast steps of the same model on the same GPU (torch.optim.AdamW), as ratios.
3. Data parallelism over NCCL, on a machine with two or more GPUs: gpt-tiny walked by 2 ranks
   under torchrun (`oracle.parallel`, one GPU each, shards of the batch) must give the CPU's
   digests (docs/exact-v1.md §5.1).
4. One JSON line on stdout (progress on stderr); exit status 1 if a digest differs or a part
   failed, 0 otherwise.

Without CUDA only the CPU half runs: the CPU walks, on every route (the slice routes run through
torch._int_mm on the CPU), compared with each other. Batches are drawn from a fixed torch
generator (benchmark data, the same on every device); nothing is downloaded.

    bench/gpu.sh [--quick] [--cpu-only] [--budget-s S] [--timing-batch B --timing-seq T]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from commitments.spec import Spec  # noqa: E402
from oracle.exact import gemm as G  # noqa: E402

SPECS = ROOT / "examples" / "specs"
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[gpu.sh {time.perf_counter() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def spec_of(name: str, *, batch: tuple[int, int] | None = None, profile: str = "exact-v1",
            narrow: bool = False) -> Spec:
    d = Spec.from_toml(SPECS / f"{name}.toml").canonical()
    d["profile"] = profile
    if narrow:  # --quick: the same architecture, 2 layers of width 64
        d["model"].update(n_layer=2, n_embd=64, n_head=4)
        batch = batch or (2, 32)
    if batch is not None:
        d["batch"] = {"batch_size": batch[0], "seq_len": batch[1]}
    if profile == "torch-native":
        d["hardware"] = {"device": "cuda" if torch.cuda.is_available() else "cpu"}
    return Spec.from_dict(d)


def batches(spec: Spec, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)  # benchmark data only, drawn on the CPU
    return [torch.randint(0, spec.model.vocab_size, (spec.batch.batch_size, spec.sample_len), generator=g)
            for _ in range(steps)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def walk(spec: Spec, data: list[torch.Tensor], device: str, route: str) -> dict:
    """Init on `device`, then len(data) steps on route `route`: digests, losses and step times."""
    from oracle.step import init_state, step

    with G.route(route):
        t0 = time.perf_counter()
        state = init_state(spec, device=torch.device(device))
        sync(device)
        init_s = time.perf_counter() - t0
        digests, losses, times = [state.digest().hex()], [], []
        for t, batch in enumerate(data, start=1):
            t0 = time.perf_counter()
            state, loss = step(state, batch, spec, t)
            sync(device)
            times.append(time.perf_counter() - t0)
            digests.append(state.digest().hex())
            losses.append(f"0x{loss.cpu().view(torch.int32).item() & 0xFFFFFFFF:08x}")
    return {
        "device": device,
        "route": route,
        "init_s": round(init_s, 3),
        "step_s": [round(x, 3) for x in times],
        "digests": digests,
        "loss_bits": losses,
    }


def compare(name: str, spec: Spec, steps: int, configs: list[tuple[str, str]], out: dict) -> bool:
    """Walk every (device, route) config; the first is the reference. True if all agree."""
    data = batches(spec, steps)
    runs, ok = [], True
    for device, route in configs:
        log(f"{name}: walking {steps} step(s) on {device}, route {route} ...")
        try:
            r = walk(spec, data, device, route)
        except Exception as exc:  # a failed part is reported, the others still run
            log(f"{name} {device}/{route} FAILED: {exc!r}\n{traceback.format_exc(limit=4)}")
            runs.append({"device": device, "route": route, "error": repr(exc)[:500]})
            ok = False
            continue
        r["match"] = not runs or ("digests" in runs[0] and r["digests"] == runs[0]["digests"]
                                  and r["loss_bits"] == runs[0]["loss_bits"])
        ok &= r["match"]
        log(f"{name}: {device}/{route}: init {r['init_s']} s, steps {r['step_s']} s, "
            f"final digest {r['digests'][-1][:16]}… {'==' if r['match'] else '!= (MISMATCH)'} reference")
        runs.append(r)
    out[name] = {"steps": steps, "runs": runs, "identical": ok}
    return ok


def _stock_step_fn(spec: Spec, mode: str, device: str):
    """A stock PyTorch training step of the spec's model (oracle.native ops, torch.optim.AdamW):
    fp32, tf32 (TF32 matmuls and convolutions) or bf16 (autocast)."""
    from oracle import models, native
    from oracle.step import init_state

    torch.use_deterministic_algorithms(False)
    model = models.build(spec.model, matmul=spec.exact.matmul)
    params = {n: p.detach().clone().requires_grad_(True)
              for n, p in init_state(spec, device=torch.device(device)).params().items()}
    o = spec.optimizer
    opt = torch.optim.AdamW(list(params.values()), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                            weight_decay=o.weight_decay)
    data = batches(spec, 1)[0].to(device)
    inputs, targets = data[:, :-1], data[:, 1:]

    def run():
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"  # reset after each timed call
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            logits = model.forward(native, params, inputs, None)
            loss = native.cross_entropy(logits, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), o.grad_clip)
        opt.step()
    return run


def _exact_step_fn(spec: Spec, route: str, device: str):
    from oracle.step import init_state, step

    state = init_state(spec, device=torch.device(device))
    data = batches(spec, 1)[0]

    def run():
        with G.route(route):
            step(state, data, spec, 1)
    return run


def timing(batch: tuple[int, int], reps: int, out: dict, deadline: float) -> None:
    """Median step seconds of each mode on CUDA, modes interleaved; ratios to stock fp32."""
    spec = spec_of("gpt2-small", batch=batch)
    fns = {}
    for mode in ("fp32", "tf32", "bf16"):
        fns[mode] = ("stock", mode)
    for route in ("int7", "int8", "dgemm"):
        fns[f"exact_{route}"] = ("exact", route)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    errors: dict[str, str] = {}
    runners: dict = {}
    for rep in range(reps + 1):  # the first round warms up (cuBLAS handles, autotuning, caches)
        for key, (kind, arg) in fns.items():
            if key in errors or (rep and time.perf_counter() > deadline):
                continue
            try:
                if key not in runners:  # built once (state and model on the GPU), outside the timing
                    runners[key] = (_stock_step_fn if kind == "stock" else _exact_step_fn)(spec, arg, "cuda")
                run = runners[key]
                sync("cuda")
                t0 = time.perf_counter()
                run()
                sync("cuda")
                dt = time.perf_counter() - t0
            except Exception as exc:
                errors[key] = repr(exc)[:500]
                log(f"timing {key} FAILED: {exc!r}")
                continue
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
            if rep:
                samples[key].append(dt)
            log(f"timing {key}: {'warm-up' if not rep else f'rep {rep}'} {dt:.3f} s")
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    res = {
        "model": "gpt2-small",
        "batch": f"{batch[0]}x{batch[1]}",
        "reps": {k: len(v) for k, v in samples.items()},
        "step_s": {k: round(v, 4) for k, v in med.items()},
    }
    if "fp32" in med:
        res["ratio_to_fp32"] = {k: round(v / med["fp32"], 3) for k, v in med.items()}
    if errors:
        res["errors"] = errors
    out["timing"] = res


def nccl(spec: Spec, steps: int, reference: dict, out: dict) -> bool:
    """gpt-tiny walked by 2 NCCL ranks (torchrun, one GPU each): the CPU reference's digests?"""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pot-nccl-") as tmp:
        result = Path(tmp) / "rank0.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(Path(__file__).resolve()),
            "--dp-rank",
            json.dumps(spec.canonical()),
            str(steps),
            str(result),
        ]
        log("nccl: gpt-tiny over 2 ranks (torchrun, NCCL) ...")
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not result.exists():
            out["nccl"] = {"error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
            log(f"nccl FAILED: exit {proc.returncode}")
            return False
        got = json.loads(result.read_text())
    match = got["digests"] == reference["digests"] and got["loss_bits"] == reference["loss_bits"]
    out["nccl"] = {"ranks": 2, "wall_s": round(time.perf_counter() - t0, 1), "match": match,
                   "final_digest": got["digests"][-1]}
    log(f"nccl: 2 ranks {'==' if match else '!= (MISMATCH)'} the CPU walk")
    return match


def dp_rank(spec_json: str, steps: int, dest: str) -> int:
    """One rank of the NCCL check (run by torchrun): walk with oracle.parallel; rank 0 writes the digests."""
    from oracle.parallel import Ranks
    from oracle.step import init_state, step

    ranks = Ranks.from_env()
    spec = Spec.from_dict(json.loads(spec_json))
    state = init_state(spec, device=ranks.device)
    digests, losses = [state.digest().hex()], []
    for t, batch in enumerate(batches(spec, steps), start=1):
        state, loss = step(state, batch, spec, t, ranks=ranks)
        digests.append(state.digest().hex())
        losses.append(f"0x{loss.cpu().view(torch.int32).item() & 0xFFFFFFFF:08x}")
    if ranks.leader:
        Path(dest).write_text(json.dumps({"digests": digests, "loss_bits": losses}))
    ranks.close()
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--dp-rank"]:
        return dp_rank(argv[1], int(argv[2]), argv[3])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a narrowed gpt-tiny only, 2 steps (the test suite's CPU half)")
    ap.add_argument("--cpu-only", action="store_true", help="skip CUDA even if present")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting timing reps after this")
    ap.add_argument("--timing-batch", type=int, default=4)
    ap.add_argument("--timing-seq", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3, help="timed steps per mode (after one warm-up)")
    a = ap.parse_args(argv)

    cuda = torch.cuda.is_available() and not a.cpu_only
    out: dict = {"torch": torch.__version__, "python": platform.python_version(), "cuda": cuda,
                 "cpu_threads": torch.get_num_threads(), "quick": a.quick}
    if cuda:
        p = torch.cuda.get_device_properties(0)
        out["gpu"] = {
            "name": p.name,
            "capability": f"{p.major}.{p.minor}",
            "memory_gib": round(p.total_memory / 2**30, 1),
            "cuda_runtime": torch.version.cuda,
        }
    log(f"torch {torch.__version__}, CUDA {'yes: ' + out['gpu']['name'] if cuda else 'no (CPU half only)'}, "
        f"{out['cpu_threads']} CPU threads")
    ok = True
    digests: dict = {}
    tiny_cfgs = [("cpu", "dgemm")]
    tiny_cfgs += (
        [("cuda", r) for r in ("int7", "int8", "dgemm")] if cuda else [("cpu", "int7"), ("cpu", "int8")]
    )
    tiny = "gpt-tiny (2 layers, width 64, 2x32: --quick)" if a.quick else "gpt-tiny"
    ok &= compare(tiny, spec_of("gpt-tiny", narrow=a.quick), 2 if a.quick else 3, tiny_cfgs, digests)
    if not a.quick:
        small_cfgs = [("cpu", "dgemm")] + ([("cuda", r) for r in ("int7", "dgemm")] if cuda else [])
        ok &= compare("gpt2-small", spec_of("gpt2-small", batch=(1, 256)), 1, small_cfgs, digests)
    out["digests"] = digests
    if cuda and torch.cuda.device_count() >= 2:
        try:
            ok &= nccl(
                spec_of("gpt-tiny", narrow=a.quick), 2 if a.quick else 3, digests[tiny]["runs"][0], out
            )
        except Exception as exc:
            out["nccl"] = {"error": repr(exc)[:500]}
            ok = False
    elif cuda:
        out["nccl"] = {"skipped": "fewer than 2 GPUs"}
    if cuda:
        try:
            timing((a.timing_batch, a.timing_seq), a.reps, out, T0 + a.budget_s)
            ok &= "errors" not in out["timing"]
        except Exception as exc:
            out["timing"] = {"error": repr(exc)[:500]}
            ok = False
    out["ok"] = bool(ok)
    out["wall_s"] = round(time.perf_counter() - T0, 1)
    log(f"done in {out['wall_s']} s: {'all digests identical' if ok else 'FAILURES (see the JSON)'}")
    print(json.dumps(out, sort_keys=True), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
