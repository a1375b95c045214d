"""init_state of a spec (default GPT-2 small): the compiled RNG pass against the eager definition.

Both build the same initial state side by side in one process: "compiled" is oracle.step.init_state
as it runs (one numba pass writes the normals; the zero moments are calloc'd), "eager" is the
eager definition rng.normal_eager with torch.zeros moments, which is how the state was built
before. Prints each one's wall and CPU seconds, the ratio, and both digests, which must be
equal; `--json` prints a JSON summary last. Exits 1 if the digests differ.

    python bench/init.py                          # GPT-2 small: the eager side takes minutes
    python bench/init.py --spec examples/specs/gpt-demo.toml
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent


def eager_init_state(spec):
    """The initial state by the eager definition, parameter by parameter with a progress bar."""
    import torch
    from tqdm import tqdm

    from oracle import models, optim, rng
    from oracle.state import TrainState

    specs = models.build(spec.model, matmul=spec.exact.matmul).param_specs()
    params = {}
    for p in tqdm(specs, desc="eager init", unit="tensor", leave=False):
        if p.init == "normal":
            params[p.name] = rng.normal_eager(
                spec.rng.seed, models.INIT_STEP, "init/" + p.name, p.shape, std=p.std
            )
        elif p.init == "zeros":
            params[p.name] = torch.zeros(p.shape, dtype=torch.float32)
        else:
            params[p.name] = torch.ones(p.shape, dtype=torch.float32)
    moments = {
        m: {n: torch.zeros_like(t) for n, t in params.items()} for m in optim.moment_names(spec.optimizer)
    }
    return TrainState.assemble(spec, params, moments, step=0, seed=spec.rng.seed)


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples/specs/gpt2-small.toml"), help="a spec TOML")
    ap.add_argument("--threads", type=int, default=0, help="torch/numba threads (0: torch's default)")
    ap.add_argument("--json", action="store_true", help="print a JSON summary last")
    args = ap.parse_args()

    import torch

    from commitments.spec import Spec
    from oracle.exact import kernels
    from oracle.step import init_state

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = Spec.from_toml(args.spec)
    init_state(Spec.from_toml(ROOT / "examples/specs/gpt-tiny.toml"))  # load the compiled code first
    fast, fast_wall, fast_cpu = timed(lambda: init_state(spec))
    n = sum(t.numel() for t in fast.params().values())
    fast_digest = fast.digest().hex()
    del fast
    print(f"spec {args.spec}: {n / 1e6:.1f} M parameters, {torch.get_num_threads()} thread(s), "
          f"kernels {'on' if kernels.enabled() else 'off'}", flush=True)
    print(f"compiled  wall {fast_wall:8.2f} s  cpu {fast_cpu:8.2f} s  digest {fast_digest}", flush=True)
    slow, slow_wall, slow_cpu = timed(lambda: eager_init_state(spec))
    slow_digest = slow.digest().hex()
    del slow
    print(f"eager     wall {slow_wall:8.2f} s  cpu {slow_cpu:8.2f} s  digest {slow_digest}")
    same = fast_digest == slow_digest
    print(f"ratio eager/compiled: wall {slow_wall / fast_wall:.1f}x, cpu {slow_cpu / fast_cpu:.1f}x; "
          f"digests {'equal' if same else 'DIFFER'}")
    if args.json:
        print(
            json.dumps(
                {
                    "spec": args.spec,
                    "params": n,
                    "threads": torch.get_num_threads(),
                    "compiled_wall_s": round(fast_wall, 3),
                    "compiled_cpu_s": round(fast_cpu, 3),
                    "eager_wall_s": round(slow_wall, 3),
                    "eager_cpu_s": round(slow_cpu, 3),
                    "ratio_wall": round(slow_wall / fast_wall, 2),
                    "ratio_cpu": round(slow_cpu / fast_cpu, 2),
                    "digest": fast_digest,
                    "digests_equal": same,
                }
            )
        )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
