"""Block quantisation and exact reductions: the integer core of exact-v1 (docs/exact-v1.md §1-2).

A block of values becomes integers q = round_half_even(x * 2^(s-e)) with e the frexp exponent of
the block's max |x|; sums of such integers stay below 2^53, so float64 adds them exactly in any
order, and the exact result is rounded once to float32 after an exact power-of-two rescale.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

F32 = torch.float32
F64 = torch.float64

# Lowest block exponent: keeps 2^(s - e) a normal float64 for any s <= 53. Only blocks whose
# largest magnitude is below 2^-961 (far below float32's range) are affected.
E_MIN = -960


class ExactError(ValueError):
    """Input an exact op cannot take (wrong dtype, shape, index range), with the reason."""


# --- bit budgets -----------------------------------------------------------------------------


def log2_ceil(n: int) -> int:
    return 0 if n <= 1 else (n - 1).bit_length()


def sum_bits(n: int) -> int:
    """Bits per value for an exact sum of n values: s + ceil(log2 n) <= 53."""
    return 53 - log2_ceil(n)


def dot_bits(n: int) -> int:
    """Bits per factor for an exact dot product of length n: 2s + ceil(log2 n) <= 53."""
    return (53 - log2_ceil(n)) // 2


def hilo_bits(n: int) -> int:
    """Bits per slice for the hi/lo product: each of its three GEMMs stays below 2^52, so the two
    cross terms add exactly."""
    return (52 - log2_ceil(n)) // 2


# --- exact powers of two, NaN, rounding helpers ----------------------------------------------


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float64, built from its bit pattern (exact; e must lie in [-1022, 1023])."""
    return torch.bitwise_left_shift(e.to(torch.int64) + 1023, 52).view(F64)


def canon_nan(y: torch.Tensor) -> torch.Tensor:
    """Replace every NaN by the canonical quiet NaN (0x7FC00000 in float32), whatever its payload."""
    return torch.where(torch.isnan(y), torch.full((), math.nan, dtype=y.dtype, device=y.device), y)


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's TwoSum: s = fl(a + b) and the exact error t = (a + b) - s (six float64 operations)."""
    s = a + b
    bb = s - a
    t = (a - (s - bb)) + (b - bb)
    return s, t


def round_odd(s: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
    """float64 round-to-odd of the exact value s + err, where s = fl(s + err).

    If err != 0 and s has an even last bit, step one unit toward err. Converting the result to
    float32 then rounds the exact value correctly (53 >= 24 + 2 bits), subnormals included."""
    bits = s.view(torch.int64)
    even = torch.bitwise_and(bits, 1) == 0
    fix = (err != 0) & even & torch.isfinite(s)
    up = (s > 0) == (err > 0)  # same sign: away from zero, which is +1 on the magnitude bits
    step = torch.where(up, torch.ones_like(bits), torch.full_like(bits, -1))
    return torch.where(fix, bits + step, bits).view(F64)


def to_f32_once(hi: torch.Tensor, lo: torch.Tensor | None = None) -> torch.Tensor:
    """float32 of the exact value hi + lo (float64 tensors), rounded once to nearest-even."""
    if lo is None:
        return hi.to(F32)
    s, err = two_sum(hi, lo)
    s = torch.where(torch.isfinite(s), s, hi + lo)
    return round_odd(s, torch.where(torch.isfinite(err), err, torch.zeros_like(err))).to(F32)


# --- quantisation ----------------------------------------------------------------------------


def block_exponent(maxabs: torch.Tensor) -> torch.Tensor:
    """e with max|x| < 2^e <= 2 max|x| (frexp's exponent), 0 for an all-zero block; int64.

    Read from the binary64 exponent field E (integer operations only, the same on every device):
    a normal M = 1.f 2^(E - 1023) has frexp exponent E - 1022; a subnormal (E = 0) lies below
    2^-1022, so its exponent is below E_MIN and the clamp gives E_MIN, as frexp's would."""
    bits = maxabs.to(F64).view(torch.int64)
    e = torch.bitwise_and(torch.bitwise_right_shift(bits, 52), 0x7FF) - 1022
    return torch.clamp(torch.where(maxabs == 0, torch.zeros_like(e), e), min=E_MIN)


def quantise(x: torch.Tensor, dim: int, s: int,
             maxabs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Integers q (float64) and block exponents e (int64, kept dim) with x ~ q * 2^(e - s).

    One block per line along `dim`: e = block_exponent(max |x|), q = round_half_even(x 2^(s - e)).
    `maxabs` is that line maximum (kept dim) when the caller has it already. x must be finite
    (callers take the non-finite path first)."""
    if maxabs is None:
        maxabs = torch.amax(torch.abs(x), dim=dim, keepdim=True)
    e = block_exponent(maxabs)
    q = x.to(F64, copy=True).mul_(pow2(s - e)).round_()  # exact scaling, then the one rounding
    return q, e


def quantise_hilo(x: torch.Tensor, dim: int, s: int, maxabs: torch.Tensor | None = None):
    """Two slices with one block exponent: x ~ (hi * 2^s + lo) * 2^(e - 2s), |lo| <= 2^(s-1).

    hi = round_half_even(x 2^(s - e)), lo = round_half_even((x 2^(s - e) - hi) 2^s); e and
    `maxabs` as in quantise."""
    if maxabs is None:
        maxabs = torch.amax(torch.abs(x), dim=dim, keepdim=True)
    e = block_exponent(maxabs)
    scaled = x.to(F64, copy=True).mul_(pow2(s - e))
    hi = torch.round(scaled)
    two_s = pow2(torch.full((), s, dtype=torch.int64, device=x.device))
    lo = scaled.sub_(hi).mul_(two_s).round_()  # scaled - hi is exact
    return hi, lo, e


def all_finite(*maxes: torch.Tensor) -> bool:
    """Whether every entry of every tensor is finite (one device sync per tensor)."""
    return all(bool(torch.isfinite(m).all()) for m in maxes)


def _nonfinite_class(x: torch.Tensor, dim: int | None, keepdim: bool):
    """(has NaN, has +inf, has -inf) per reduced line."""
    def anyr(m):
        return m.any() if dim is None else m.any(dim=dim, keepdim=keepdim)
    return anyr(torch.isnan(x)), anyr(x == math.inf), anyr(x == -math.inf)


def apply_nonfinite(val: torch.Tensor, has_nan, has_pinf, has_ninf) -> torch.Tensor:
    nan = torch.full((), math.nan, dtype=val.dtype, device=val.device)
    inf = torch.full((), math.inf, dtype=val.dtype, device=val.device)
    out = torch.where(has_pinf, inf, torch.where(has_ninf, -inf, val))
    return torch.where(has_nan | (has_pinf & has_ninf), nan, out)


# --- exact sums ------------------------------------------------------------------------------


def exact_sum64(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The exact sum of quantised x along `dim` (all elements if None), as a float64 tensor.

    The value is exact (an integer below 2^53 times a power of two). Non-finite lines: NaN if the
    line holds a NaN or both infinities, else the infinity it holds."""
    if dim is None:
        flat = x.reshape(-1)
        out = exact_sum64(flat, 0, False)
        return out.reshape([1] * x.dim()) if keepdim else out
    dim = dim % x.dim() if x.dim() else 0
    n = x.shape[dim] if x.dim() else 1
    if x.dim() == 0:
        x = x.reshape(1)
    s = sum_bits(n)
    maxabs = torch.amax(torch.abs(x), dim=dim, keepdim=True) if n else torch.zeros(
        [1 if i == dim else d for i, d in enumerate(x.shape)], dtype=x.dtype, device=x.device)
    if all_finite(maxabs):
        clean, cls = x, None
    else:
        clean = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))
        cls = _nonfinite_class(x, dim, True)
        maxabs = torch.amax(torch.abs(clean), dim=dim, keepdim=True)
    q, e = quantise(clean, dim, s, maxabs)
    val = torch.sum(q, dim=dim, keepdim=True) * pow2(e - s)
    if cls is not None:
        val = apply_nonfinite(val, *cls)
    return val if keepdim else val.squeeze(dim)


# --- exact rounding of big rationals (reference and cross-tensor sums) ------------------------

_F32_MAX = float.fromhex("0x1.fffffep127")


def round_scaled_int_to_f32(n: int, e: int) -> float:
    """float32 nearest (ties to even) to the exact value n * 2^e, returned as a Python float."""
    if n == 0:
        return 0.0
    neg = n < 0
    n = -n if neg else n
    top = n.bit_length() - 1 + e           # exponent of the leading bit
    ulp = max(top - 23, -149)              # float32 spacing there (subnormal spacing is 2^-149)
    shift = ulp - e
    if shift <= 0:
        m = n << -shift
    else:
        m, rem = divmod(n, 1 << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and m & 1):
            m += 1
    v = math.ldexp(m, ulp) if m.bit_length() + ulp < 1100 else math.inf
    if v > _F32_MAX:
        v = math.inf
    return -v if neg else v


def fraction_to_f32(x: Fraction) -> float:
    """float32 nearest to a rational (ties to even), as a Python float (reference helper)."""
    if x == 0:
        return 0.0
    num, den = abs(x.numerator), x.denominator
    # scale to an integer with at least 26 more bits than float32 keeps, plus a sticky bit
    k = max(0, den.bit_length() - num.bit_length() + 60)
    q, r = divmod(num << k, den)
    q = (q << 1) | (1 if r else 0)
    v = round_scaled_int_to_f32(q, -k - 1)
    return -v if x < 0 else v
