"""Benchmark of the optimizer part of an exact-v1 step: optim.clip + optim.update (AdamW) on the
parameter list of GPT-2 small (124 M parameters, its real shapes and roles), one thread.

"eager" is the code before the compiled updates: the eager AdamW (with the square-root kernel),
the eager sum of squares and the multiply by the clipping coefficient. "kernels" is the default
path. Both run interleaved; medians of CPU time. Two cases: the clip active (coef < 1) and not
(coef = 1). With --json the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commitments.spec import ModelSpec, OptimizerSpec  # noqa: E402
from oracle import models, optim  # noqa: E402
from oracle.exact import kernels, ops  # noqa: E402

GPT2_SMALL = ModelSpec(kind="gpt", vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)


@contextlib.contextmanager
def _eager_update():
    """The updates' eager torch ops, kernels.sqrt still the kernel (as before the compiled updates)."""
    compiled = optim._compiled
    optim._compiled = lambda *a, **k: False
    try:
        yield
    finally:
        optim._compiled = compiled


def _clip(max_norm, grads, eager):
    """optim.clip; eager: the sum of squares and the multiply by coef as before (its one scalar
    square root runs eager too: negligible)."""
    with kernels.disabled() if eager else contextlib.nullcontext():
        return optim.clip(ops, grads, max_norm)


def _problem():
    specs = models.build(GPT2_SMALL).param_specs()
    g = torch.Generator().manual_seed(0)
    names = [p.name for p in specs]
    roles = [p.role for p in specs]
    params = [torch.randn(p.shape, generator=g) * 0.02 for p in specs]
    grads = [torch.randn(p.shape, generator=g) * 1e-3 for p in specs]
    m = [torch.randn(p.shape, generator=g) * 1e-4 for p in specs]
    v = [torch.randn(p.shape, generator=g).square_() * 1e-8 for p in specs]
    return names, roles, params, grads, {"exp_avg": m, "exp_avg_sq": v}


def measure(reps: int = 3) -> dict:
    torch.set_num_threads(1)
    names, roles, params, grads, moments = _problem()
    n = sum(p.numel() for p in params)
    spec = OptimizerSpec(kind="adamw", lr=6e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    res = {
        "params": n,
        "tensors": len(params),
        "threads": torch.get_num_threads(),
        "clock": "cpu",
        "cases": {},
    }
    for case, max_norm in (("clip_active", 1.0), ("clip_inactive", 1e6)):
        def step(eager=False, max_norm=max_norm):
            with torch.no_grad():
                gr, norm = _clip(max_norm, grads, eager)
                with _eager_update() if eager else contextlib.nullcontext():
                    return optim.update(spec, 10, names, params, gr, moments, roles), norm

        def clip_only(eager=False, max_norm=max_norm):
            with torch.no_grad():
                return _clip(max_norm, grads, eager)

        # the same bytes both ways
        (pa, ma), na = step()
        (pb, mb), nb = step(eager=True)
        assert na.view(torch.int32).item() == nb.view(torch.int32).item()
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(pa, pb, strict=True))
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32))
                   for k in ma for a, b in zip(ma[k], mb[k], strict=True))
        del pa, ma, pb, mb
        fns = {"eager": lambda: step(True), "kernels": step,
               "eager_clip": lambda: clip_only(True), "kernels_clip": clip_only}
        samples = {k: [] for k in fns}
        for _ in range(reps):
            for k, f in fns.items():
                t0 = time.process_time()
                out = f()
                samples[k].append(time.process_time() - t0)
                del out
        med = {k: statistics.median(s) for k, s in samples.items()}
        med["ratio"] = med["eager"] / med["kernels"]
        med["clip_ratio"] = med["eager_clip"] / med["kernels_clip"]
        res["cases"][case] = med
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = measure(a.reps)
    print(
        f"{res['params'] / 1e6:.1f} M parameters in {res['tensors']} tensors, {res['threads']} thread, CPU "
        "time"
    )
    for case, r in res["cases"].items():
        print(
            f"{case:14s} clip+update: eager {r['eager']:.3f} s, kernels {r['kernels']:.3f} s "
            f"({r['ratio']:.1f}x); clip alone: eager {r['eager_clip']:.3f} s, kernels "
            f"{r['kernels_clip']:.3f} s "
            f"({r['clip_ratio']:.1f}x)"
        )
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
