"""Compiled twins of oracle.exact.gemm's CPU steps: the epilogues that scale and round a float64
GEMM's result (gemm._scale and exact_matmul's rounding, gemm._hilo_finish), and the int8 slice
route (the operands' integers as base-256 digits, the shift products' sum, scaled and rounded).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, Float, Int, njit, prange
from oracle.exact.kernels._numba import bits_as_f64 as _bits_as_f64
from oracle.exact.kernels._numba import f32 as _f32
from oracle.exact.kernels._numba import f64_bits as _f64_bits
from oracle.exact.kernels._numba import pow2 as _pow2
from oracle.exact.kernels._pool import split
from oracle.exact.kernels._wrap import as_np, kernel
from oracle.exact.kernels.quant import ABS32 as _ABS32
from oracle.exact.kernels.quant import INF32_BITS as _INF32_BITS
from oracle.exact.kernels.quant import block_exp as _block_exp
from oracle.exact.kernels.quant import row_block_exp as _row_block_exp
from oracle.exact.quant import F32


@njit(**_opts)
def _scale_round_part_k(hi: Arr, ea: Arr, eb: Arr, s: Int, out: Arr, i0: Int, i1: Int) -> None:
    """Rows i0..i1-1 of gemm's epilogue: out = RN32((hi * 2^(ea_i - s)) * 2^(eb_j - s)), two
    exact scalings (float64 products, in that order) and one rounding."""
    N = hi.shape[1]
    pb = np.empty(N)
    for j in range(N):
        pb[j] = _pow2(np.int64(eb[j] - s))
    for i in range(i0, i1):
        pa = _pow2(np.int64(ea[i] - s))
        h = hi[i]
        o = out[i]
        for j in range(N):
            o[j] = _f32((h[j] * pa) * pb[j])

@njit(**_opts)
def _hilo_round_part_k(top: Arr, mid: Arr, ea: Arr, eb: Arr, s: Int, out: Arr, nz: Arr, negz: Arr, i0: Int,
                       i1: Int) -> None:
    """Rows i0..i1-1 of the rounded hi/lo epilogue (gemm._hilo_finish, then exact_matmul's
    rounding, is the definition; every step below is one of its float64 operations, in its
    order): h, l = TwoSum(top 2^s, mid); h and l each times 2^(ea_i - 2s), then 2^(eb_j - s);
    out = float32 of round-to-odd(TwoSum(h, l)), as quant.to_f32_once. nz[i]: how many l of
    row i are not zero; negz[i]: how many are +0 with h = -0 (the one case where the formula
    and float32(h), which exact_matmul takes when every l is zero, differ)."""
    N = top.shape[1]
    two_s = _pow2(np.int64(s))
    pb = np.empty(N)
    for j in range(N):
        pb[j] = _pow2(np.int64(eb[j] - s))
    for i in range(i0, i1):
        pa = _pow2(np.int64(ea[i] - 2 * s))
        t_r = top[i]
        m_r = mid[i]
        o = out[i]
        cz = 0
        cn = 0
        for j in range(N):
            a = t_r[j] * two_s  # exact: a power of two
            b = m_r[j]
            h = a + b
            bb = h - a
            lw = (a - (h - bb)) + (b - bb)
            h = (h * pa) * pb[j]
            lw = (lw * pa) * pb[j]
            if lw != 0.0:
                cz += 1
            elif h == 0.0 and math.copysign(1.0, h) < 0.0 and math.copysign(1.0, lw) > 0.0:
                cn += 1
            # to_f32_once(h, lw): TwoSum, non-finite parts as there, then round to odd
            s2 = h + lw
            bb = s2 - h
            err = (h - (s2 - bb)) + (lw - bb)
            if not (abs(err) <= 1.7976931348623157e308):
                err = 0.0
            if err != 0.0 and abs(s2) <= 1.7976931348623157e308:
                bits = _f64_bits(s2)
                if (bits & 1) == 0:
                    bits += 1 if (s2 > 0.0) == (err > 0.0) else -1
                    s2 = _bits_as_f64(bits)
            o[j] = np.float32(s2)
        nz[i] = cz
        negz[i] = cn


@kernel("split")
def scale_round_f32(hi: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, *,
                    threads: int = 1) -> torch.Tensor:
    """float32 of (hi * 2^(ea - s)) * 2^(eb - s) for hi [M, N] float64, ea [M], eb [N] int64."""
    out = torch.empty(hi.shape, dtype=F32)
    split(_scale_round_part_k, (as_np(hi), as_np(ea), as_np(eb), int(s), out.numpy()), hi.shape[0], threads)
    return out


@kernel("split")
def hilo_round_f32(top: torch.Tensor, mid: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, *,
                   threads: int = 1) -> torch.Tensor | None:
    """exact_matmul's float32 result of a 2-D hi/lo product from its two float64 GEMM outputs
    [M, N] (top = ha @ hb, mid = ha @ lb + la @ hb) and block exponents ea [M], eb [N] (int64), in
    one pass, bit for bit; None in the one case the pass does not cover (every low word zero and
    some high word -0 with a +0 low word: the caller then runs the eager code)."""
    M, N = top.shape
    out = torch.empty(M, N, dtype=F32)
    nz = np.zeros(M, dtype=np.int64)
    negz = np.zeros(M, dtype=np.int64)
    split(_hilo_round_part_k, (as_np(top), as_np(mid), as_np(ea), as_np(eb), int(s), out.numpy(), nz, negz),
           M, threads)
    if not nz.any() and negz.any():
        return None
    return out


# --- the int8 slice route on CPUs (gemm's compiled digits; docs/exact-v1.md §13) ----------------
#
# The quantiser writes each block's integers q = rint(x 2^(s - e)) straight as signed base-256
# digits (int8), q = sum_i d_i 256^i, the low digits in [-128, 128) and the top one what remains
# (|top| <= 64 for |q| <= 2^22, so 3 digits; gemm.slice_count). Digit matrices are laid out
# [blocks, 3K]:
# the row of block r holds digit 0 of its K integers, then digit 1, ... (`rev`: the last digit
# first), so that the digit products of one shift sum_{i + j = t} A_i B_j are ONE int8 GEMM of
# contiguous column ranges of both matrices (the contraction concatenated over the pairs). The
# epilogue adds the shifted int32 products in int64 (exact: gemm bounds them below 2^63) and
# scales and rounds exactly as _scale_round_part_k does.


_DIGIT_TILE = 512  # columns per task of the column digit quantiser (its maxima: 2 KiB a row)
_DIGIT_KB = 64     # rows of the tile transposed at a time (a 130 KiB float32 block, in L2)

@njit(**_opts)
def _digit_offsets(rev: bool, K: Int) -> tuple[Int, Int, Int]:
    """Where digits 0, 1, 2 of a block's integers start in its row of D."""
    return (2 * K, K, 0) if rev else (0, K, 2 * K)

@njit(**_opts)
def _digits3(x: Arr, up: Float, d0: Arr, d1: Arr, d2: Arr) -> None:
    """The 3 signed base-256 digits of q = rint(f64(x) up) (the same q as _quant_rows_part_k,
    |q| <= 2^22) for the float32 vector x, into the int8 vectors d0, d1, d2."""
    for j in range(x.shape[0]):
        v = np.int64(np.rint(np.float64(x[j]) * up))
        a = ((v + 128) & 255) - 128  # v mod 256 in [-128, 128)
        v = (v - a) >> 8             # exact: v - a is a multiple of 256
        b = ((v + 128) & 255) - 128
        d0[j] = a
        d1[j] = b
        d2[j] = (v - b) >> 8         # the top digit, |.| <= 64

@njit(**_opts)
def _digits_rows_part_k(x: Arr, s: Int, rev: bool, D: Arr, e: Arr, r0: Int, r1: Int) -> Int:
    """Rows r0..r1-1 of _digits_rows_k; returns the number of rows holding inf or NaN (left
    unwritten)."""
    K = x.shape[1]
    xi = x.view(np.int32)
    o0, o1, o2 = _digit_offsets(rev, K)
    bad = 0
    for r in range(r0, r1):
        finite, ex = _row_block_exp(xi, r)
        if not finite:
            bad += 1
            continue
        e[r] = ex
        _digits3(x[r], _pow2(np.int64(s - ex)), D[r, o0:o0 + K], D[r, o1:o1 + K], D[r, o2:o2 + K])
    return bad

@njit(parallel=True, **_opts)
def _digits_rows_k(x: Arr, s: Int, rev: bool, D: Arr, e: Arr) -> Int:
    """quant.quantise(x, -1, s) of float32 x [R, K] (s <= 22) as int8 digits D [R, 3K] and
    block exponents e [R]; returns the number of rows holding inf or NaN."""
    R = x.shape[0]
    ng = (R + 7) // 8
    bad = np.zeros(ng, np.int64)
    for g in prange(ng):
        bad[g] = _digits_rows_part_k(x, s, rev, D, e, g * 8, min(R, g * 8 + 8))
    return np.sum(bad)

@njit(**_opts)
def _digits_cols_part_k(x: Arr, s: Int, rev: bool, D: Arr, e: Arr, t0: Int, t1: Int) -> Int:
    """Column tiles t0..t1-1 of _digits_cols_k; returns the number of columns holding inf or
    NaN (a tile with one is left unwritten)."""
    K, C = x.shape
    xi = x.view(np.int32)
    o0, o1, o2 = _digit_offsets(rev, K)
    bad = 0
    up = np.empty(_DIGIT_TILE)
    mb = np.empty(_DIGIT_TILE, np.int32)
    # a block of the tile, transposed; rows padded by 16 floats so that they do not all map
    # to the same cache sets
    buf = np.empty((_DIGIT_TILE, _DIGIT_KB + 16), np.float32)
    for t in range(t0, t1):
        c0 = t * _DIGIT_TILE
        w = min(_DIGIT_TILE, C - c0)
        mb[:] = 0
        for k in range(K):
            for j in range(w):
                b = xi[k, c0 + j] & _ABS32
                mb[j] = b if b > mb[j] else mb[j]
        nb = 0
        for j in range(w):
            if mb[j] >= _INF32_BITS:
                nb += 1
                continue
            ex = _block_exp(mb[j])
            e[c0 + j] = ex
            up[j] = _pow2(np.int64(s - ex))
        if nb:
            bad += nb
            continue
        for k0 in range(0, K, _DIGIT_KB):
            k1 = min(K, k0 + _DIGIT_KB)
            for k in range(k0, k1):
                for j in range(w):
                    buf[j, k - k0] = x[k, c0 + j]
            for j in range(w):
                r = c0 + j
                _digits3(buf[j, :k1 - k0], up[j], D[r, o0 + k0:o0 + k1], D[r, o1 + k0:o1 + k1],
                         D[r, o2 + k0:o2 + k1])
    return bad

@njit(parallel=True, **_opts)
def _digits_cols_k(x: Arr, s: Int, rev: bool, D: Arr, e: Arr) -> Int:
    """quant.quantise(x, -2, s) of float32 x [K, C] (blocks: the columns; s <= 22) as int8
    digits D [C, 3K] (block c's row) and block exponents e [C]; returns the number of columns
    holding inf or NaN."""
    nt = (x.shape[1] + _DIGIT_TILE - 1) // _DIGIT_TILE
    bad = np.zeros(nt, np.int64)
    for t in prange(nt):
        bad[t] = _digits_cols_part_k(x, s, rev, D, e, t, t + 1)
    return np.sum(bad)

@njit(**_opts)
def _shift_sum(P: Arr, i: Int, n: Arr) -> None:
    """n[j] = sum_t P[t, i, j] 2^(8 t) for the 5 shifts of 3-digit operands, in int64 (exact:
    gemm bounds every partial sum below 2^63)."""
    p0, p1, p2, p3, p4 = P[0, i], P[1, i], P[2, i], P[3, i], P[4, i]
    for j in range(n.shape[0]):
        n[j] = (np.int64(p0[j]) + (np.int64(p1[j]) << 8) + (np.int64(p2[j]) << 16)
                + (np.int64(p3[j]) << 24) + (np.int64(p4[j]) << 32))

@njit(**_opts)
def _digits_round_tile_k(P: Arr, ea: Arr, eb: Arr, s: Int, out: Arr, r0: Int, c0: Int, i0: Int,
                         i1: Int) -> Int:
    """The slice route's epilogue on one output tile: P int32 [5, h, w] the shift products of
    rows r0.., columns c0.. of the output, N = sum_t P[t] 2^(8 t), out[r0 + i, c0 + j] =
    RN32((N_ij 2^(ea - s)) 2^(eb - s)) as _scale_round_part_k computes it, for the tile's rows
    i0..i1-1. Returns the count of |N| > 2^53 (their results are not valid: the caller
    rounds two words)."""
    w = P.shape[2]
    big = 0
    n = np.empty(w, np.int64)
    pb = np.empty(w)
    for j in range(w):
        pb[j] = _pow2(np.int64(eb[c0 + j] - s))
    for i in range(i0, i1):
        _shift_sum(P, i, n)
        pa = _pow2(np.int64(ea[r0 + i] - s))
        o = out[r0 + i, c0:c0 + w]
        for j in range(w):
            v = n[j]
            big += (v > 9007199254740992) | (v < -9007199254740992)
            o[j] = _f32((np.float64(v) * pa) * pb[j])  # exact in binary64 while |v| <= 2^53
    return big

@njit(**_opts)
def _digits_parts_tile_k(P: Arr, ea: Arr, eb: Arr, s: Int, hi: Arr, lo: Arr, want_lo: bool, r0: Int, c0: Int,
                         i0: Int, i1: Int) -> Int:
    """One output tile of the exact N = sum_t P[t] 2^(8 t) as the canonical float64 pair
    h = RN64(N), l = N - h, scaled as gemm._scale does: hi = (h 2^(ea - s)) 2^(eb - s), and
    lo likewise when want_lo (else lo is not touched), for the tile's rows i0..i1-1. Returns
    the count of nonzero l."""
    w = P.shape[2]
    nz = 0
    n = np.empty(w, np.int64)
    pb = np.empty(w)
    for j in range(w):
        pb[j] = _pow2(np.int64(eb[c0 + j] - s))
    for i in range(i0, i1):
        _shift_sum(P, i, n)
        pa = _pow2(np.int64(ea[r0 + i] - s))
        h_row = hi[r0 + i, c0:c0 + w]
        for j in range(w):
            v = np.float64(n[j])  # RN64(N)
            nz += n[j] != np.int64(v)  # |N - RN64(N)| <= 2^10 below 2^63: exact
            h_row[j] = (v * pa) * pb[j]
        if want_lo:
            l_row = lo[r0 + i, c0:c0 + w]
            for j in range(w):
                r = np.float64(n[j] - np.int64(np.float64(n[j])))
                l_row[j] = (r * pa) * pb[j]
    return nz


@njit(parallel=True, **_opts)
def _digits_round_par_k(P: Arr, ea: Arr, eb: Arr, s: Int, out: Arr, r0: Int, c0: Int) -> Int:
    """_digits_round_tile_k over the whole tile, rows in groups of 8 on the pool."""
    h = P.shape[1]
    ng = (h + 7) // 8
    big = np.zeros(ng, np.int64)
    for g in prange(ng):
        big[g] = _digits_round_tile_k(P, ea, eb, s, out, r0, c0, g * 8, min(h, g * 8 + 8))
    return np.sum(big)

@njit(parallel=True, **_opts)
def _digits_parts_par_k(P: Arr, ea: Arr, eb: Arr, s: Int, hi: Arr, lo: Arr, want_lo: bool, r0: Int,
                        c0: Int) -> Int:
    """_digits_parts_tile_k over the whole tile, rows in groups of 8 on the pool."""
    h = P.shape[1]
    ng = (h + 7) // 8
    nz = np.zeros(ng, np.int64)
    for g in prange(ng):
        nz[g] = _digits_parts_tile_k(P, ea, eb, s, hi, lo, want_lo, r0, c0, g * 8, min(h, g * 8 + 8))
    return np.sum(nz)


@kernel("direct")
def quant_digits(x: torch.Tensor, s: int, rows: bool, rev: bool, out: torch.Tensor, *,
                 direct: bool = False) -> torch.Tensor | None:
    """quant.quantise(x, -1 if rows else -2, s) (s <= 22) of a contiguous float32 matrix x,
    [R, K] along its rows or [K, C] along its columns, written as 3 signed base-256 int8 digits
    into `out` ([blocks, 3K], contiguous int8; see the section comment): the block exponents
    (int64 [blocks]), or None if a block holds inf or NaN (the general path then runs)."""
    if not 0 <= s <= 22:
        raise ValueError(f"quant_digits writes 3 digits: s must be at most 22, got {s}")
    blocks = x.shape[0] if rows else x.shape[1]
    if not x.numel():
        return torch.zeros(blocks, dtype=torch.int64)  # no elements: block exponent 0, as quantise gives
    e = torch.empty(blocks, dtype=torch.int64)
    if blocks:
        args = (as_np(x), int(s), bool(rev), out.numpy(), e.numpy())
        if rows:
            bad = _digits_rows_part_k(*args, 0, blocks) if direct else _digits_rows_k(*args)
        else:
            nt = -(-blocks // _DIGIT_TILE)
            bad = _digits_cols_part_k(*args, 0, nt) if direct else _digits_cols_k(*args)
        if bad:
            return None
    return e


@kernel("direct")
def digits_round_tile(P: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, out: torch.Tensor,
                      r0: int, c0: int, *, direct: bool = False) -> int:
    """Round one output tile of the slice route into float32 `out` (see _digits_round_tile_k):
    P int32 [5, h, w] (contiguous), ea, eb int64 block exponents of all rows / columns. Returns the
    count of entries whose integer passes 2^53 (then the two-word rounding must serve)."""
    args = (P.numpy(), as_np(ea), as_np(eb), int(s), out.numpy(), int(r0), int(c0))
    return int(_digits_round_tile_k(*args, 0, P.shape[1]) if direct else _digits_round_par_k(*args))


@kernel("direct")
def digits_parts_tile(P: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, hi: torch.Tensor,
                      lo: torch.Tensor | None, r0: int, c0: int, *, direct: bool = False) -> int:
    """One output tile of the exact integer as scaled float64 parts (_digits_parts_tile_k): hi
    always, lo when given. Returns the count of nonzero lo in the tile."""
    lo_np = hi.numpy() if lo is None else lo.numpy()
    args = (P.numpy(), as_np(ea), as_np(eb), int(s), hi.numpy(), lo_np, lo is not None, int(r0), int(c0))
    return int(_digits_parts_tile_k(*args, 0, P.shape[1]) if direct else _digits_parts_par_k(*args))


@njit(**_opts)
def _scale2_part_k(x: Arr, ea: Arr, eb: Arr, s: Int, i0: Int, i1: Int) -> None:
    """Rows i0..i1-1 of x[i, j] = (x[i, j] 2^(ea_i - s)) 2^(eb_j - s) in place: gemm._scale's
    two float64 multiplies, in its order, in one pass."""
    N = x.shape[1]
    pb = np.empty(N)
    for j in range(N):
        pb[j] = _pow2(np.int64(eb[j] - s))
    for i in range(i0, i1):
        pa = _pow2(np.int64(ea[i] - s))
        r = x[i]
        for j in range(N):
            r[j] = (r[j] * pa) * pb[j]


@kernel("split")
def scale_parts(x: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, *,
                threads: int = 1) -> torch.Tensor:
    """(x 2^(ea - s)) 2^(eb - s) in place for a contiguous float64 [M, N] x, ea [M], eb [N] int64
    (gemm._scale on one matrix, one pass); returns x."""
    split(_scale2_part_k, (x.numpy(), as_np(ea), as_np(eb), int(s)), x.shape[0], threads, align=8)
    return x
