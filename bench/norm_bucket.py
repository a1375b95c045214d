"""Measure the norm bucket: how often honest cross-configuration replays agree, how often a
substituted batch changes it, for each resolution R (buckets per octave of the squared norm).

A reference child walks a small torch-native GPT (with dropout) for N steps, saving the state
before every step and the update's squared norm S. Replay children under other thread counts and
dispatch levels (OMP_NUM_THREADS, ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS) replay each step
from the saved state on the honest batch, and on a substituted batch (another step's batch).

    .venv/bin/python bench/norm_bucket.py [--steps 240] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SPEC = {
    "profile": "torch-native",
    "hardware": {"device": "cpu"},
    "model": {"kind": "gpt", "vocab_size": 256, "block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64,
              "dropout": 0.1},
    "optimizer": {"kind": "adamw", "lr": 1e-3, "weight_decay": 0.1, "grad_clip": 1.0},
    "batch": {"batch_size": 8, "seq_len": 64},
    "rng": {"seed": 1337, "schedule_seed": 1337},
}
REPLAYS = {
    "1 thread, ATEN default": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"},
    "2 threads, avx2 (MKL AVX2)": {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2",
                                   "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
REFERENCE_ENV = {"OMP_NUM_THREADS": "2"}
RESOLUTIONS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576]


def _setup(steps: int, data: str):
    from commitments.dataset import Dataset, train_validation_split
    from commitments.schedule import derive_schedule
    from commitments.spec import Spec

    spec = Spec.from_dict(SPEC | {"steps": 2 * steps})
    ds = Dataset.open(data, spec.sample_len, vocab_size=256)
    train, _ = train_validation_split(ds.num_samples)
    return spec, ds, derive_schedule(spec.rng.schedule_seed, len(train), 2 * steps, spec.batch.batch_size)


def child_walk(steps: int, data: str, out: Path) -> None:
    from oracle.norm_bucket import update_sq_norm
    from oracle.step import init_state, step

    spec, ds, sched = _setup(steps, data)
    state = init_state(spec)
    s = []
    for t in range(1, steps + 1):
        state.to_safetensors(out / f"state_{t - 1}.safetensors")
        new, _ = step(state, ds.batch(sched.batch(t)), spec, t)
        s.append(float(update_sq_norm(state.params(), new.params())))
        state = new
    (out / "reference.json").write_text(json.dumps(s))


def child_replay(steps: int, data: str, out: Path, tag: str) -> None:
    from oracle.norm_bucket import update_sq_norm
    from oracle.state import TrainState
    from oracle.step import step

    spec, ds, sched = _setup(steps, data)
    honest, subst = [], []
    for t in range(1, steps + 1):
        before = TrainState.from_safetensors(out / f"state_{t - 1}.safetensors", spec)
        new, _ = step(before, ds.batch(sched.batch(t)), spec, t)
        honest.append(float(update_sq_norm(before.params(), new.params())))
        # a miner substituting data: the batch of a step it was never given
        new, _ = step(before, ds.batch(sched.batch(steps + t)), spec, t)
        subst.append(float(update_sq_norm(before.params(), new.params())))
    (out / f"replay_{tag}.json").write_text(json.dumps({"honest": honest, "substituted": subst}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=["walk", "replay"])
    ap.add_argument("--dir")
    ap.add_argument("--data")
    ap.add_argument("--tag")
    a = ap.parse_args()
    if a.child == "walk":
        return child_walk(a.steps, a.data, Path(a.dir))
    if a.child == "replay":
        return child_replay(a.steps, a.data, Path(a.dir), a.tag)

    from commitments.dataset import prepare_default_corpus
    from oracle.norm_bucket import bucket_of

    with tempfile.TemporaryDirectory(prefix="pot-norm-bucket-") as tmp:
        d = Path(tmp)
        data = str(d / "corpus.npy")
        prepare_default_corpus(data, max_bytes=1 << 20)

        def run(env_extra, *args):
            env = os.environ.copy() | env_extra
            subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--dir", tmp, "--data", data,
                            *args], check=True, env=env, cwd=ROOT)

        print(f"reference walk: {a.steps} steps, env {REFERENCE_ENV}", file=sys.stderr)
        run(REFERENCE_ENV, "--child", "walk")
        ref = json.loads((d / "reference.json").read_text())
        replays = {}
        for i, (name, env) in enumerate(REPLAYS.items()):
            print(f"replay: {name}", file=sys.stderr)
            run(env, "--child", "replay", "--tag", str(i))
            replays[name] = json.loads((d / f"replay_{i}.json").read_text())

    rows = []
    for r in RESOLUTIONS:
        row = {"R": r}
        for name, rep in replays.items():
            agree = sum(bucket_of(x, r) == bucket_of(y, r) for x, y in zip(ref, rep["honest"], strict=True))
            row[f"honest agree: {name}"] = agree / len(ref)
        subs = [s for rep in replays.values() for s in rep["substituted"]]
        refs = ref * len(replays)
        row["substituted differ"] = sum(
            bucket_of(x, r) != bucket_of(s, r) for x, s in zip(refs, subs, strict=True)
        ) / len(subs)
        rows.append(row)
    bits_equal = {name: sum(x == y for x, y in zip(ref, rep["honest"], strict=True)) / len(ref)
                  for name, rep in replays.items()}
    rel = {name: max(abs(x - y) / x for x, y in zip(ref, rep["honest"], strict=True) if x > 0)
           for name, rep in replays.items()}
    subrel = sorted(abs(x - s) / x for rep in replays.values()
                    for x, s in zip(ref, rep["substituted"], strict=True) if x > 0)
    print(f"steps: {a.steps}; S bit-identical to the reference: {bits_equal}")
    print(f"max relative |S - S_ref| honest: {rel}")
    print(f"substituted |S - S_ref|/S_ref: min {subrel[0]:.3g}, median {subrel[len(subrel) // 2]:.3g}")
    cols = list(rows[0])
    print(" | ".join(f"{c:>28}" if i else f"{c:>5}" for i, c in enumerate(cols)))
    for row in rows:
        print(" | ".join(f"{row[c]:>28.4f}" if i else f"{row[c]:>5}" for i, c in enumerate(cols)))
    if a.json:
        print(json.dumps({"steps": a.steps, "bits_equal": bits_equal, "max_rel_honest": rel,
                          "subst_rel_min": subrel[0], "subst_rel_median": subrel[len(subrel) // 2],
                          "table": rows}))


if __name__ == "__main__":
    main()
