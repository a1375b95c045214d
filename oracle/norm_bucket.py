"""The norm bucket: a coarse, exactly computed summary of a step's parameter update.

For cross-architecture specs (profile torch-native on hardware other than the declared class)
replays differ in the last bits, so verifiers compare a bucket instead of the leaf. Definition:

    D      = the concatenation, in canonical order, of every parameter's (new - old) flattened
             row-major (each difference one float32 subtraction)
    S      = sum_of_squares([D]) of exact-v1 (squares exact in float64, quantised chunk by chunk,
             summed exactly, rounded once to float32)
    S      = m * 2^e with m in [1, 2)           (read exactly from the float32)
    bucket = e * R + floor((m - 1) * R)         R = RESOLUTION buckets per octave of S

so the bucket is floor(R * L(S)) for L the piecewise-linear log2 (exact; monotone in S).
S = 0 gives ZERO_BUCKET and a non-finite S gives NONFINITE_BUCKET.

Resolution, from bench/norm_bucket.py (MEASURED figures below).
"""

from __future__ import annotations

import math
import sys
import types

import torch

RESOLUTION = 64
ZERO_BUCKET = -(2**31)
NONFINITE_BUCKET = 2**31 - 1


class NormBucketError(ValueError):
    """States that cannot be compared (different parameters or shapes)."""


def update_sq_norm(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> torch.Tensor:
    """S: the exact sum of squares of (new - old) over parameters in canonical order (float32)."""
    from oracle.exact import ops as exact_ops

    if list(old) != list(new):
        raise NormBucketError("the two states hold different parameters (or in a different order)")
    deltas = []
    for name in old:
        a, b = old[name], new[name]
        if a.shape != b.shape or a.dtype != torch.float32 or b.dtype != torch.float32:
            raise NormBucketError(f"parameter {name}: shapes {tuple(a.shape)} and {tuple(b.shape)} / "
                                  f"dtypes {a.dtype} and {b.dtype} cannot be compared (float32 needed)")
        deltas.append((b.detach() - a.detach().to(b.device)).reshape(-1))
    if not deltas:
        raise NormBucketError("the states hold no parameters")
    with torch.no_grad():
        # one flat vector: the exact sum's chunking then does not depend on tensor boundaries
        return exact_ops.sum_of_squares([torch.cat(deltas)]).to(torch.float32).reshape(())


def bucket_of(s: float, resolution: int = RESOLUTION) -> int:
    """The bucket of a squared norm S (see module doc); exact for any float32 S."""
    if not isinstance(resolution, int) or resolution < 1 or resolution & (resolution - 1):
        raise NormBucketError(f"resolution must be a power of two (keeps the bucket exact), got {resolution!r}")
    s = float(s)
    if not math.isfinite(s) or s < 0:
        return NONFINITE_BUCKET
    if s == 0.0:
        return ZERO_BUCKET
    m, e = math.frexp(s)  # s = m * 2^e, m in [0.5, 1)
    m, e = m * 2.0, e - 1  # exact: now m in [1, 2)
    return e * resolution + math.floor((m - 1.0) * resolution)


def norm_bucket(before, after, *, resolution: int = RESOLUTION) -> int:
    """The norm bucket of the step that took state `before` to state `after`."""
    s = update_sq_norm(before.params(), after.params())
    return bucket_of(s.item(), resolution)


class _CallableModule(types.ModuleType):
    """`oracle.norm_bucket` names both this module and its function; calling the module buckets."""

    def __call__(self, before, after, *, resolution: int = RESOLUTION) -> int:
        return norm_bucket(before, after, resolution=resolution)


sys.modules[__name__].__class__ = _CallableModule
