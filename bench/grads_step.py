"""CPU time and peak RSS of one exact-v1 GPT-2-small step (batch 1 x 256) and of its gradient
computation alone (`micro_batch_grads`: forward, backward, the accumulator's folds and rounding).

Each measurement runs in a fresh child process: it loads the initial state (made once, under
--state), takes one untimed step (numba cache, allocator warm-up), then times the next step and,
separately, the gradients of that step's state. Peak RSS is the kernel's VmHWM mark, reset after
loading the state (Linux), so it is that of the step alone. Prints one JSON line per child.

    .venv/bin/python bench/grads_step.py [--rounds 2] [--threads 1] [--state /tmp/gpt2s.safetensors]

Compare two trees by running each tree's copy of this script on the same state file,
alternating (interleaved medians); the script itself never decides pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _spec():
    from commitments.spec import Spec

    d = Spec.from_toml(ROOT / "examples" / "specs" / "gpt2-small.toml").canonical()
    d["batch"] = {"batch_size": 1, "seq_len": 256}
    return Spec.from_dict(d)


def _peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(state_path: str) -> None:
    import torch

    from oracle import profiles
    from oracle.state import TrainState
    from oracle.step import step

    spec = _spec()
    state = TrainState.from_safetensors(state_path, spec)
    g = torch.Generator().manual_seed(0)  # benchmark data only
    batch = torch.randint(0, spec.model.vocab_size, (1, spec.sample_len), generator=g)
    state, _ = step(state, batch, spec, 1)  # warm-up
    _peak_rss_reset()
    c0 = time.process_time()
    state2, loss = step(state, batch, spec, 2)
    step_cpu, step_rss = time.process_time() - c0, _peak_rss_mib()
    digest = state2.digest().hex()
    del state2
    # the gradients of step 2 alone, as the step computes them
    from oracle import models

    prof = profiles.get(spec.profile, spec.dtype)
    model = models.build(spec.model, matmul=spec.exact.matmul)
    tokens = batch.to(torch.int64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    params = state.params()
    _peak_rss_reset()
    c0 = time.process_time()
    _, grads = prof.grads(model, params, inputs, targets, lambda row: None, 1)
    grads_cpu, grads_rss = time.process_time() - c0, _peak_rss_mib()
    print(json.dumps({"step_cpu_s": step_cpu, "step_peak_rss_mib": step_rss, "grads_cpu_s": grads_cpu,
                      "grads_peak_rss_mib": grads_rss, "digest": digest, "loss": float(loss),
                      "threads": torch.get_num_threads()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="child processes (one measurement each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--state", default="/tmp/gpt2s_state.safetensors",
                    help="initial state (made here if missing)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.state)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads),
               NUMBA_NUM_THREADS=str(a.threads), PYTHONPATH=str(ROOT))
    if not Path(a.state).exists():
        from oracle.step import init_state

        init_state(_spec()).to_safetensors(a.state)
    rows = []
    for _ in range(a.rounds):
        out = subprocess.run([sys.executable, __file__, "--child", "--state", a.state], env=env,
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    keys = ("step_cpu_s", "step_peak_rss_mib", "grads_cpu_s", "grads_peak_rss_mib")
    print(json.dumps({"median": {k: statistics.median(r[k] for r in rows) for k in keys},
                      "digests": sorted({r["digest"] for r in rows})}))


if __name__ == "__main__":
    main()
