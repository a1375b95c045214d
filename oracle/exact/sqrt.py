"""Correctly rounded square roots of exact-v1 from IEEE basic operations (docs/exact-v1.md §3.1).

Stock torch.sqrt is not correctly rounded on every build (x86 builds route it through MKL's
vector library), so exact paths use these. The eager form runs on every device; the CPU kernels
(oracle.exact.kernels) use the IEEE hardware instruction and equal it bit for bit. This module
imports nothing from the rest of oracle.exact.
"""

from __future__ import annotations

import math

import torch

F32 = torch.float32
F64 = torch.float64
I64 = torch.int64

# First guess for sqrt on [1, 4): the line with the smallest largest relative error (2.99%).
# Four Heron steps take it to within 0.76 ulp of sqrt(x); one correction step then gives the
# correctly rounded value (see _correct).
GUESS_A, GUESS_B = 0.686, 0.343
HERON_STEPS = 4
SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's splitting constant for binary64
TWO54 = 2.0**54
MIN_NORMAL = 2.0**-1022
MANT = (1 << 52) - 1
ONE_EXP = 1 << 52  # one unit of the binary64 exponent field


def _split(a: torch.Tensor):
    """Veltkamp: a = hi + lo exactly, each half with at most 26 significant bits."""
    g = a * SPLIT
    hi = g - (g - a)
    return hi, a - hi


def _two_prod(a: torch.Tensor, ah, al, b: torch.Tensor):
    """Dekker's product without FMA: a * b = p + e exactly (no overflow or underflow here)."""
    bh, bl = _split(b)
    p = a * b
    e = al * bl - (((p - ah * bh) - al * bh) - ah * bl)
    return p, e


def _exceeds(x: torch.Tensor, a: torch.Tensor, ah, al, b: torch.Tensor) -> torch.Tensor:
    """x > a * b, decided exactly. a * b = p + e (Dekker); x - p is exact (Sterbenz: p is within
    a factor 2 of x), and rounding x - p - e keeps its sign."""
    p, e = _two_prod(a, ah, al, b)
    return ((x - p) - e) > 0


def _correct(xr: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The correctly rounded sqrt(xr), xr in [1, 4), from y within 1 ulp of it.

    With y- < y < y+ consecutive binary64 values, sqrt(xr) rounds to y iff y*y- < xr <= y*y+
    (xr and the products are multiples of ulp(y)^2 and the midpoints' squares differ from the
    products by ulp^2/4, so strict and non-strict comparisons fall on the same side; no ties)."""
    bits = y.view(I64)
    up, down = (bits + 1).view(F64), (bits - 1).view(F64)
    yh, yl = _split(y)
    go_up = _exceeds(xr, y, yh, yl, up)
    go_down = ~_exceeds(xr, y, yh, yl, down)
    return torch.where(go_up, up, torch.where(go_down, down, y))


def sqrt64(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded binary64 square root of a float64 tensor.

    sqrt(+-0) = +-0, sqrt(+inf) = +inf, negative or NaN -> the canonical NaN. x = xr * 4^k with
    xr in [1, 4) (subnormals first scaled by 2^54); sqrt(x) = sqrt(xr) * 2^k exactly."""
    if not isinstance(x, torch.Tensor) or x.dtype != F64:
        raise ValueError(f"sqrt64 takes a float64 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    ok = (x > 0) & (x < math.inf)
    one = torch.ones((), dtype=F64, device=x.device)
    sub = ok & (x < MIN_NORMAL)
    xs = torch.where(ok, torch.where(sub, x * TWO54, x), one)
    bits = xs.view(I64)
    e = torch.bitwise_and(torch.bitwise_right_shift(bits, 52), 0x7FF) - 1023
    k = torch.bitwise_right_shift(e + 1024, 1) - 512  # floor(e / 2)
    xr = (torch.bitwise_and(bits, MANT) + (e - 2 * k + 1023) * ONE_EXP).view(F64)
    y = GUESS_A + GUESS_B * xr
    for _ in range(HERON_STEPS):
        y = (y + xr / y) * 0.5
    y = _correct(xr, y)
    k = k - torch.where(sub, torch.full_like(k, 27), torch.zeros_like(k))
    r = (y.view(I64) + k * ONE_EXP).view(F64)  # y * 2^k: the result is a normal number
    r = torch.where(
        ok, r, torch.where(x == 0, x, torch.where(x == math.inf, x, torch.full_like(x, math.nan)))
    )
    return r


def sqrt32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 square root: RN32 of the correctly rounded binary64 root of the
    (exact) widened input; the double rounding is innocuous (docs/exact-v1.md §3.1)."""
    if not isinstance(x, torch.Tensor) or x.dtype != F32:
        raise ValueError(f"sqrt32 takes a float32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    r = sqrt64(x.to(F64)).to(F32)
    # the canonical NaN again: CUDA's conversion of a NaN gives 0x7FFFFFFF, not 0x7FC00000
    return torch.where(torch.isnan(r), torch.full_like(r, math.nan), r)
