"""Compiled twins of oracle.exact.quant: the exact float64 row sum (quant.exact_sum64 along one
row, which the row kernels of kernels.ops call) and the GEMM operands' quantisers
(quant.quantise along rows or columns, quant.quantise_hilo along rows).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, Float, Int, njit, prange
from oracle.exact.kernels._numba import bits_as_f32 as _bits_as_f32
from oracle.exact.kernels._numba import pow2 as _pow2
from oracle.exact.kernels._pool import split
from oracle.exact.kernels._wrap import as_np, kernel
from oracle.exact.quant import E_MIN, F64

# --- exact row sum (mirrors quant.exact_sum64 along one row) --------------------------

@njit(**_opts)
def exact_sum(buf: Arr, s: Int) -> Float:
    n = buf.shape[0]
    maxabs = 0.0
    bad = False
    for j in range(n):
        a = abs(buf[j])
        if not (a <= 1.7976931348623157e308):  # inf or NaN
            bad = True
        elif a > maxabs:
            maxabs = a
    has_nan = has_p = has_m = False
    if bad:
        for j in range(n):
            v = buf[j]
            if v != v:
                has_nan = True
            elif v == np.inf:
                has_p = True
            elif v == -np.inf:
                has_m = True
    if maxabs == 0.0:
        e = 0
    else:
        _, e = math.frexp(maxabs)
    if e < E_MIN:
        e = E_MIN
    up = _pow2(np.int64(s - e))
    total = 0.0
    for j in range(n):
        v = buf[j]
        if bad and not (abs(v) <= 1.7976931348623157e308):
            continue
        total += np.rint(v * up)
    val = total * _pow2(np.int64(e - s))
    if has_nan or (has_p and has_m):
        return np.nan
    if has_p:
        return np.inf
    if has_m:
        return -np.inf
    return val


# --- the GEMM operands' quantisers (mirror quant.quantise) --------------------------------
# The block maximum is taken on the float32 bit patterns: for finite values |x| orders as
# its bits & 0x7FFFFFFF do (an integer max, in any order, is the same value), and every inf or
# NaN has bits >= 0x7F800000, above all finite ones. The sum of squares ss of each block (the
# Cauchy-Schwarz test of gemm._fast_single) is added in the block's own order, index 0 first,
# in both kernels, so it is the same float64 number whichever kernel quantised the block.

ABS32 = np.int32(0x7FFFFFFF)
INF32_BITS = np.int32(0x7F800000)
_COL_TILE = 1024  # columns per task of the column quantiser

@njit(**_opts)
def block_exp(mb: Int) -> Int:
    """quant.block_exponent of the finite float32 block maximum whose bits are mb."""
    m = np.float64(_bits_as_f32(mb))  # exact widening
    if m == 0.0:
        ex = 0
    else:
        _, ex = math.frexp(m)
    if ex < E_MIN:
        ex = E_MIN
    return ex

@njit(**_opts)
def row_block_exp(xi: Arr, r: Int) -> tuple[bool, Int]:
    """(finite, block exponent) of row r of a float32 matrix read as its int32 bits xi: the
    largest magnitude by its bits (sign cleared; inf and NaN lie above every finite value),
    then quant.block_exponent of it; (False, 0) when the row holds inf or NaN."""
    mb = np.int32(0)
    for j in range(xi.shape[1]):
        b = xi[r, j] & ABS32
        mb = b if b > mb else mb
    if mb >= INF32_BITS:
        return False, 0
    return True, block_exp(mb)

_SS_LANES = 32  # a block's sum of squares: 32 partial sums (index mod 32), then added in lane order

@njit(**_opts)
def _quant_rows_part_k(x: Arr, s: Int, q: Arr, e: Arr, ss: Arr, need_ss: bool, r0: Int, r1: Int) -> Int:
    """quant.quantise(x, -1, s) of rows r0..r1-1 of float32 x [R, K]: q[r, j] =
    rint(x[r, j] 2^(s - e_r)), e_r the block exponent of row r, and if need_ss ss[r] = the
    row's sum of q^2 in lane order (_SS_LANES partial sums, lane l taking j = l mod 32 in j
    order, then the lanes added l = 0, 1, ...), in the same pass as the rounding. Returns the
    number of rows holding inf or NaN (such a row is left unwritten; the caller then takes
    the general path)."""
    K = x.shape[1]
    xi = x.view(np.int32)
    bad = 0
    L = _SS_LANES
    KL = K - K % L
    acc = np.zeros(L)
    for r in range(r0, r1):
        finite, ex = row_block_exp(xi, r)
        if not finite:
            bad += 1
            continue
        e[r] = ex
        up = _pow2(np.int64(s - ex))
        xr = x[r]
        qr = q[r]
        if not need_ss:
            for j in range(K):
                qr[j] = np.rint(np.float64(xr[j]) * up)
            continue
        acc[:] = 0.0
        for j0 in range(0, KL, L):
            for lane in range(L):
                v = np.rint(np.float64(xr[j0 + lane]) * up)
                qr[j0 + lane] = v
                acc[lane] += v * v
        for j in range(KL, K):
            v = np.rint(np.float64(xr[j]) * up)
            qr[j] = v
            acc[j - KL] += v * v
        t = 0.0
        for lane in range(L):
            t += acc[lane]
        ss[r] = t
    return bad

@njit(**_opts)
def _quant_cols_part_k(x: Arr, s: Int, q: Arr, e: Arr, ss: Arr, need_ss: bool, K: Int, N: Int, tile: Int,
                       t0: Int, t1: Int) -> Int:
    """quant.quantise(x, -2, s) of float32 x [B, K, N] (blocks: the columns), written row-major
    into q [B, K, N], on flat arrays, for tasks t0..t1-1 of tiles of `tile` columns (task t:
    matrix t // nt, the columns of tile t % nt): equal to _quant_rows_part_k on each matrix's
    transpose, q and e bit for bit; ss adds each column's squares in k order (one chain a
    column, vectorised across the tile), so it may differ from the row kernel's lane-order
    sum in its last bits (both are within gemm.KERNEL_ONE_GEMM_BOUND's error). e, ss: [B N]. Returns the
    number of columns holding inf or NaN (a tile with one is left unwritten). Every column is
    computed on its own, so the tile width changes no byte."""
    nt = (N + tile - 1) // tile
    xi = x.view(np.int32)
    bad = 0
    for t in range(t0, t1):
        b = t // nt
        c0 = (t % nt) * tile
        w = min(tile, N - c0)
        base = b * K * N + c0
        mb = np.zeros(w, np.int32)
        for k in range(K):
            row = xi[base + k * N:base + k * N + w]
            for j in range(w):
                mb[j] = max(mb[j], row[j] & ABS32)
        nb = 0
        up = np.empty(w)
        for j in range(w):
            if mb[j] >= INF32_BITS:
                nb += 1
                continue
            ex = block_exp(mb[j])
            e[b * N + c0 + j] = ex
            up[j] = _pow2(np.int64(s - ex))
        if nb:
            bad += nb
            continue
        acc = np.zeros(w if need_ss else 1)
        for k in range(K):
            xr = x[base + k * N:base + k * N + w]
            qr = q[base + k * N:base + k * N + w]
            if not need_ss:
                for j in range(w):
                    qr[j] = np.rint(np.float64(xr[j]) * up[j])
                continue
            for j in range(w):
                v = np.rint(np.float64(xr[j]) * up[j])
                qr[j] = v
                acc[j] += v * v
        if need_ss:
            ss[b * N + c0:b * N + c0 + w] = acc
    return bad


@njit(parallel=True, **_opts)
def _quant_rows_hilo_k(x: Arr, s: Int, qh: Arr, ql: Arr, e: Arr) -> Int:
    R, K = x.shape
    ok = 0
    two_s = _pow2(np.int64(s))
    for r in prange(R):
        m = 0.0
        bad = False
        for j in range(K):
            a = abs(np.float64(x[r, j]))
            if not (a <= 1.7976931348623157e308):
                bad = True
            elif a > m:
                m = a
        if bad:
            ok += 1
            continue
        if m == 0.0:
            ex = 0
        else:
            _, ex = math.frexp(m)
        if ex < E_MIN:
            ex = E_MIN
        e[r] = ex
        up = _pow2(np.int64(s - ex))
        for j in range(K):
            v = np.float64(x[r, j]) * up
            h = np.rint(v)
            qh[r, j] = h
            ql[r, j] = np.rint((v - h) * two_s)
    return ok


def _col_tile(B: int, N: int, threads: int) -> int:
    """Columns per task of quant_cols: _COL_TILE, or narrower (a multiple of 16) until the B
    matrices' tasks divide evenly among the threads."""
    per = -(-N // _COL_TILE)
    if threads > 1 and B < 4 * threads:
        while (B * per) % threads and per * 16 < N:
            per += 1
    return -(-N // (per * 16)) * 16


@kernel("split")
def quant_rows(x: torch.Tensor, s: int, out: torch.Tensor | None = None, need_ss: bool = True, *,
               threads: int = 1) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """quant.quantise(x, -1, s) of a contiguous float32 [R, K] tensor, bit for bit: (q float64,
    e int64 [R, 1], the largest row sum of q^2 as a float, 0.0 when not need_ss), or None if a row
    holds inf or NaN (the general path then runs). `out`: a contiguous float64 [R, K] tensor to
    write q into (returned as q); else q is a new tensor."""
    R, K = x.shape
    q = torch.empty(R, K, dtype=F64) if out is None else out
    e = torch.empty(R, 1, dtype=torch.int64)
    ss = np.zeros(max(R, 1))
    if R:
        args = (as_np(x), s, q.numpy(), e.numpy().reshape(-1), ss, bool(need_ss))
        if split(_quant_rows_part_k, args, R, threads, align=8):
            return None
    return q, e, float(ss.max()) if need_ss else 0.0


@kernel("split")
def quant_cols(x: torch.Tensor, s: int, out: torch.Tensor | None = None, need_ss: bool = True, *,
               threads: int = 1) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """quant.quantise(x, -2, s) of a contiguous float32 [.., K, N] tensor (one block per column),
    written row-major, bit for bit, without transposing x: (q float64 of x's shape, e int64
    [.., 1, N], the largest column sum of q^2 as a float, the same number quant_rows gives on the
    transpose; 0.0 when not need_ss), or None if a column holds inf or NaN. `out` as in
    quant_rows."""
    K, N = x.shape[-2:]
    x3 = x.reshape(math.prod(x.shape[:-2]), K, N)  # (not -1: x may have no elements)
    B = x3.shape[0]
    q = torch.empty(x.shape, dtype=F64) if out is None else out
    e = torch.empty(B, N, dtype=torch.int64) if K else torch.zeros(B, N, dtype=torch.int64)  # no rows: e = 0
    ss = np.zeros(max(B * N, 1))
    if B * N and K:
        tile = _col_tile(B, N, threads)
        args = (
            as_np(x3).reshape(-1),
            s,
            q.numpy().reshape(-1),
            e.numpy().reshape(-1),
            ss[: B * N],
            bool(need_ss),
            K,
            N,
            tile,
        )
        if split(_quant_cols_part_k, args, B * -(-N // tile), threads):
            return None
    return q, e.reshape(*x.shape[:-2], 1, N), float(ss.max()) if need_ss else 0.0


@kernel()
def quant_rows_hilo(x: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The two slices of quant.quantise_hilo for each row of a contiguous float32 [R, K] tensor:
    (hi, lo float64, e int64 [R, 1]), or None if a row holds inf or NaN."""
    R, K = x.shape
    qh = torch.empty(R, K, dtype=F64)
    ql = torch.empty(R, K, dtype=F64)
    e = torch.empty(R, 1, dtype=torch.int64)
    if R and _quant_rows_hilo_k(as_np(x), s, qh.numpy(), ql.numpy(), e.numpy().reshape(-1)):
        return None
    return qh, ql, e
