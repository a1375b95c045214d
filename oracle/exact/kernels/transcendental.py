"""Compiled twins of oracle.exact.transcendental: exp, GELU (tanh and erf forms), sigmoid, SiLU and
their gradients, elementwise on float32 tensors, and the float64 scalars (exp64, log64, erfc64)
the row kernels of kernels.ops build on.

Each mirrors the eager definition operation for operation, so its results equal the eager ones
bit for bit (kernels.registry pairs them; tests/oracle/test_kernel_registry.py compares them).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from oracle.exact import transcendental as tx
from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, Float, Int, njit, prange
from oracle.exact.kernels._numba import f32 as _f32
from oracle.exact.kernels._numba import pow2 as _pow2
from oracle.exact.kernels._wrap import elementwise, kernel, like_f32

# The constants, as tuples numba folds into the code.
_EXP_C = tx.EXP_C
_EXPM1_C = tx.EXPM1_C
_LOG_C = tx.LOG_C
_ERF_C = tx.ERF_C
INV_LN2, LN2_HI, LN2_LO = tx.INV_LN2, tx.LN2_HI, tx.LN2_LO
EXP_LO, EXP_HI = tx.EXP_LO, tx.EXP_HI
SQRT_HALF = tx.SQRT_HALF
ERF_SPLIT, ERFC_ZERO, ERFC_CF_TERMS, INV_SQRT_PI = (
    tx.ERF_SPLIT,
    tx.ERFC_ZERO,
    tx.ERFC_CF_TERMS,
    tx.INV_SQRT_PI,
)
SQRT_2_OVER_PI, GELU_A, INV_SQRT2, INV_SQRT_2PI = tx.SQRT_2_OVER_PI, tx.GELU_A, tx.INV_SQRT2, tx.INV_SQRT_2PI


@njit(**_opts)
def _horner(c: tuple[Float, ...], y: Float) -> Float:
    p = c[len(c) - 1]
    for i in range(len(c) - 2, -1, -1):
        p = p * y + c[i]
    return p


@njit(**_opts)
def _scale_pow2(p: Float, k: Float) -> Float:
    ki = np.int64(k)
    k1 = ki >> 1  # floor division by 2, as torch.div(..., rounding_mode="floor")
    k2 = ki - k1
    return (p * _pow2(k1)) * _pow2(k2)


@njit(**_opts)
def exp64(x: Float) -> Float:
    if x != x:
        return x
    xc = min(max(x, EXP_LO), EXP_HI)
    k = np.rint(xc * INV_LN2)
    r = (xc - k * LN2_HI) - k * LN2_LO
    return _scale_pow2(_horner(_EXP_C, r), k)


@njit(**_opts)
def log64(x: Float) -> Float:
    if x != x or x < 0.0:
        return np.nan
    if x == 0.0:
        return -np.inf
    if x == np.inf:
        return np.inf
    m, e0 = math.frexp(x)
    e = float(e0)
    if m < SQRT_HALF:
        m = m * 2.0
        e = e - 1.0
    s = (m - 1.0) / (m + 1.0)
    w = s * s
    lm = (2.0 * s) * _horner(_LOG_C, w)
    return (e * LN2_LO + lm) + e * LN2_HI


@njit(**_opts)
def _erfc_large(a: Float) -> Float:
    a = min(max(a, ERF_SPLIT), ERFC_ZERO)
    f = a
    for n in range(ERFC_CF_TERMS, 0, -1):
        f = a + (n * 0.5) / f
    return exp64(-(a * a)) * INV_SQRT_PI / f


@njit(**_opts)
def erfc64(x: Float) -> Float:
    if x != x:
        return x
    a = abs(x)
    if a < ERF_SPLIT:
        es = a * _horner(_ERF_C, a * a)
        return 1.0 + es if x < 0 else 1.0 - es
    cl = 0.0 if a >= ERFC_ZERO else _erfc_large(a)
    return 2.0 - cl if x < 0 else cl


# --- elementwise ---------------------------------------------------------------------


@njit(parallel=True, **_opts)
def _exp_k(x: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        out[i] = _f32(exp64(np.float64(x[i])))


@njit(**_opts)
def _gelu_tanh_h(x: Float) -> tuple[Float, Float]:
    x2 = x * x
    u = SQRT_2_OVER_PI * (x + GELU_A * (x2 * x))
    return 2.0 / (1.0 + exp64(-2.0 * u)), x2


@njit(**_opts)
def _inf_slope(v: Float, d: Float) -> Float:
    if v == np.inf:
        return 1.0
    if v == -np.inf:
        return 0.0
    return d


@njit(parallel=True, **_opts)
def _gelu_tanh_k(x: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        v = np.float64(x[i])
        h, _ = _gelu_tanh_h(v)
        out[i] = np.float32(-0.0) if v == -np.inf else _f32((0.5 * v) * h)


@njit(parallel=True, **_opts)
def _gelu_tanh_grad_k(x: Arr, g: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        v = np.float64(x[i])
        h, x2 = _gelu_tanh_h(v)
        up = SQRT_2_OVER_PI * (1.0 + (3.0 * GELU_A) * x2)
        d = 0.5 * h + ((0.5 * v) * (h * (2.0 - h))) * up
        out[i] = _f32(np.float64(g[i]) * _inf_slope(v, d))


# erfc64 of a whole block, with the same operations per element as erfc64, in passes that
# vectorise: erfc64's two series (34 Horner steps; 72 continued-fraction terms, one division
# each) are dependency chains, so one element at a time they run at the latency of their
# operations; each pass below takes one step of a series for every element of the block.
_ERF_BLOCK = 512
_ERF_CA = np.array(tx.ERF_C)


@njit(**_opts)
def _erfc64_block(u: Arr, out: Arr, w: Arr, idx: Arr) -> None:
    """out[j] = erfc64(u[j]) for the float64 vector u (at most _ERF_BLOCK long); w: float64
    scratch [5, _ERF_BLOCK], idx: int64 scratch [_ERF_BLOCK]."""
    m = u.shape[0]
    sa, y, p, aa, f = w[0], w[1], w[2], w[3], w[4]
    nc = _ERF_CA.shape[0]
    for j in range(m):  # the series of |u| < ERF_SPLIT, for every element (unused ones too)
        a = abs(u[j])
        a = a if a < ERF_SPLIT else 0.0
        sa[j] = a
        y[j] = a * a
        p[j] = _ERF_CA[nc - 1]
    for i in range(nc - 2, -1, -1):  # _horner, one step at a time
        c = _ERF_CA[i]
        for j in range(m):
            p[j] = p[j] * y[j] + c
    n = 0
    for j in range(m):
        x = u[j]
        a = abs(x)
        if x != x:
            out[j] = x
        elif a < ERF_SPLIT:
            es = sa[j] * p[j]
            out[j] = 1.0 + es if x < 0 else 1.0 - es
        elif a >= ERFC_ZERO:
            out[j] = 2.0 if x < 0 else 0.0  # cl = 0
        else:  # the continued fraction (_erfc_large: a already within its clamp)
            idx[n] = j
            aa[n] = a
            f[n] = a
            n += 1
    for k in range(ERFC_CF_TERMS, 0, -1):
        c = k * 0.5
        for t in range(n):
            f[t] = aa[t] + c / f[t]
    for t in range(n):
        a = aa[t]
        cl = exp64(-(a * a)) * INV_SQRT_PI / f[t]
        j = idx[t]
        out[j] = 2.0 - cl if u[j] < 0 else cl


@njit(**_opts)
def _gelu_erfc_block(x: Arr, b: Int) -> tuple[Int, Int, Arr]:
    """Block b of an erf GELU kernel: (lo, hi, e) with e[j] = erfc64(-(f64(x[lo + j])
    INV_SQRT2)) for j < hi - lo."""
    lo = b * _ERF_BLOCK
    hi = min(x.shape[0], lo + _ERF_BLOCK)
    u, e = np.empty(hi - lo), np.empty(_ERF_BLOCK)
    for j in range(hi - lo):
        u[j] = -(np.float64(x[lo + j]) * INV_SQRT2)
    _erfc64_block(u, e, np.empty((5, _ERF_BLOCK)), np.empty(_ERF_BLOCK, np.int64))
    return lo, hi, e


@njit(parallel=True, **_opts)
def _gelu_erf_k(x: Arr, out: Arr) -> None:
    for b in prange((x.shape[0] + _ERF_BLOCK - 1) // _ERF_BLOCK):
        lo, hi, e = _gelu_erfc_block(x, b)
        for j in range(hi - lo):
            v = np.float64(x[lo + j])
            out[lo + j] = np.float32(-0.0) if v == -np.inf else _f32((0.5 * v) * e[j])


@njit(parallel=True, **_opts)
def _gelu_erf_grad_k(x: Arr, g: Arr, out: Arr) -> None:
    for b in prange((x.shape[0] + _ERF_BLOCK - 1) // _ERF_BLOCK):
        lo, hi, e = _gelu_erfc_block(x, b)
        for j in range(hi - lo):
            v = np.float64(x[lo + j])
            d = 0.5 * e[j] + (v * exp64(-0.5 * (v * v))) * INV_SQRT_2PI
            out[lo + j] = _f32(np.float64(g[lo + j]) * _inf_slope(v, d))


# --- sigmoid and SiLU (mirror transcendental._sigmoid_parts, silu_f64, silu_grad_f64) ---


@njit(**_opts)
def _sigmoid_parts64(v: Float) -> tuple[Float, Float]:
    """(sigmoid v, 1 - sigmoid v) as transcendental._sigmoid_parts: t = exp64(-|v|),
    1/(1+t) and t/(1+t), swapped for v < 0 (NaN: both NaN)."""
    t = exp64(-abs(v))
    d = 1.0 + t
    big = 1.0 / d
    small = t / d
    if v >= 0.0:
        return big, small
    return small, big


@njit(parallel=True, **_opts)
def _sigmoid_k(x: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        s, _ = _sigmoid_parts64(np.float64(x[i]))
        out[i] = _f32(s)


@njit(parallel=True, **_opts)
def _sigmoid_grad_k(x: Arr, g: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        s, u = _sigmoid_parts64(np.float64(x[i]))
        out[i] = _f32(np.float64(g[i]) * (s * u))


@njit(parallel=True, **_opts)
def _silu_k(x: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        v = np.float64(x[i])
        s, _ = _sigmoid_parts64(v)
        out[i] = np.float32(-0.0) if v == -np.inf else _f32(v * s)


@njit(parallel=True, **_opts)
def _silu_grad_k(x: Arr, g: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        v = np.float64(x[i])
        s, u = _sigmoid_parts64(v)
        out[i] = _f32(np.float64(g[i]) * _inf_slope(v, s * (1.0 + v * u)))


@kernel(empty=like_f32)
def exp(x: torch.Tensor) -> torch.Tensor:
    """transcendental.exp32 of a float32 tensor."""
    return elementwise(_exp_k, x)


@kernel(empty=like_f32)
def gelu(x: torch.Tensor, form: str) -> torch.Tensor:
    """transcendental.gelu32(x, form) of a float32 tensor."""
    return elementwise(_gelu_tanh_k if form == "tanh" else _gelu_erf_k, x)


@kernel(empty=like_f32)
def gelu_grad(x: torch.Tensor, g: torch.Tensor, form: str) -> torch.Tensor:
    """transcendental.gelu_grad32(x, g, form)."""
    return elementwise(_gelu_tanh_grad_k if form == "tanh" else _gelu_erf_grad_k, x, g)


@kernel(empty=like_f32)
def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """transcendental.sigmoid32 of a float32 tensor."""
    return elementwise(_sigmoid_k, x)


@kernel(empty=like_f32)
def sigmoid_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """transcendental.sigmoid_grad32: RN32(f64(g) (s u)) from x."""
    return elementwise(_sigmoid_grad_k, x, g)


@kernel(empty=like_f32)
def silu(x: torch.Tensor) -> torch.Tensor:
    """transcendental.silu32 of a float32 tensor (silu(-inf) = -0)."""
    return elementwise(_silu_k, x)


@kernel(empty=like_f32)
def silu_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """transcendental.silu_grad32: RN32(f64(g) silu'(x)), the limits 1 at +inf and 0 at -inf."""
    return elementwise(_silu_grad_k, x, g)
