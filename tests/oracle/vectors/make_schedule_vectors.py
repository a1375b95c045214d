"""Write schedule_v1.json: conformance vectors of exact-v1's learning-rate schedules, the
schedule's cosine and the bfloat16 rounding, from the reference definitions.

Binary64 values are 16 hex digits, float32 ones 8 (bit patterns). Regenerate only when the
specification changes (docs/exact-v1.md §8.1, §12), never to make a failing test pass:

    .venv/bin/python -m tests.oracle.vectors.make_schedule_vectors
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

from commitments.spec import OptimizerSpec
from oracle.exact.bf16 import round_bf16
from oracle.schedule import PI, cos64, lr_at

PATH = Path(__file__).with_name("schedule_v1.json")

# (optimizer fields, steps to evaluate): every branch, its boundaries and a long run
SCHEDULES = [
    ({"lr": 1e-3}, [1, 2, 1000]),
    ({"lr": 6e-4, "warmup_steps": 10}, [1, 9, 10, 11, 500]),
    ({"lr": 6e-4, "schedule": "cosine", "warmup_steps": 100, "decay_steps": 5000, "min_lr": 6e-5},
     [1, 50, 99, 100, 101, 102, 1000, 2550, 4999, 5000, 5001, 10**6]),
    ({"lr": 3e-4, "schedule": "cosine", "decay_steps": 7}, [1, 2, 3, 4, 5, 6, 7, 8]),
    ({"lr": 1e-2, "schedule": "linear", "warmup_steps": 3, "decay_steps": 13, "min_lr": 1e-3},
     [1, 2, 3, 4, 8, 12, 13, 14]),
    ({"lr": 0.1, "schedule": "linear", "decay_steps": 2**32 - 1}, [1, 2**31, 2**32 - 2, 2**32 - 1]),
]


def h64(v: float) -> str:
    return struct.pack(">d", v).hex()


def h32(t: torch.Tensor) -> list[str]:
    return [f"{v:08x}" for v in t.contiguous().view(torch.int32).numpy().astype(np.uint32).tolist()]


def cos_inputs() -> list[float]:
    xs = [0.0, -0.0, 1e-300, 5e-324, 0.5, 0.7853981633974483, 0.7853981633974484, 1.0,
          1.5707963267948966, 2.0, 2.356194490192345, 3.0, PI, -PI, 3.2, 6.283185307179586, 10.0]
    xs += [PI * (k / 64) for k in range(65)]
    xs += [float(v) for v in np.random.default_rng(15).uniform(0.0, PI, 32)]
    return xs


def bf16_inputs() -> torch.Tensor:
    pats = [0x00000000, 0x80000000, 0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x00018000,
            0x007FFFFF, 0x00800000, 0x3F800000, 0x3F807FFF, 0x3F808000, 0x3F808001, 0x3F818000,
            0x3F81FFFF, 0xBF808000, 0xBF818000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF,
            0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00000, 0xFFC00001, 0x7FFFFFFF, 0x7F80FFFF]
    rng = np.random.default_rng(16)
    pats += [int(v) for v in rng.integers(0, 2**32, 64, dtype=np.uint64)]
    return torch.from_numpy(np.array(pats, dtype=np.uint32).view(np.int32).copy()).view(torch.float32)


def build() -> dict:
    sched = []
    for fields, steps in SCHEDULES:
        opt = OptimizerSpec(**fields)
        sched.append({"optimizer": fields, "steps": steps, "lr": [h64(lr_at(opt, t)) for t in steps]})
    xs = cos_inputs()
    x = bf16_inputs()
    return {
        "cos64": {"x": [h64(v) for v in xs], "y": [h64(cos64(v)) for v in xs]},
        "schedules": sched,
        "round_bf16": {"x": h32(x), "y": h32(round_bf16(x))},
    }


if __name__ == "__main__":
    PATH.write_text(json.dumps(build(), indent=0) + "\n")
