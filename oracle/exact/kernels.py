"""Compiled CPU kernels (numba) for the transcendental chain: exp, GELU, softmax-family rows.

Each mirrors an eager definition in oracle.exact.transcendental / oracle.exact.ops operation for
operation, so its results equal the eager ones bit for bit (tests/oracle/test_exact_kernels.py
checks random and edge-case vectors). No fastmath: LLVM then keeps every multiply and add
separately rounded (no FMA contraction, no reassociation, no flush-to-zero); the tests also scan
the generated machine code for fused multiply-add instructions.
Used only for CPU tensors; set POT_EXACT_KERNELS=0 to run the eager definitions everywhere.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import torch

from oracle.exact import sqrt as xsqrt
from oracle.exact import transcendental as tx
from oracle.exact.quant import E_MIN, F32, F64, sum_bits

try:  # numba is a declared dependency; without it the eager path runs
    import numba
    from numba import njit, prange

    # The workqueue pool sleeps between calls. OpenMP pools spin after each parallel region and
    # starve torch's own threads of the cores they share (measured: 5-30x slower GEMM epilogues).
    # Calls are serialised below, as this layer requires.
    if numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "workqueue"
except ImportError:  # pragma: no cover
    numba = None

_disabled = os.environ.get("POT_EXACT_KERNELS", "1") == "0"


def enabled() -> bool:
    return numba is not None and not _disabled


@contextlib.contextmanager
def disabled():
    """Run the eager definitions on CPU too (for conformance tests and benchmarks)."""
    global _disabled
    old, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = old


# The constants, as tuples numba folds into the code.
_EXP_C = tx.EXP_C
_EXPM1_C = tx.EXPM1_C
_LOG_C = tx.LOG_C
_ERF_C = tx.ERF_C
INV_LN2, LN2_HI, LN2_LO = tx.INV_LN2, tx.LN2_HI, tx.LN2_LO
EXP_LO, EXP_HI = tx.EXP_LO, tx.EXP_HI
SQRT_HALF = tx.SQRT_HALF
ERF_SPLIT, ERFC_ZERO, ERFC_CF_TERMS, INV_SQRT_PI = tx.ERF_SPLIT, tx.ERFC_ZERO, tx.ERFC_CF_TERMS, tx.INV_SQRT_PI
SQRT_2_OVER_PI, GELU_A, INV_SQRT2, INV_SQRT_2PI = tx.SQRT_2_OVER_PI, tx.GELU_A, tx.INV_SQRT2, tx.INV_SQRT_2PI
NAN32 = np.float32(np.nan)

if numba is not None:
    _opts = dict(cache=True, nogil=True, error_model="numpy")  # fastmath stays off

    @njit(**_opts)
    def _horner(c, y):
        p = c[len(c) - 1]
        for i in range(len(c) - 2, -1, -1):
            p = p * y + c[i]
        return p

    from numba.core import types as _nbt
    from numba.extending import intrinsic

    def _bitcast(src, dst):
        """An intrinsic reinterpreting a `src` value's bits as `dst` (an LLVM bitcast; no rounding)."""
        def cast(typingctx, v):
            def codegen(context, builder, signature, args):
                return builder.bitcast(args[0], context.get_value_type(dst))
            return dst(src), codegen
        return intrinsic(cast)

    _bits_as_f64 = _bitcast(_nbt.int64, _nbt.float64)  # an int64 bit pattern as float64
    _bits_as_f32 = _bitcast(_nbt.int32, _nbt.float32)  # an int32 bit pattern as float32
    _f64_bits = _bitcast(_nbt.float64, _nbt.int64)     # the bit pattern of a float64 as an int64

    @njit(**_opts)
    def _pow2(k):
        """2^k for k in [-1022, 1023], from its bit pattern, as quant.pow2 builds it."""
        return _bits_as_f64((k + 1023) << 52)

    @njit(**_opts)
    def _scale_pow2(p, k):
        ki = np.int64(k)
        k1 = ki >> 1  # floor division by 2, as torch.div(..., rounding_mode="floor")
        k2 = ki - k1
        return (p * _pow2(k1)) * _pow2(k2)

    @njit(**_opts)
    def exp64(x):
        if x != x:
            return x
        xc = min(max(x, EXP_LO), EXP_HI)
        k = np.rint(xc * INV_LN2)
        r = (xc - k * LN2_HI) - k * LN2_LO
        return _scale_pow2(_horner(_EXP_C, r), k)

    @njit(**_opts)
    def log64(x):
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
    def _erfc_large(a):
        a = min(max(a, ERF_SPLIT), ERFC_ZERO)
        f = a
        for n in range(ERFC_CF_TERMS, 0, -1):
            f = a + (n * 0.5) / f
        return exp64(-(a * a)) * INV_SQRT_PI / f

    @njit(**_opts)
    def erfc64(x):
        if x != x:
            return x
        a = abs(x)
        if a < ERF_SPLIT:
            es = a * _horner(_ERF_C, a * a)
            return 1.0 + es if x < 0 else 1.0 - es
        cl = 0.0 if a >= ERFC_ZERO else _erfc_large(a)
        return 2.0 - cl if x < 0 else cl

    @njit(**_opts)
    def _f32(v):
        return NAN32 if v != v else np.float32(v)

    # --- elementwise ---------------------------------------------------------------------

    @njit(parallel=True, **_opts)
    def _exp_k(x, out):
        for i in prange(x.shape[0]):
            out[i] = _f32(exp64(np.float64(x[i])))

    @njit(**_opts)
    def _gelu_tanh_h(x):
        x2 = x * x
        u = SQRT_2_OVER_PI * (x + GELU_A * (x2 * x))
        return 2.0 / (1.0 + exp64(-2.0 * u)), x2

    @njit(**_opts)
    def _inf_slope(v, d):
        if v == np.inf:
            return 1.0
        if v == -np.inf:
            return 0.0
        return d

    @njit(parallel=True, **_opts)
    def _gelu_tanh_k(x, out):
        for i in prange(x.shape[0]):
            v = np.float64(x[i])
            h, _ = _gelu_tanh_h(v)
            out[i] = np.float32(-0.0) if v == -np.inf else _f32((0.5 * v) * h)

    @njit(parallel=True, **_opts)
    def _gelu_tanh_grad_k(x, g, out):
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
    def _erfc64_block(u, out, w, idx):
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
    def _gelu_erfc_block(x, b):
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
    def _gelu_erf_k(x, out):
        for b in prange((x.shape[0] + _ERF_BLOCK - 1) // _ERF_BLOCK):
            lo, hi, e = _gelu_erfc_block(x, b)
            for j in range(hi - lo):
                v = np.float64(x[lo + j])
                out[lo + j] = np.float32(-0.0) if v == -np.inf else _f32((0.5 * v) * e[j])

    @njit(parallel=True, **_opts)
    def _gelu_erf_grad_k(x, g, out):
        for b in prange((x.shape[0] + _ERF_BLOCK - 1) // _ERF_BLOCK):
            lo, hi, e = _gelu_erfc_block(x, b)
            for j in range(hi - lo):
                v = np.float64(x[lo + j])
                d = 0.5 * e[j] + (v * exp64(-0.5 * (v * v))) * INV_SQRT_2PI
                out[lo + j] = _f32(np.float64(g[lo + j]) * _inf_slope(v, d))

    # --- sigmoid and SiLU (mirror transcendental._sigmoid_parts, silu_f64, silu_grad_f64) ---

    @njit(**_opts)
    def _sigmoid_parts64(v):
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
    def _sigmoid_k(x, out):
        for i in prange(x.shape[0]):
            s, _ = _sigmoid_parts64(np.float64(x[i]))
            out[i] = _f32(s)

    @njit(parallel=True, **_opts)
    def _sigmoid_grad_k(x, g, out):
        for i in prange(x.shape[0]):
            s, u = _sigmoid_parts64(np.float64(x[i]))
            out[i] = _f32(np.float64(g[i]) * (s * u))

    @njit(parallel=True, **_opts)
    def _silu_k(x, out):
        for i in prange(x.shape[0]):
            v = np.float64(x[i])
            s, _ = _sigmoid_parts64(v)
            out[i] = np.float32(-0.0) if v == -np.inf else _f32(v * s)

    @njit(parallel=True, **_opts)
    def _silu_grad_k(x, g, out):
        for i in prange(x.shape[0]):
            v = np.float64(x[i])
            s, u = _sigmoid_parts64(v)
            out[i] = _f32(np.float64(g[i]) * _inf_slope(v, s * (1.0 + v * u)))

    # --- exact row sum (mirrors quant.exact_sum64 along one row) --------------------------

    @njit(**_opts)
    def _exact_sum(buf, s):
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

    @njit(**_opts)
    def _row_max(x):
        m = -np.inf
        for j in range(x.shape[0]):
            v = x[j]
            if v != v:
                return np.float32(np.nan)
            if v > m:
                m = v
        return np.float32(m)

    @njit(parallel=True, **_opts)
    def _softmax_k(x, out, s):
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
    def _log_softmax_k(x, out, s):
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
    def _softmax_bwd_k(p, g, out, s):
        R, n = p.shape
        for r in prange(R):
            prod = np.empty(n)
            for j in range(n):
                prod[j] = np.float64(g[r, j]) * np.float64(p[r, j])
            d = _exact_sum(prod, s)
            for j in range(n):
                out[r, j] = _f32(np.float64(p[r, j]) * (np.float64(g[r, j]) - d))

    @njit(parallel=True, **_opts)
    def _log_softmax_bwd_k(y, g, out, s):
        R, n = y.shape
        for r in prange(R):
            gg = np.empty(n)
            for j in range(n):
                gg[j] = np.float64(g[r, j])
            gs = _exact_sum(gg, s)
            for j in range(n):
                out[r, j] = _f32(gg[j] - exp64(np.float64(y[r, j])) * gs)

    @njit(parallel=True, **_opts)
    def _ce_k(x, t, loss, mo, so, s):
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
    def _ce_bwd_k(x, t, mi, si, g, total, out):
        R, n = x.shape
        for r in prange(R):
            m = np.float64(mi[r])
            S = si[r]
            for j in range(n):
                p = exp64(np.float64(x[r, j]) - m) / S
                oh = 1.0 if j == t[r] else 0.0
                out[r, j] = _f32(((p - oh) * g) / total)


    @njit(parallel=True, **_opts)
    def _fold_k(hi, lo, V):
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


    # --- the GEMM operands' quantisers (mirror quant.quantise) --------------------------------
    # The block maximum is taken on the float32 bit patterns: for finite values |x| orders as
    # its bits & 0x7FFFFFFF do (an integer max, in any order, is the same value), and every inf or
    # NaN has bits >= 0x7F800000, above all finite ones. The sum of squares ss of each block (the
    # Cauchy-Schwarz test of gemm._fast_single) is added in the block's own order, index 0 first,
    # in both kernels, so it is the same float64 number whichever kernel quantised the block.

    _ABS32 = np.int32(0x7FFFFFFF)
    _INF32_BITS = np.int32(0x7F800000)
    _COL_TILE = 1024  # columns per task of the column quantiser

    @njit(**_opts)
    def _block_exp(mb):
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
    def _row_block_exp(xi, r):
        """(finite, block exponent) of row r of a float32 matrix read as its int32 bits xi: the
        largest magnitude by its bits (sign cleared; inf and NaN lie above every finite value),
        then quant.block_exponent of it; (False, 0) when the row holds inf or NaN."""
        mb = np.int32(0)
        for j in range(xi.shape[1]):
            b = xi[r, j] & _ABS32
            mb = b if b > mb else mb
        if mb >= _INF32_BITS:
            return False, 0
        return True, _block_exp(mb)

    _SS_LANES = 32  # a block's sum of squares: 32 partial sums (index mod 32), then added in lane order

    @njit(**_opts)
    def _quant_rows_part_k(x, s, q, e, ss, need_ss, r0, r1):
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
            finite, ex = _row_block_exp(xi, r)
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
    def _quant_cols_part_k(x, s, q, e, ss, need_ss, K, N, tile, t0, t1):
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
                    mb[j] = max(mb[j], row[j] & _ABS32)
            nb = 0
            up = np.empty(w)
            for j in range(w):
                if mb[j] >= _INF32_BITS:
                    nb += 1
                    continue
                ex = _block_exp(mb[j])
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

    @njit(**_opts)
    def _scale_round_part_k(hi, ea, eb, s, out, i0, i1):
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
    def _hilo_round_part_k(top, mid, ea, eb, s, out, nz, negz, i0, i1):
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

    # --- layer norm rows and per-sequence column sums (mirror ops._LayerNorm, exact_sum64) -----

    @njit(parallel=True, **_opts)
    def _ln_fwd_k(x, w, b, has_w, has_b, eps, s, out, mu_o, rstd_o):
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
    def _ln_bwd_k(x, g, w, has_w, mu_i, rstd_i, s, gx, prod):
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
    def _colsum_k(v, s, out):
        B, T, C = v.shape
        for bc in prange(B * C):
            b = bc // C
            c = bc - b * C
            buf = np.empty(T)
            for t in range(T):
                buf[t] = v[b, t, c]
            out[b, c] = _exact_sum(buf, s)


    @njit(parallel=True, **_opts)
    def _quant_rows_hilo_k(x, s, qh, ql, e):
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


# --- torch wrappers ----------------------------------------------------------------------------

# numba's fallback threading layer (workqueue) aborts on concurrent parallel calls; one lock makes
# the wrappers safe from any number of threads (each kernel is parallel inside already).
_lock = threading.RLock()


# Small calls run on one thread: waking a thread pool costs more than it saves, and much more on
# a busy machine. Larger ones use as many threads as torch does (OMP_NUM_THREADS and friends).
PARALLEL_MIN_ELEMS = 1 << 18


def _serial(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        n = builtins_max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=0)
        threads = 1 if n < PARALLEL_MIN_ELEMS else builtins_max(
            1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
        with _lock:
            numba.set_num_threads(threads)
            return fn(*args, **kwargs)
    return wrapper


builtins_max = max



def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _flat_out(x: torch.Tensor):
    out = torch.empty(x.shape, dtype=F32)
    return out, out.view(-1).numpy()


def _elementwise(kernel, x: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
    """A float32 result of x's shape from kernel(x flat, *more flat, out flat)."""
    out, o = _flat_out(x)
    kernel(_np(x).reshape(-1), *(_np(t).reshape(-1) for t in more), o)
    return out


@_serial
def exp(x: torch.Tensor) -> torch.Tensor:
    return _elementwise(_exp_k, x)


@_serial
def gelu(x: torch.Tensor, form: str) -> torch.Tensor:
    return _elementwise(_gelu_tanh_k if form == "tanh" else _gelu_erf_k, x)


@_serial
def gelu_grad(x: torch.Tensor, g: torch.Tensor, form: str) -> torch.Tensor:
    return _elementwise(_gelu_tanh_grad_k if form == "tanh" else _gelu_erf_grad_k, x, g)


@_serial
def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """transcendental.sigmoid32 of a float32 tensor."""
    return _elementwise(_sigmoid_k, x)


@_serial
def sigmoid_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """transcendental.sigmoid_grad32: RN32(f64(g) (s u)) from x."""
    return _elementwise(_sigmoid_grad_k, x, g)


@_serial
def silu(x: torch.Tensor) -> torch.Tensor:
    """transcendental.silu32 of a float32 tensor (silu(-inf) = -0)."""
    return _elementwise(_silu_k, x)


@_serial
def silu_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """transcendental.silu_grad32: RN32(f64(g) silu'(x)), the limits 1 at +inf and 0 at -inf."""
    return _elementwise(_silu_grad_k, x, g)


def _rows2(t: torch.Tensor) -> np.ndarray:
    n = t.shape[-1] if t.dim() else 1
    return _np(t).reshape(-1, n)


@_serial
def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=F32)
    if x.numel():
        _softmax_k(_rows2(x), out.numpy().reshape(-1, x.shape[-1]), sum_bits(x.shape[-1]))
    return out


@_serial
def log_softmax_rows(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=F32)
    if x.numel():
        _log_softmax_k(_rows2(x), out.numpy().reshape(-1, x.shape[-1]), sum_bits(x.shape[-1]))
    return out


@_serial
def softmax_bwd_rows(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    out = torch.empty(p.shape, dtype=F32)
    if p.numel():
        _softmax_bwd_k(_rows2(p), _rows2(g), out.numpy().reshape(-1, p.shape[-1]), sum_bits(p.shape[-1]))
    return out


@_serial
def log_softmax_bwd_rows(y: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    out = torch.empty(y.shape, dtype=F32)
    if y.numel():
        _log_softmax_bwd_k(_rows2(y), _rows2(g), out.numpy().reshape(-1, y.shape[-1]), sum_bits(y.shape[-1]))
    return out


@_serial
def ce_rows(x: torch.Tensor, t: torch.Tensor):
    R = x.shape[0]
    loss = torch.empty(R, dtype=F32)
    m = torch.empty(R, dtype=F32)
    S = torch.empty(R, dtype=F64)
    if R:
        _ce_k(_np(x), _np(t), loss.numpy(), m.numpy(), S.numpy(), sum_bits(x.shape[1]))
    return loss, m, S


@_serial
def ce_bwd_rows(x, t, m, S, scale):
    g64, total = scale
    out = torch.empty(x.shape, dtype=F32)
    if x.numel():
        _ce_bwd_k(_np(x), _np(t), _np(m), _np(S), float(g64), float(total), out.numpy())
    return out


@_serial
def fold_into(hi: torch.Tensor, lo: torch.Tensor, values: torch.Tensor) -> int:
    """In place: fold values[0], values[1], ... into (hi, lo) as accumulate._fold_step does;
    returns the number of inexact low-word additions."""
    return int(_fold_k(hi.numpy(), lo.numpy(), _np(values)))


def _threads(args) -> int:
    """The thread count _serial gives a call with these arguments."""
    n = builtins_max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=0)
    return 1 if n < PARALLEL_MIN_ELEMS else builtins_max(
        1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def _serial_or_direct(fn):
    """_serial for a wrapper whose kernel has a serial body, called as fn(..., direct=True) when
    the call gets one thread: that body runs on the calling thread, without numba's pool (a
    parallel launch costs tens of microseconds, most of a small call) and so without the lock."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        threads = _threads(args)
        if threads == 1:
            return fn(*args, direct=True, **kwargs)
        with _lock:
            numba.set_num_threads(threads)
            return fn(*args, direct=False, **kwargs)
    return wrapper


# Kernels with a serial body over an index range run on more threads by splitting that range:
# the body's own code on each part, the last part on the calling thread and the others on a pool
# of Python threads that this module keeps (the bodies are compiled nogil). Each index is computed
# as on one thread, so the bytes do not depend on the split. numba's parallel launch (the
# workqueue layer, above) costs about 0.1 ms, and its prange bodies ran up to 3x slower than the
# serial ones here (768 x 768 column quantiser: 0.97 ms on one thread against 0.26 ms), so that at
# two threads these calls were slower than at one.
_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _split_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers < workers:
            old, _pool, _pool_workers = _pool, ThreadPoolExecutor(workers, thread_name_prefix="pot-kernel"), workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _reset_pool_in_child() -> None:
    # a forked child has none of the parent's pool threads: a fresh pool starts on first use
    global _pool, _pool_workers, _pool_lock
    _pool, _pool_workers, _pool_lock = None, 0, threading.Lock()


os.register_at_fork(after_in_child=_reset_pool_in_child)


def _split(part, args: tuple, n: int, threads: int, align: int = 1) -> int:
    """part(*args, i0, i1) over [0, n) in up to `threads` contiguous ranges whose bounds are
    multiples of `align` (every range waited for, also when one raises); the sum of what the
    parts return (None counts 0)."""
    chunks = -(-n // align) if n > 0 else 0
    k = min(threads, chunks)
    if k <= 1:
        return part(*args, 0, n) or 0
    step = -(-chunks // k) * align
    bounds = [(i, min(n, i + step)) for i in range(0, n, step)]
    pool = _split_pool(len(bounds) - 1)
    futures = [pool.submit(part, *args, i0, i1) for i0, i1 in bounds[:-1]]
    try:
        total = part(*args, *bounds[-1]) or 0
    finally:
        wait(futures)  # the parts write into the caller's buffers: none may outlive this call
    return total + sum(f.result() or 0 for f in futures)


def _col_tile(B: int, N: int, threads: int) -> int:
    """Columns per task of quant_cols: _COL_TILE, or narrower (a multiple of 16) until the B
    matrices' tasks divide evenly among the threads."""
    per = -(-N // _COL_TILE)
    if threads > 1 and B < 4 * threads:
        while (B * per) % threads and per * 16 < N:
            per += 1
    return -(-N // (per * 16)) * 16


def _split_threads(fn):
    """For a wrapper that splits a serial body with _split: passes threads=, the count _serial
    would give this call (1 for small calls). No lock: no numba pool is used."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, threads=_threads(args), **kwargs)
    return wrapper


@_split_threads
def quant_rows(x: torch.Tensor, s: int, out: torch.Tensor | None = None, need_ss: bool = True, *,
               threads: int = 1):
    """quant.quantise(x, -1, s) of a contiguous float32 [R, K] tensor, bit for bit: (q float64,
    e int64 [R, 1], the largest row sum of q^2 as a float, 0.0 when not need_ss), or None if a row
    holds inf or NaN (the general path then runs). `out`: a contiguous float64 [R, K] tensor to
    write q into (returned as q); else q is a new tensor."""
    R, K = x.shape
    q = torch.empty(R, K, dtype=F64) if out is None else out
    e = torch.empty(R, 1, dtype=torch.int64)
    ss = np.zeros(max(R, 1))
    if R:
        args = (_np(x), s, q.numpy(), e.numpy().reshape(-1), ss, bool(need_ss))
        if _split(_quant_rows_part_k, args, R, threads, align=8):
            return None
    return q, e, float(ss.max()) if need_ss else 0.0


@_split_threads
def quant_cols(x: torch.Tensor, s: int, out: torch.Tensor | None = None, need_ss: bool = True, *,
               threads: int = 1):
    """quant.quantise(x, -2, s) of a contiguous float32 [.., K, N] tensor (one block per column),
    written row-major, bit for bit, without transposing x: (q float64 of x's shape, e int64
    [.., 1, N], the largest column sum of q^2 as a float, the same number quant_rows gives on the
    transpose; 0.0 when not need_ss), or None if a column holds inf or NaN. `out` as in
    quant_rows."""
    K, N = x.shape[-2:]
    x3 = x.reshape(-1, K, N)
    B = x3.shape[0]
    q = torch.empty(x.shape, dtype=F64) if out is None else out
    e = torch.empty(B, N, dtype=torch.int64) if K else torch.zeros(B, N, dtype=torch.int64)  # no rows: e = 0
    ss = np.zeros(max(B * N, 1))
    if B * N and K:
        tile = _col_tile(B, N, threads)
        args = (_np(x3).reshape(-1), s, q.numpy().reshape(-1), e.numpy().reshape(-1), ss[:B * N], bool(need_ss),
                K, N, tile)
        if _split(_quant_cols_part_k, args, B * -(-N // tile), threads):
            return None
    return q, e.reshape(*x.shape[:-2], 1, N), float(ss.max()) if need_ss else 0.0


@_serial
def quant_rows_hilo(x: torch.Tensor, s: int):
    """The two slices of quant.quantise_hilo for each row of a contiguous float32 [R, K] tensor:
    (hi, lo float64, e int64 [R, 1]), or None if a row holds inf or NaN."""
    R, K = x.shape
    qh = torch.empty(R, K, dtype=F64)
    ql = torch.empty(R, K, dtype=F64)
    e = torch.empty(R, 1, dtype=torch.int64)
    if R and _quant_rows_hilo_k(_np(x), s, qh.numpy(), ql.numpy(), e.numpy().reshape(-1)):
        return None
    return qh, ql, e


@_serial
def layer_norm_rows(x: torch.Tensor, w, b, eps: float):
    """(y float32, mu float64 [R, 1], rstd float64 [R, 1]) for contiguous x [R, C]."""
    R, C = x.shape
    out = torch.empty(R, C, dtype=F32)
    mu = torch.empty(R, 1, dtype=F64)
    rstd = torch.empty(R, 1, dtype=F64)
    empty = np.zeros(1)
    w64 = _np(w.to(F64)) if w is not None else empty
    b64 = _np(b.to(F64)) if b is not None else empty
    if R:
        _ln_fwd_k(_np(x), w64, b64, w is not None, b is not None, float(eps), sum_bits(C), out.numpy(),
                  mu.numpy().reshape(-1), rstd.numpy().reshape(-1))
    return out, mu, rstd


@_serial
def layer_norm_bwd_rows(x: torch.Tensor, g: torch.Tensor, w, mu, rstd):
    """(dx float32, g * xhat float64) for contiguous x, g [R, C]."""
    R, C = x.shape
    gx = torch.empty(R, C, dtype=F32)
    prod = torch.empty(R, C, dtype=F64)
    w64 = _np(w.to(F64)) if w is not None else np.zeros(1)
    if R:
        _ln_bwd_k(_np(x), _np(g), w64, w is not None, _np(mu).reshape(-1), _np(rstd).reshape(-1),
                  sum_bits(C), gx.numpy(), prod.numpy())
    return gx, prod


@_serial
def seq_sums(v: torch.Tensor) -> torch.Tensor:
    """exact_sum64(v, dim=1) for v [B, T, C] (float64 result [B, C])."""
    B, T, C = v.shape
    out = torch.empty(B, C, dtype=F64)
    if B * C:
        _colsum_k(_np(v.to(F64)), sum_bits(T), out.numpy())
    return out


def all_kernels():
    """(name, dispatcher) of every compiled kernel, for the machine-code scan."""
    if numba is None:
        return []
    return [(n, f) for n, f in globals().items() if n.startswith("_") and n.endswith("_k")]


# --- square roots (oracle.exact.sqrt is the definition) ------------------------------------------
# math.sqrt compiles to LLVM's sqrt intrinsic, the IEEE instruction (sqrtsd/vsqrtpd on x86, fsqrt
# on ARM): correctly rounded, so it equals the eager definition bit for bit (conformance vectors).

if numba is not None:
    NAN64_BITS = 0x7FF8000000000000

    @njit(parallel=True, **_opts)
    def _sqrt64_k(x, out_bits):
        for i in prange(x.shape[0]):
            r = math.sqrt(x[i])  # sqrt(-0) = -0
            # the canonical NaN, written as bits: LLVM treats NaN payloads as unspecified and
            # would fold a float select between NaNs away (the instruction's NaN is negative)
            out_bits[i] = NAN64_BITS if r != r else _f64_bits(r)

    @njit(parallel=True, **_opts)
    def _fold_result_k(hi, lo, out):
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
    def _to_f32_k(x, out):
        for i in prange(x.shape[0]):
            out[i] = _f32(x[i])

    @njit(parallel=True, **_opts)
    def _sqrt32_k(x, out):
        for i in prange(x.shape[0]):
            out[i] = _f32(math.sqrt(np.float64(x[i])))


@_serial
def _sqrt_cpu(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype)
    if x.dtype == F32:
        _sqrt32_k(_np(x).reshape(-1), out.view(-1).numpy())
    else:
        _sqrt64_k(_np(x).reshape(-1), out.view(-1).view(torch.int64).numpy())
    return out


@_serial
def fold_result(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """float32 of hi + lo rounded once, as accumulate.Fold.result computes it (count > 1)."""
    out = torch.empty(hi.shape, dtype=F32)
    _fold_result_k(_np(hi).reshape(-1), _np(lo).reshape(-1), out.view(-1).numpy())
    return out


@_split_threads
def scale_round_f32(hi: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, *, threads: int = 1) -> torch.Tensor:
    """float32 of (hi * 2^(ea - s)) * 2^(eb - s) for hi [M, N] float64, ea [M], eb [N] int64."""
    out = torch.empty(hi.shape, dtype=F32)
    _split(_scale_round_part_k, (_np(hi), _np(ea), _np(eb), int(s), out.numpy()), hi.shape[0], threads)
    return out


@_split_threads
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
    _split(_hilo_round_part_k, (_np(top), _np(mid), _np(ea), _np(eb), int(s), out.numpy(), nz, negz),
           M, threads)
    if not nz.any() and negz.any():
        return None
    return out


@_serial
def f64_to_f32(x: torch.Tensor) -> torch.Tensor:
    """canon_nan(x.to(float32)) in one pass."""
    out = torch.empty(x.shape, dtype=F32)
    _to_f32_k(_np(x).reshape(-1), out.view(-1).numpy())
    return out


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded sqrt of a float32 or float64 tensor on any device: this kernel for CPU
    tensors, the eager definition (oracle.exact.sqrt) elsewhere or when kernels are off."""
    if x.dtype not in (F32, F64):
        raise ValueError(f"sqrt takes a float32 or float64 tensor, got {x.dtype}")
    if not enabled() or x.device.type != "cpu":
        return xsqrt.sqrt32(x) if x.dtype == F32 else xsqrt.sqrt64(x)
    return _sqrt_cpu(x)


# --- optimizer updates and the clipping sum (oracle.optim, ops.sum_of_squares are the definitions) --
# AdamW and SGD: one pass per tensor, every operation a float32 operation (numba keeps float32 op
# float32 as float32; the tests read the LLVM IR), in the eager order, into new arrays. The eager
# code does not canonicalise NaN, so the kernels count NaN in their outputs and the wrappers return
# None when there is one: the caller then runs the eager code for that tensor (no NaN output means
# no NaN anywhere, since every intermediate reaches an output and NaN never disappears).
# sum_of_squares: per chunk of 2^16 values the exact integer sum of the quantised squares and its
# exponent, combined exactly by the caller as the eager code does.

if numba is not None:
    @njit(parallel=True, **_opts)
    def _adamw_k(p, g, m, v, decay_flag, has_wd, decay, b1, c1, b2, c2, sqrt_bc2, eps, step_size,
                 po, mo, vo):
        wd = decay_flag and has_wd
        nan = 0
        for i in prange(p.shape[0]):
            pi = p[i]
            if wd:
                pi = pi * decay
            gi = g[i]
            mi = b1 * m[i] + c1 * gi
            vi = b2 * v[i] + c2 * (gi * gi)
            # kernels.sqrt of a float32: RN32 of the binary64 root of the widened value (_sqrt32_k)
            d = np.float32(math.sqrt(np.float64(vi))) / sqrt_bc2 + eps
            pn = pi - (mi / d) * step_size
            po[i] = pn
            mo[i] = mi
            vo[i] = vi
            if pn != pn or mi != mi or vi != vi:
                nan += 1
        return nan

    @njit(parallel=True, **_opts)
    def _sgd_k(p, g, buf, decay_flag, has_wd, wdc, mu, lr, po, bo):
        wd = decay_flag and has_wd
        nan = 0
        for i in prange(p.shape[0]):
            pi = p[i]
            gi = g[i]
            if wd:
                gi = gi + wdc * pi
            bi = mu * buf[i] + gi
            pn = pi - lr * bi
            po[i] = pn
            bo[i] = bi
            if pn != pn or bi != bi:
                nan += 1
        return nan

    @njit(parallel=True, **_opts)
    def _sos_chunks_k(x, xb, chunk, s, n_out, e_out):
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


def _f32_scalar(t: torch.Tensor):
    return np.float32(t.item())  # a float32 tensor's value: exact through the binary64 float


def _flat_f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().reshape(-1)


@_serial
def adamw(p, g, m, v, hp, decay: bool):
    """oracle.optim.adamw for contiguous CPU float32 tensors of one shape: (p, m, v) as new
    tensors, bit for bit, or None if an output holds a NaN (the eager code then runs)."""
    po, mo, vo = (torch.empty(p.shape, dtype=F32) for _ in range(3))
    nan = _adamw_k(_flat_f32(p), _flat_f32(g), _flat_f32(m), _flat_f32(v), bool(decay), bool(hp.has_wd),
                   _f32_scalar(hp.decay), _f32_scalar(hp.b1), _f32_scalar(hp.c1), _f32_scalar(hp.b2),
                   _f32_scalar(hp.c2), _f32_scalar(hp.sqrt_bc2), _f32_scalar(hp.eps),
                   _f32_scalar(hp.step_size), _flat_f32(po), _flat_f32(mo), _flat_f32(vo))
    return None if nan else (po, mo, vo)


@_serial
def sgd(p, g, buf, hp, decay: bool):
    """oracle.optim.sgd for contiguous CPU float32 tensors of one shape: (p, buf) as new tensors,
    bit for bit, or None if an output holds a NaN."""
    po, bo = (torch.empty(p.shape, dtype=F32) for _ in range(2))
    nan = _sgd_k(_flat_f32(p), _flat_f32(g), _flat_f32(buf), bool(decay), bool(hp.has_wd),
                 _f32_scalar(hp.wd), _f32_scalar(hp.mu), _f32_scalar(hp.lr), _flat_f32(po), _flat_f32(bo))
    return None if nan else (po, bo)


@_serial
def sum_of_squares_chunks(flat: torch.Tensor, chunk: int, s: int):
    """The per-chunk terms ops.sum_of_squares takes from one non-empty float32 CPU tensor:
    ("nan" | "inf" | None, [(n, e), ...] with the value sum n * 2^e, zero sums left out)."""
    x = _np(flat).reshape(-1)
    nch = -(-x.shape[0] // chunk)
    n = np.zeros(nch, dtype=np.int64)
    e = np.zeros(nch, dtype=np.int64)
    nnan, ninf = _sos_chunks_k(x, x.view(np.int32), chunk, s, n, e)
    if nnan or ninf:
        return ("nan" if nnan else "inf"), []
    return None, [(int(ni), int(ei)) for ni, ei in zip(n.tolist(), e.tolist(), strict=True) if ni]


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

if numba is not None:
    _DIGIT_TILE = 512  # columns per task of the column digit quantiser (its maxima: 2 KiB a row)
    _DIGIT_KB = 64     # rows of the tile transposed at a time (a 130 KiB float32 block, in L2)

    @njit(**_opts)
    def _digit_offsets(rev, K):
        """Where digits 0, 1, 2 of a block's integers start in its row of D."""
        return (2 * K, K, 0) if rev else (0, K, 2 * K)

    @njit(**_opts)
    def _digits3(x, up, d0, d1, d2):
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
    def _digits_rows_part_k(x, s, rev, D, e, r0, r1):
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
    def _digits_rows_k(x, s, rev, D, e):
        """quant.quantise(x, -1, s) of float32 x [R, K] (s <= 22) as int8 digits D [R, 3K] and
        block exponents e [R]; returns the number of rows holding inf or NaN."""
        R = x.shape[0]
        ng = (R + 7) // 8
        bad = np.zeros(ng, np.int64)
        for g in prange(ng):
            bad[g] = _digits_rows_part_k(x, s, rev, D, e, g * 8, min(R, g * 8 + 8))
        return np.sum(bad)

    @njit(**_opts)
    def _digits_cols_part_k(x, s, rev, D, e, t0, t1):
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
    def _digits_cols_k(x, s, rev, D, e):
        """quant.quantise(x, -2, s) of float32 x [K, C] (blocks: the columns; s <= 22) as int8
        digits D [C, 3K] (block c's row) and block exponents e [C]; returns the number of columns
        holding inf or NaN."""
        nt = (x.shape[1] + _DIGIT_TILE - 1) // _DIGIT_TILE
        bad = np.zeros(nt, np.int64)
        for t in prange(nt):
            bad[t] = _digits_cols_part_k(x, s, rev, D, e, t, t + 1)
        return np.sum(bad)

    @njit(**_opts)
    def _shift_sum(P, i, n):
        """n[j] = sum_t P[t, i, j] 2^(8 t) for the 5 shifts of 3-digit operands, in int64 (exact:
        gemm bounds every partial sum below 2^63)."""
        p0, p1, p2, p3, p4 = P[0, i], P[1, i], P[2, i], P[3, i], P[4, i]
        for j in range(n.shape[0]):
            n[j] = (np.int64(p0[j]) + (np.int64(p1[j]) << 8) + (np.int64(p2[j]) << 16)
                    + (np.int64(p3[j]) << 24) + (np.int64(p4[j]) << 32))

    @njit(**_opts)
    def _digits_round_tile_k(P, ea, eb, s, out, r0, c0, i0, i1):
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
    def _digits_parts_tile_k(P, ea, eb, s, hi, lo, want_lo, r0, c0, i0, i1):
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
    def _digits_round_par_k(P, ea, eb, s, out, r0, c0):
        """_digits_round_tile_k over the whole tile, rows in groups of 8 on the pool."""
        h = P.shape[1]
        ng = (h + 7) // 8
        big = np.zeros(ng, np.int64)
        for g in prange(ng):
            big[g] = _digits_round_tile_k(P, ea, eb, s, out, r0, c0, g * 8, min(h, g * 8 + 8))
        return np.sum(big)

    @njit(parallel=True, **_opts)
    def _digits_parts_par_k(P, ea, eb, s, hi, lo, want_lo, r0, c0):
        """_digits_parts_tile_k over the whole tile, rows in groups of 8 on the pool."""
        h = P.shape[1]
        ng = (h + 7) // 8
        nz = np.zeros(ng, np.int64)
        for g in prange(ng):
            nz[g] = _digits_parts_tile_k(P, ea, eb, s, hi, lo, want_lo, r0, c0, g * 8, min(h, g * 8 + 8))
        return np.sum(nz)


@_serial_or_direct
def quant_digits(x: torch.Tensor, s: int, rows: bool, rev: bool, out: torch.Tensor, *,
                 direct: bool = False):
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
        args = (_np(x), int(s), bool(rev), out.numpy(), e.numpy())
        if rows:
            bad = _digits_rows_part_k(*args, 0, blocks) if direct else _digits_rows_k(*args)
        else:
            nt = -(-blocks // _DIGIT_TILE)
            bad = _digits_cols_part_k(*args, 0, nt) if direct else _digits_cols_k(*args)
        if bad:
            return None
    return e


@_serial_or_direct
def digits_round_tile(P: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, out: torch.Tensor,
                      r0: int, c0: int, *, direct: bool = False) -> int:
    """Round one output tile of the slice route into float32 `out` (see _digits_round_tile_k):
    P int32 [5, h, w] (contiguous), ea, eb int64 block exponents of all rows / columns. Returns the
    count of entries whose integer passes 2^53 (then the two-word rounding must serve)."""
    args = (P.numpy(), _np(ea), _np(eb), int(s), out.numpy(), int(r0), int(c0))
    return int(_digits_round_tile_k(*args, 0, P.shape[1]) if direct else _digits_round_par_k(*args))


@_serial_or_direct
def digits_parts_tile(P: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, hi: torch.Tensor,
                      lo: torch.Tensor | None, r0: int, c0: int, *, direct: bool = False) -> int:
    """One output tile of the exact integer as scaled float64 parts (_digits_parts_tile_k): hi
    always, lo when given. Returns the count of nonzero lo in the tile."""
    lo_np = hi.numpy() if lo is None else lo.numpy()
    args = (P.numpy(), _np(ea), _np(eb), int(s), hi.numpy(), lo_np, lo is not None, int(r0), int(c0))
    return int(_digits_parts_tile_k(*args, 0, P.shape[1]) if direct else _digits_parts_par_k(*args))


if numba is not None:
    @njit(**_opts)
    def _scale2_part_k(x, ea, eb, s, i0, i1):
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


@_split_threads
def scale_parts(x: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, *, threads: int = 1) -> torch.Tensor:
    """(x 2^(ea - s)) 2^(eb - s) in place for a contiguous float64 [M, N] x, ea [M], eb [N] int64
    (gemm._scale on one matrix, one pass); returns x."""
    _split(_scale2_part_k, (x.numpy(), _np(ea), _np(eb), int(s)), x.shape[0], threads, align=8)
    return x
