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

Resolution R = 2^14, chosen from bench/norm_bucket.py (240 steps of a 2-layer, 64-wide GPT with
dropout 0.1, AdamW, batch 8 x 64, profile torch-native; reference walk at 2 threads and the host's
best dispatch level (avx512); each step replayed from the reference's saved state under
(1 thread, ATEN_CPU_CAPABILITY=default) and (2 threads, avx2, MKL_ENABLE_INSTRUCTIONS=AVX2), on
the honest batch and on a substituted one, the batch of another step):

    honest S bit-identical to the reference: 85.0% and 87.5% of steps;
    largest honest relative difference of S: 1.2e-7 and 1.1e-7;
    substituted batch, relative change of S: min 1.65e-5, median 4.2% (Adam's update norm
    depends little on the data, so the bucket must be fine);

        R        honest agree (1 thr/default, 2 thr/avx2)   substituted differ
        1        100%    100%                               16.3%
        64       100%    100%                               90.8%
        1024     100%    100%                               99.6%
        16384    100%    100%                               99.6%
        65536    100%    100%                               100%
        262144   99.6%   100%                               100%
        1048576  99.2%   99.6%                              100%

At R = 2^14 a bucket spans a relative change of S between 3e-5 and 6e-5, 250 to 500 times the
largest honest difference measured (so even at that difference an honest replay crosses a bucket
boundary in under 0.4% of steps),
while a substituted batch moved the bucket in 239 of 240 steps. 2^16 separated these samples
perfectly too, but with a 4x thinner honest margin; a false accusation costs more than one
undetected substitution among many challenges.
"""

from __future__ import annotations

import math

import torch

RESOLUTION = 2**14
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
        raise NormBucketError(
            f"resolution must be a power of two (keeps the bucket exact), got {resolution!r}"
        )
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

