"""bfloat16 rounding of exact-v1: round-to-nearest-even from float32, in integer arithmetic.

The result is a float32 tensor whose values are bfloat16 numbers (the top 16 bits of the float32
pattern, the low 16 zero), so the exact ops that follow read it like any float32 tensor. Integer
adds, shifts and masks give the same bits on every device; the normative text is
docs/exact-v1.md §12.
"""

from __future__ import annotations

import torch

from oracle.exact.quant import F32, ExactError, canon_nan

_LOW = 0xFFFF  # the 16 bits a bfloat16 drops
_HALF = 0x7FFF  # half an ulp of bfloat16, less one: a tie then rounds by the kept lsb
_KEEP = 0xFFFF0000


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """RN-even of float32 x to bfloat16 (kept in float32): with u the bits of x as an unsigned
    32-bit integer, u' = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000. Finite values beyond
    bfloat16's range round to +-inf, subnormals round like any value, +-0 and +-inf are kept and
    every NaN becomes the canonical NaN 0x7FC00000."""
    if not isinstance(x, torch.Tensor) or x.dtype != F32:
        raise ExactError(
            f"round_bf16: expected a float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}"
        )
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = (u + _HALF + ((u >> 16) & 1)) & _KEEP
    r = torch.where(r >= 2**31, r - 2**32, r).to(torch.int32).view(F32)
    return canon_nan(torch.where(torch.isnan(x), x, r))
