"""bf16-mixed against float32 under exact-v1: the loss of the same run in both dtypes, side by side.

One GPT (the same Philox initial weights, the same batches of the seeded schedule over the default
corpus, AdamW with a warm-up and cosine decay) is trained step by step in both dtypes, alternating,
in one process. Prints the mean training loss of both over each window of --every steps (and
the largest difference of one step's loss in the window), the held-out loss of both
final models (each evaluated in its own dtype and in float32) and the step-time ratio (steps 3
on, one thread).

    .venv/bin/python bench/bf16_loss.py [--steps N] [--every K] [--n-layer L] [--n-embd C] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def spec_of(dtype: str, steps: int, n_layer: int = 2, n_embd: int = 64):
    from commitments.spec import Spec

    return Spec.from_dict(
        {
            "profile": "exact-v1",
            "dtype": dtype,
            "steps": steps,
            "model": {
                "kind": "gpt",
                "vocab_size": 256,
                "block_size": 64,
                "n_layer": n_layer,
                "n_head": 4,
                "n_embd": n_embd,
                "dropout": 0.0,
                "tie_weights": True,
            },
            "optimizer": {
                "kind": "adamw",
                "lr": 3e-3,
                "beta1": 0.9,
                "beta2": 0.95,
                "weight_decay": 0.1,
                "grad_clip": 1.0,
                "schedule": "cosine",
                "warmup_steps": max(1, steps // 20),
                "decay_steps": steps,
                "min_lr": 3e-4,
            },
            "batch": {"batch_size": 8, "seq_len": 64},
            "rng": {"seed": 42, "schedule_seed": 7},
        }
    )


def held_out_loss(spec, params, ds, val, ops, batches: int) -> float:
    import torch

    from oracle import models

    model = models.build(spec.model)
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            idx = [val[(i * spec.batch.batch_size + j) % len(val)] for j in range(spec.batch.batch_size)]
            tok = torch.from_numpy(ds.batch(idx).astype("int64"))
            logits = model.forward(ops, params, tok[:, :-1])
            total += float(ops.cross_entropy(logits, tok[:, 1:]))
    return total / batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=64, help="width (4 heads)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a smoke run of the script: 6 steps")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.every, args.eval_batches = 6, 3, 2

    import torch
    from tqdm import tqdm

    from commitments.dataset import Dataset, prepare_default_corpus, train_validation_split
    from commitments.schedule import derive_schedule
    from oracle import profiles
    from oracle.step import init_state, step

    torch.set_num_threads(1)
    specs = {d: spec_of(d, args.steps, args.n_layer, args.n_embd) for d in ("float32", "bf16-mixed")}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.npy"
        prepare_default_corpus(corpus)
        ds = Dataset.open(corpus, specs["float32"].sample_len, vocab_size=256)
        train, val = train_validation_split(ds.num_samples)
        sched = derive_schedule(7, len(train), args.steps, 8)
        states = {d: init_state(s) for d, s in specs.items()}
        secs = {d: 0.0 for d in specs}
        curve, window = [], {d: [] for d in specs}
        for t in tqdm(range(1, args.steps + 1), desc="bf16 vs float32", unit="step", file=sys.stderr,
                      disable=args.json):
            batch = ds.batch([train[i] for i in sched.batch(t)])
            for d, s in specs.items():
                t0 = time.perf_counter()
                states[d], loss = step(states[d], batch, s, t)
                if t > 2:  # the first steps compile the kernels
                    secs[d] += time.perf_counter() - t0
                window[d].append(float(loss))
            if t % args.every == 0 or t == args.steps:
                a, b = window["float32"], window["bf16-mixed"]
                curve.append({"steps": f"{t - len(a) + 1}-{t}", "float32": sum(a) / len(a),
                              "bf16-mixed": sum(b) / len(b),
                              "max_step_diff": max(abs(x - y) for x, y in zip(a, b, strict=True))})
                window = {d: [] for d in specs}
        ev = {}
        for d, s in specs.items():
            for ev_dtype in sorted({d, "float32"}):
                ops = profiles.get("exact-v1", ev_dtype).ops
                ev[f"{d} model, {ev_dtype} eval"] = held_out_loss(s, states[d].params(), ds, val, ops,
                                                                  args.eval_batches)
    out = {
        "steps": args.steps,
        "n_layer": args.n_layer,
        "n_embd": args.n_embd,
        "train_loss": curve,
        "held_out_loss": ev,
        "step_time_ratio_bf16_over_f32": secs["bf16-mixed"] / max(secs["float32"], 1e-9),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{'steps':>10} {'float32':>9} {'bf16-mixed':>11} {'diff':>8} {'max |step diff|':>16}")
    for r in curve:
        print(f"{r['steps']:>10} {r['float32']:>9.4f} {r['bf16-mixed']:>11.4f} "
              f"{r['bf16-mixed'] - r['float32']:>+8.4f} {r['max_step_diff']:>16.4f}")
    for k, v in ev.items():
        print(f"held-out loss, {k}: {v:.4f}")
    print(f"step time ratio bf16-mixed / float32: {out['step_time_ratio_bf16_over_f32']:.2f}")


if __name__ == "__main__":
    main()
