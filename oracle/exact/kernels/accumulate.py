"""Compiled twins of oracle.exact.accumulate: the two-word fold (accumulate._fold_step over a
stack of values), the fold's float32 result (accumulate.Fold.result) and the float32 rounding of
a single word (quant.canon_nan of .to(float32)).
"""

from __future__ import annotations

import torch

from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, Int, njit, prange
from oracle.exact.kernels._numba import bits_as_f64 as _bits_as_f64
from oracle.exact.kernels._numba import f32 as _f32
from oracle.exact.kernels._numba import f64_bits as _f64_bits
from oracle.exact.kernels._wrap import as_np, kernel
from oracle.exact.quant import F32


@njit(parallel=True, **_opts)
def _fold_k(hi: Arr, lo: Arr, V: Arr) -> Int:
    nb, N = V.shape
    bad = 0
    for i in prange(N):
        h = hi[i]
        lw = lo[i]
        for b in range(nb):
            v = V[b, i]
            s = h + v
            bb = s - h
            e = (h - (s - bb)) + (v - bb)
            t = lw + e
            bb = t - lw
            f = (lw - (t - bb)) + (e - bb)
            h2 = s + t
            bb = h2 - s
            l2 = (s - (h2 - bb)) + (t - bb)
            if abs(f) <= 1.7976931348623157e308 and f != 0.0:
                bad += 1
            if abs(s) <= 1.7976931348623157e308:
                h = h2
                lw = l2 if abs(l2) <= 1.7976931348623157e308 else 0.0
            else:
                h = s
                lw = 0.0
        hi[i] = h
        lo[i] = lw
    return bad


@njit(parallel=True, **_opts)
def _fold_result_k(hi: Arr, lo: Arr, out: Arr) -> None:
    """accumulate.Fold.result for count > 1: TwoSum, round-to-odd, float32, canonical NaN."""
    for i in prange(hi.shape[0]):
        h = hi[i]
        lw = lo[i]
        s = h + lw
        bb = s - h
        err = (h - (s - bb)) + (lw - bb)
        if not abs(s) <= 1.7976931348623157e308:  # s is inf or NaN: torch.where(isfinite(s), s, hi)
            s = h
        if not abs(err) <= 1.7976931348623157e308:
            err = 0.0
        bits = _f64_bits(s)
        if err != 0.0 and (bits & 1) == 0 and abs(s) <= 1.7976931348623157e308:
            if (s > 0.0) == (err > 0.0):
                bits += 1
            else:
                bits -= 1
        out[i] = _f32(_bits_as_f64(bits))

@njit(parallel=True, **_opts)
def _to_f32_k(x: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        out[i] = _f32(x[i])


@kernel()
def fold_into(hi: torch.Tensor, lo: torch.Tensor, values: torch.Tensor) -> int:
    """In place: fold values[0], values[1], ... into (hi, lo) as accumulate._fold_step does;
    returns the number of inexact low-word additions."""
    return int(_fold_k(hi.numpy(), lo.numpy(), as_np(values)))


@kernel()
def fold_result(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """float32 of hi + lo rounded once, as accumulate.Fold.result computes it (count > 1)."""
    out = torch.empty(hi.shape, dtype=F32)
    _fold_result_k(as_np(hi).reshape(-1), as_np(lo).reshape(-1), out.view(-1).numpy())
    return out


@kernel()
def f64_to_f32(x: torch.Tensor) -> torch.Tensor:
    """canon_nan(x.to(float32)) in one pass."""
    out = torch.empty(x.shape, dtype=F32)
    _to_f32_k(as_np(x).reshape(-1), out.view(-1).numpy())
    return out
