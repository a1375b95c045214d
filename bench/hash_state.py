"""Throughput of state_digest on a GPT-2-small-sized training state with Adam moments.

The state's tensors are views into one flat float32 buffer, so raw BLAKE3 (single- and
multi-threaded) over that buffer hashes exactly the same bytes; all three run side by side in
one process and are reported as GB/s and as ratios. `--json` prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def gpt2_shapes(layers: int, d_model: int, vocab: int, ctx: int) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of a GPT-2 style decoder (124M parameters at the defaults)."""
    d, f = d_model, 4 * d_model
    shapes = [("wte.weight", (vocab, d)), ("wpe.weight", (ctx, d))]
    for i in range(layers):
        p = f"h.{i}."
        shapes += [
            (p + "ln_1.weight", (d,)), (p + "ln_1.bias", (d,)),
            (p + "attn.c_attn.weight", (d, 3 * d)), (p + "attn.c_attn.bias", (3 * d,)),
            (p + "attn.c_proj.weight", (d, d)), (p + "attn.c_proj.bias", (d,)),
            (p + "ln_2.weight", (d,)), (p + "ln_2.bias", (d,)),
            (p + "mlp.c_fc.weight", (d, f)), (p + "mlp.c_fc.bias", (f,)),
            (p + "mlp.c_proj.weight", (f, d)), (p + "mlp.c_proj.bias", (d,)),
        ]
    shapes += [("ln_f.weight", (d,)), ("ln_f.bias", (d,))]
    return shapes


def build_state(shapes, seed: int):
    """(flat buffer, ordered state items): params, exp_avg, exp_avg_sq, step counters, RNG key."""
    import torch

    numels = [int(torch.Size(s).numel()) for _, s in shapes]
    total = sum(numels)
    flat = torch.empty(3 * total, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    block = 1 << 24
    for i in range(0, flat.numel(), block):  # filled in blocks to keep peak memory at the buffer
        flat[i : i + block] = torch.rand(min(block, flat.numel() - i), generator=gen)
    items = []
    for part, kind in enumerate(("param", "exp_avg", "exp_avg_sq")):
        off = part * total
        for (name, shape), n in zip(shapes, numels, strict=True):
            items.append((f"{kind}/{name}", flat[off : off + n].view(shape)))
            off += n
    for name, _ in shapes:
        items.append((f"step/{name}", torch.tensor(1000.0)))
    items.append(("rng/key", torch.tensor([0x1234, 0x5678, 0x9ABC, 0xDEF0], dtype=torch.int64)))
    return flat, items, total


def best_times(repeats: int, methods: dict) -> dict[str, float]:
    """Best wall time of each method; rounds interleave the methods so that load from other
    processes on the machine falls on all of them alike."""
    best = {k: float("inf") for k in methods}
    for _ in range(repeats):
        for k, fn in methods.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per method")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = ap.parse_args(argv)
    if min(args.layers, args.d_model, args.vocab, args.ctx, args.repeats) < 1:
        ap.error("--layers, --d-model, --vocab, --ctx and --repeats must be positive")

    import blake3
    import numpy as np

    from commitments.tensors import state_digest

    shapes = gpt2_shapes(args.layers, args.d_model, args.vocab, args.ctx)
    flat, items, params = build_state(shapes, args.seed)
    view = memoryview(flat.numpy().view(np.uint8))
    state_bytes = sum(t.numel() * t.element_size() for _, t in items)
    gb = state_bytes / 1e9
    flat_gb = view.nbytes / 1e9

    best = best_times(args.repeats, {
        "single": lambda: blake3.blake3(view).digest(),
        "multi": lambda: blake3.blake3(view, max_threads=blake3.blake3.AUTO).digest(),
        "state": lambda: state_digest(items),
        "state_serial": lambda: state_digest(items, max_workers=1),
    })
    t_st, t_mt, t_sd, t_sd1 = best["single"], best["multi"], best["state"], best["state_serial"]

    res = {
        "params": params,
        "tensors": len(items),
        "state_gb": round(gb, 4),
        "cpus": os.cpu_count(),
        "blake3_single_gbps": round(flat_gb / t_st, 3),
        "blake3_multi_gbps": round(flat_gb / t_mt, 3),
        "state_digest_gbps": round(gb / t_sd, 3),
        "state_digest_serial_gbps": round(gb / t_sd1, 3),
    }
    res["state_digest_vs_multi"] = round(res["state_digest_gbps"] / res["blake3_multi_gbps"], 3)
    res["state_digest_vs_single"] = round(res["state_digest_gbps"] / res["blake3_single_gbps"], 3)
    print(f"state: {params:,} parameters x3 (+ step counters, RNG key), {len(items)} tensors, "
          f"{gb:.3f} GB, {res['cpus']} CPUs, best of {args.repeats}")
    print(f"blake3 single-thread, flat buffer : {res['blake3_single_gbps']:7.3f} GB/s")
    print(f"blake3 multi-thread, flat buffer  : {res['blake3_multi_gbps']:7.3f} GB/s")
    print(f"state_digest (thread pool)        : {res['state_digest_gbps']:7.3f} GB/s  "
          f"= {res['state_digest_vs_multi']:.3f}x multi, {res['state_digest_vs_single']:.3f}x single")
    print(f"state_digest (one worker)         : {res['state_digest_serial_gbps']:7.3f} GB/s")
    if args.json:
        print(json.dumps(res, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
