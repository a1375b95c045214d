"""Compiled twins of oracle.exact.ops' row functions: the softmax family and cross-entropy rows
(ops.softmax_rows_eager and friends), layer norm's rows forward and backward (ops._LayerNorm),
the per-sequence sums along the token axis (ops._seq_sums) and the chunk terms of
ops.sum_of_squares.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, Float, Int, njit, prange
from oracle.exact.kernels._numba import bits_as_f32 as _bits_as_f32
from oracle.exact.kernels._numba import f32 as _f32
from oracle.exact.kernels._numba import pow2 as _pow2
from oracle.exact.kernels._wrap import as_np, kernel, like_f32, rows2
from oracle.exact.kernels.quant import ABS32 as _ABS32
from oracle.exact.kernels.quant import INF32_BITS as _INF32_BITS
from oracle.exact.kernels.quant import exact_sum as _exact_sum
from oracle.exact.kernels.transcendental import exp64, log64
from oracle.exact.quant import E_MIN, F32, F64, sum_bits


@njit(**_opts)
def _row_max(x: Arr) -> np.float32:
    m = -np.inf
    for j in range(x.shape[0]):
        v = x[j]
        if v != v:
            return np.float32(np.nan)
        if v > m:
            m = v
    return np.float32(m)

@njit(parallel=True, **_opts)
def _softmax_k(x: Arr, out: Arr, s: Int) -> None:
    R, n = x.shape
    for r in prange(R):
        m = np.float64(_row_max(x[r]))
        e = np.empty(n)
        for j in range(n):
            e[j] = exp64(np.float64(x[r, j]) - m)
        S = _exact_sum(e, s)
        for j in range(n):
            out[r, j] = _f32(e[j] / S)

@njit(parallel=True, **_opts)
def _log_softmax_k(x: Arr, out: Arr, s: Int) -> None:
    R, n = x.shape
    for r in prange(R):
        m = np.float64(_row_max(x[r]))
        z = np.empty(n)
        e = np.empty(n)
        for j in range(n):
            z[j] = np.float64(x[r, j]) - m
            e[j] = exp64(z[j])
        ls = log64(_exact_sum(e, s))
        for j in range(n):
            out[r, j] = _f32(z[j] - ls)

@njit(parallel=True, **_opts)
def _softmax_bwd_k(p: Arr, g: Arr, out: Arr, s: Int) -> None:
    R, n = p.shape
    for r in prange(R):
        prod = np.empty(n)
        for j in range(n):
            prod[j] = np.float64(g[r, j]) * np.float64(p[r, j])
        d = _exact_sum(prod, s)
        for j in range(n):
            out[r, j] = _f32(np.float64(p[r, j]) * (np.float64(g[r, j]) - d))

@njit(parallel=True, **_opts)
def _log_softmax_bwd_k(y: Arr, g: Arr, out: Arr, s: Int) -> None:
    R, n = y.shape
    for r in prange(R):
        gg = np.empty(n)
        for j in range(n):
            gg[j] = np.float64(g[r, j])
        gs = _exact_sum(gg, s)
        for j in range(n):
            out[r, j] = _f32(gg[j] - exp64(np.float64(y[r, j])) * gs)

@njit(parallel=True, **_opts)
def _ce_k(x: Arr, t: Arr, loss: Arr, mo: Arr, so: Arr, s: Int) -> None:
    R, n = x.shape
    for r in prange(R):
        m32 = _row_max(x[r])
        m = np.float64(m32)
        e = np.empty(n)
        for j in range(n):
            e[j] = exp64(np.float64(x[r, j]) - m)
        S = _exact_sum(e, s)
        zt = np.float64(x[r, t[r]]) - m
        loss[r] = _f32(log64(S) - zt)
        mo[r] = m32
        so[r] = S

@njit(parallel=True, **_opts)
def _ce_bwd_k(x: Arr, t: Arr, mi: Arr, si: Arr, g: Float, total: Float, out: Arr) -> None:
    R, n = x.shape
    for r in prange(R):
        m = np.float64(mi[r])
        S = si[r]
        for j in range(n):
            p = exp64(np.float64(x[r, j]) - m) / S
            oh = 1.0 if j == t[r] else 0.0
            out[r, j] = _f32(((p - oh) * g) / total)


# --- layer norm rows and per-sequence column sums (mirror ops._LayerNorm, exact_sum64) -----

@njit(parallel=True, **_opts)
def _ln_fwd_k(x: Arr, w: Arr, b: Arr, has_w: bool, has_b: bool, eps: Float, s: Int, out: Arr, mu_o: Arr,
              rstd_o: Arr) -> None:
    R, C = x.shape
    n = np.float64(C)
    for r in prange(R):
        buf = np.empty(C)
        for j in range(C):
            buf[j] = np.float64(x[r, j])
        mu = _exact_sum(buf, s) / n
        sq = np.empty(C)
        for j in range(C):
            d = buf[j] - mu
            sq[j] = d * d
        var = _exact_sum(sq, s) / n
        rstd = 1.0 / math.sqrt(var + eps)
        for j in range(C):
            y = (buf[j] - mu) * rstd
            if has_w:
                y = y * w[j]
            if has_b:
                y = y + b[j]
            out[r, j] = _f32(y)
        mu_o[r] = mu
        rstd_o[r] = rstd

@njit(parallel=True, **_opts)
def _ln_bwd_k(x: Arr, g: Arr, w: Arr, has_w: bool, mu_i: Arr, rstd_i: Arr, s: Int, gx: Arr,
              prod: Arr) -> None:
    R, C = x.shape
    n = np.float64(C)
    for r in prange(R):
        mu = mu_i[r]
        rstd = rstd_i[r]
        gh = np.empty(C)
        xh = np.empty(C)
        gx2 = np.empty(C)
        for j in range(C):
            xh[j] = (np.float64(x[r, j]) - mu) * rstd
            g64 = np.float64(g[r, j])
            gh[j] = g64 * w[j] if has_w else g64
            prod[r, j] = g64 * xh[j]
            gx2[j] = gh[j] * xh[j]
        m1 = _exact_sum(gh, s) / n
        m2 = _exact_sum(gx2, s) / n
        for j in range(C):
            gx[r, j] = _f32(rstd * ((gh[j] - m1) - xh[j] * m2))

@njit(parallel=True, **_opts)
def _colsum_k(v: Arr, s: Int, out: Arr) -> None:
    B, T, C = v.shape
    for bc in prange(B * C):
        b = bc // C
        c = bc - b * C
        buf = np.empty(T)
        for t in range(T):
            buf[t] = v[b, t, c]
        out[b, c] = _exact_sum(buf, s)


@njit(parallel=True, **_opts)
def _sos_chunks_k(x: Arr, xb: Arr, chunk: Int, s: Int, n_out: Arr, e_out: Arr) -> tuple[Int, Int]:
    """Chunk c of x (float32; xb its int32 bit view): n_out[c] = the sum of
    round_half_even(f64(x)^2 * 2^(s - e)) with e the block exponent of the chunk's largest
    square, e_out[c] = e - s. Returns (NaN count, infinity count); a chunk holding either is
    not written."""
    N = x.shape[0]
    nnan = 0
    ninf = 0
    for c in prange(n_out.shape[0]):
        lo = c * chunk
        hi = min(N, lo + chunk)
        # the chunk as its own views: loops over range(len) index from 0, so that LLVM
        # vectorises them (over range(lo, hi) the same loops ran 10 times slower)
        xc = x[lo:hi]
        bc = xb[lo:hi]
        # the largest magnitude by its bits (sign cleared, the order of |x|; inf and NaN above
        # every finite value): an integer reduction
        mb = np.int32(0)
        for j in range(bc.shape[0]):
            b = bc[j] & _ABS32
            mb = b if b > mb else mb
        if mb >= _INF32_BITS:
            for j in range(bc.shape[0]):
                b = bc[j] & _ABS32
                if b > np.int32(0x7F800000):
                    nnan += 1
                elif b == np.int32(0x7F800000):
                    ninf += 1
            continue
        ma = np.float64(_bits_as_f32(mb))
        mx = ma * ma  # the largest square (squares of float32 are exact in binary64)
        if mx == 0.0:
            ex = 0
        else:
            _, ex = math.frexp(mx)
        if ex < E_MIN:
            ex = E_MIN
        up = _pow2(np.int64(s - ex))
        # integers q <= 2^s, at most 2^(53 - s) of them: the int64 sum is exact in any order
        total = np.int64(0)
        for j in range(xc.shape[0]):
            a = np.float64(xc[j])
            total += np.int64(np.rint((a * a) * up))
        n_out[c] = total
        e_out[c] = ex - s
    return nnan, ninf


@kernel(empty=like_f32)
def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """ops.softmax_rows_eager: softmax along the last dim."""
    out = torch.empty(x.shape, dtype=F32)
    _softmax_k(rows2(x), out.numpy().reshape(-1, x.shape[-1]), sum_bits(x.shape[-1]))
    return out


@kernel(empty=like_f32)
def log_softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """ops.log_softmax_rows_eager: log-softmax along the last dim."""
    out = torch.empty(x.shape, dtype=F32)
    _log_softmax_k(rows2(x), out.numpy().reshape(-1, x.shape[-1]), sum_bits(x.shape[-1]))
    return out


@kernel(empty=like_f32)
def softmax_bwd_rows(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """ops.softmax_bwd_rows_eager: the softmax gradient from its output p and the gradient g."""
    out = torch.empty(p.shape, dtype=F32)
    _softmax_bwd_k(rows2(p), rows2(g), out.numpy().reshape(-1, p.shape[-1]), sum_bits(p.shape[-1]))
    return out


@kernel(empty=like_f32)
def log_softmax_bwd_rows(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """ops.log_softmax_bwd_rows_eager: the log-softmax gradient from its output y and g."""
    out = torch.empty(y.shape, dtype=F32)
    _log_softmax_bwd_k(rows2(y), rows2(g), out.numpy().reshape(-1, y.shape[-1]), sum_bits(y.shape[-1]))
    return out


@kernel()
def ce_rows(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ops.ce_rows_eager of x [R, V], targets t [R]: (loss float32, row max float32, S float64)."""
    R = x.shape[0]
    loss = torch.empty(R, dtype=F32)
    m = torch.empty(R, dtype=F32)
    S = torch.empty(R, dtype=F64)
    if R:
        _ce_k(as_np(x), as_np(t), loss.numpy(), m.numpy(), S.numpy(), sum_bits(x.shape[1]))
    return loss, m, S


@kernel(empty=like_f32)
def ce_bwd_rows(x: torch.Tensor, t: torch.Tensor, m: torch.Tensor, S: torch.Tensor,
                scale: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """ops.ce_bwd_rows_eager: the logits' gradient from ce_rows' m and S, scale = (g, total)."""
    g64, total = scale
    out = torch.empty(x.shape, dtype=F32)
    _ce_bwd_k(as_np(x), as_np(t), as_np(m), as_np(S), float(g64), float(total), out.numpy())
    return out


@kernel()
def layer_norm_rows(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y float32, mu float64 [R, 1], rstd float64 [R, 1]) for contiguous x [R, C]."""
    R, C = x.shape
    out = torch.empty(R, C, dtype=F32)
    mu = torch.empty(R, 1, dtype=F64)
    rstd = torch.empty(R, 1, dtype=F64)
    empty = np.zeros(1)
    w64 = as_np(w.to(F64)) if w is not None else empty
    b64 = as_np(b.to(F64)) if b is not None else empty
    if R:
        _ln_fwd_k(as_np(x), w64, b64, w is not None, b is not None, float(eps), sum_bits(C), out.numpy(),
                  mu.numpy().reshape(-1), rstd.numpy().reshape(-1))
    return out, mu, rstd


@kernel()
def layer_norm_bwd_rows(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor | None, mu: torch.Tensor,
                        rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx float32, g * xhat float64) for contiguous x, g [R, C]."""
    R, C = x.shape
    gx = torch.empty(R, C, dtype=F32)
    prod = torch.empty(R, C, dtype=F64)
    w64 = as_np(w.to(F64)) if w is not None else np.zeros(1)
    if R:
        _ln_bwd_k(as_np(x), as_np(g), w64, w is not None, as_np(mu).reshape(-1), as_np(rstd).reshape(-1),
                  sum_bits(C), gx.numpy(), prod.numpy())
    return gx, prod


@kernel()
def seq_sums(v: torch.Tensor) -> torch.Tensor:
    """exact_sum64(v, dim=1) for v [B, T, C] (float64 result [B, C])."""
    B, T, C = v.shape
    out = torch.empty(B, C, dtype=F64)
    if B * C:
        _colsum_k(as_np(v.to(F64)), sum_bits(T), out.numpy())
    return out


@kernel()
def sum_of_squares_chunks(flat: torch.Tensor, chunk: int, s: int) -> tuple[str | None, list[tuple[int, int]]]:
    """The per-chunk terms ops.sum_of_squares takes from one non-empty float32 CPU tensor:
    ("nan" | "inf" | None, [(n, e), ...] with the value sum n * 2^e, zero sums left out)."""
    x = as_np(flat).reshape(-1)
    nch = -(-x.shape[0] // chunk)
    n = np.zeros(nch, dtype=np.int64)
    e = np.zeros(nch, dtype=np.int64)
    nnan, ninf = _sos_chunks_k(x, x.view(np.int32), chunk, s, n, e)
    if nnan or ninf:
        return ("nan" if nnan else "inf"), []
    return None, [(int(ni), int(ei)) for ni, ei in zip(n.tolist(), e.tolist(), strict=True) if ni]
