"""Learning-rate schedules of exact-v1: the rate of step t as a pure binary64 function of t.

Every operation below is one IEEE binary64 basic operation on Python floats (CPython evaluates
each on its own: no contraction into a fused multiply-add), and the cosine is exact-v1's cos64
(docs/exact-v1.md §3), never the platform's math.cos. The normative text is docs/exact-v1.md §8.1.
"""

from __future__ import annotations

import torch

from commitments.spec import OptimizerSpec
from oracle.exact.transcendental import cos_f64

PI = 3.141592653589793  # binary64 nearest to pi


class ScheduleError(ValueError):
    """A step the schedule has no rate for, with the reason."""


def cos64(x: float) -> float:
    """exact-v1's binary64 cosine (§3: Cody-Waite reduction by pi/2, fixed Taylor polynomials) of a
    Python float; the same algorithm as the elementwise op's, evaluated on one value."""
    return float(cos_f64(torch.tensor(x, dtype=torch.float64)))


def lr_at(opt: OptimizerSpec, t: int) -> float:
    """The binary64 learning rate of step t (1-based)."""
    if not isinstance(t, int) or isinstance(t, bool) or t < 1:
        raise ScheduleError(f"the schedule's step must be an int >= 1, got {t!r}")
    lr, w = opt.lr, opt.warmup_steps
    if w > 0 and t <= w:
        return lr * (float(t) / float(w))
    if opt.schedule == "constant":
        return lr
    if t >= opt.decay_steps:
        return opt.min_lr
    ratio = float(t - w) / float(opt.decay_steps - w)  # in (0, 1); both integers exact in binary64
    if opt.schedule == "cosine":
        coeff = 0.5 * (1.0 + cos64(PI * ratio))
    elif opt.schedule == "linear":
        coeff = 1.0 - ratio
    else:
        raise ScheduleError(f"unknown schedule {opt.schedule!r}")
    return opt.min_lr + coeff * (lr - opt.min_lr)
