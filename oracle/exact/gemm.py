"""Exact matrix products of block-quantised operands (docs/exact-v1.md §2): the GEMMs of exact-v1.

The operands are quantised by oracle.exact.quant (or its bit-identical CPU kernels) and multiplied
as float64 integers whose sums stay exact, then rescaled by powers of two and rounded once.
"""

from __future__ import annotations

import math

import torch

from oracle.exact import kernels
from oracle.exact.quant import (
    F32,
    F64,
    ExactError,
    all_finite,
    apply_nonfinite,
    canon_nan,
    dot_bits,
    hilo_bits,
    pow2,
    quantise,
    quantise_hilo,
    to_f32_once,
    two_sum,
)

# --- exact matrix products -------------------------------------------------------------------


def _classes(x: torch.Tensor):
    """Indicator matrices (float64 0/1) of NaN, +inf, -inf, zero, >0 finite, <0 finite."""
    def ind(m):
        return m.to(F64)
    fin = torch.isfinite(x)
    return (ind(torch.isnan(x)), ind(x == math.inf), ind(x == -math.inf), ind(x == 0),
            ind(fin & (x > 0)), ind(fin & (x < 0)))


K_CHUNK = 512


def k_chunks(k: int) -> tuple[int, int]:
    """(number of chunks, chunk length) of a single-slice contraction of length k: chunks of at
    most K_CHUNK, as even as possible (the last zero-padded). The bits per factor are
    dot_bits(chunk length); the block exponents still span the whole row/column."""
    nc = max(1, -(-k // K_CHUNK))
    return nc, -(-k // nc)


SPLIT_T = 26  # chunk products (< 2^53) split as H 2^26 + L: both sums stay exact for 2^26 chunks


# Cauchy-Schwarz: every partial sum of qa_i . qb_j, in any order, is at most |qa_i| |qb_j| in
# magnitude. Below 2^52 (a factor 2 under 2^53, covering the rounding of the norms) one GEMM of
# the whole contraction is exact whatever the BLAS does, and equals the chunked sum.
ONE_GEMM_BOUND = 2.0**52


def _one_gemm_is_exact(qa: torch.Tensor, qb: torch.Tensor) -> bool:
    na = torch.amax(torch.linalg.vector_norm(qa, dim=-1))
    nb = torch.amax(torch.linalg.vector_norm(qb, dim=-2))
    return bool(na * nb <= ONE_GEMM_BOUND)


def _chunk(q: torch.Tensor, c: int, kc: int, rows: bool) -> torch.Tensor:
    lo_k, hi_k = c * kc, min(q.shape[-1 if rows else -2], (c + 1) * kc)
    return q[..., lo_k:hi_k] if rows else q[..., lo_k:hi_k, :]


def _chunked_integer_matmul(qa: torch.Tensor, qb: torch.Tensor, nc: int, kc: int):
    """Exact integer qa @ qb as float64 (hi, lo) when the sum may pass 2^53.

    Fast path: add the chunk products P_c (each exact, |P_c| <= 2^53) in chunk order while every
    running total stays below 2^53 in magnitude, when every add is exact (the usual case).
    Otherwise: P_c = H_c 2^26 + L_c with H_c = floor(P_c 2^-26), 0 <= L_c < 2^26; sum H_c and
    sum L_c are exact in any order, and (sum H_c) 2^26 + sum L_c is one exact TwoSum. Both paths
    yield the exact integer, so which one runs never changes a result."""
    total = torch.matmul(_chunk(qa, 0, kc, True), _chunk(qb, 0, kc, False))
    for c in range(1, nc):
        total.add_(torch.matmul(_chunk(qa, c, kc, True), _chunk(qb, c, kc, False)))
        mn, mx = torch.aminmax(total)
        if not bool((mx < 2.0**53) & (mn > -(2.0**53))):
            break
    else:
        return total, None
    del total
    dev = qa.device
    down = pow2(torch.full((), -SPLIT_T, dtype=torch.int64, device=dev))
    up = pow2(torch.full((), SPLIT_T, dtype=torch.int64, device=dev))
    hsum = lsum = None
    for c in range(nc):
        p = torch.matmul(_chunk(qa, c, kc, True), _chunk(qb, c, kc, False))
        h = torch.mul(p, down).floor_().mul_(up)  # H_c 2^26, exact
        p.sub_(h)                                  # L_c, exact
        if hsum is None:
            hsum, lsum = h, p
        else:
            hsum.add_(h)  # multiples of 2^26 below 2^79: exact
            lsum.add_(p)
    return two_sum(hsum, lsum)


def _kernel_quant(x: torch.Tensor, dim: int, s: int):
    """(q, e) from the CPU row kernel (blocks made contiguous first), or None off CPU, for other
    dtypes, or when a block holds inf or NaN."""
    if not kernels.enabled() or x.device.type != "cpu" or x.dtype != F32:
        return None
    t = (x if dim == -1 else x.transpose(-2, -1)).contiguous()  # blocks become rows
    res = kernels.quant_rows(t.reshape(-1, t.shape[-1]), s)
    if res is None:
        return None
    q, e, ss = res
    q, e = q.reshape(t.shape), e.reshape(*t.shape[:-1], 1)
    return (q, e, ss) if dim == -1 else (q.transpose(-2, -1), e.transpose(-2, -1), ss)


def _fast_single(a: torch.Tensor, b: torch.Tensor, k: int):
    """The single-slice product with both operands quantised by the CPU kernel (finite inputs),
    or None. Same arithmetic as the general path."""
    nc, kc = k_chunks(k)
    s = dot_bits(kc)
    qa = _kernel_quant(a, -1, s)
    if qa is None:
        return None
    qb = _kernel_quant(b, -2, s)
    if qb is None:
        return None
    (qa, ea, ssa), (qb, eb, ssb) = qa, qb
    if nc == 1 or math.sqrt(ssa) * math.sqrt(ssb) <= ONE_GEMM_BOUND:
        hi, lo = torch.matmul(qa, qb), None
    else:
        hi, lo = _chunked_integer_matmul(qa, qb, nc, kc)
    del qa, qb
    return _scale(hi, lo, pow2(ea - s), pow2(eb - s))


def _kernel_quant_hilo(x: torch.Tensor, dim: int, s: int):
    if not kernels.enabled() or x.device.type != "cpu" or x.dtype != F32:
        return None
    t = (x if dim == -1 else x.transpose(-2, -1)).contiguous()
    res = kernels.quant_rows_hilo(t.reshape(-1, t.shape[-1]), s)
    if res is None:
        return None
    h, lo, e = (r.reshape(*t.shape[:-1], -1) for r in res)
    return (h, lo, e) if dim == -1 else tuple(r.transpose(-2, -1) for r in (h, lo, e))


def _fast_hilo(a: torch.Tensor, b: torch.Tensor, k: int):
    """The hi/lo product with both operands sliced by the CPU kernel (finite inputs), or None.
    Same arithmetic as the general path."""
    s = hilo_bits(k)
    qa = _kernel_quant_hilo(a, -1, s)
    if qa is None:
        return None
    qb = _kernel_quant_hilo(b, -2, s)
    if qb is None:
        return None
    (ha, la, ea), (hb, lb, eb) = qa, qb
    return _hilo_combine(ha, la, hb, lb, ea, eb, s)


def _hilo_combine(ha, la, hb, lb, ea, eb, s: int):
    two_s = pow2(torch.full((), s, dtype=torch.int64, device=ha.device))
    top = torch.matmul(ha, hb).mul_(two_s)                  # exact: a power-of-two scale
    mid = torch.matmul(ha, lb).add_(torch.matmul(la, hb))   # exact: both below 2^52
    hi, lo = two_sum(top, mid)
    return _scale(hi, lo, pow2(ea - 2 * s), pow2(eb - s))


def _scale(hi, lo, scale_a, scale_b):
    """(hi, lo) times the two exact power-of-two block scales (in place when shapes allow)."""
    if hi.shape == torch.broadcast_shapes(hi.shape, scale_a.shape, scale_b.shape):
        hi = hi.mul_(scale_a).mul_(scale_b)
    else:
        hi = hi * scale_a * scale_b
    if lo is not None:
        lo = lo * scale_a * scale_b
    return hi, lo


def _maxabs(x: torch.Tensor, dim: int) -> torch.Tensor:
    """max |x| along dim (kept), NaN if the line holds one (amax propagates NaN)."""
    return torch.amax(torch.abs(x), dim=dim, keepdim=True)


def _matmul_nonfinite(a: torch.Tensor, b: torch.Tensor):
    """Per output: (NaN, +inf, -inf) flags of the IEEE product sum, from counts of term classes.

    Counts come from float64 matmuls of 0/1 matrices (exact, order-free): a term is NaN if either
    factor is NaN or it is inf * 0; +inf if inf meets a factor of the same sign; -inf otherwise."""
    an, ap, am, az, apf, amf = _classes(a)
    bn, bp, bm, bz, bpf, bmf = _classes(b)
    ainf, binf = ap + am, bp + bm
    mm = torch.matmul
    nan_terms = mm(an, torch.ones_like(bn)) + mm(torch.ones_like(an) - an, bn) \
        + mm(ainf, bz) + mm(az, binf)
    pos = mm(ap, bp + bpf) + mm(am, bm + bmf) + mm(apf, bp) + mm(amf, bm)
    neg = mm(ap, bm + bmf) + mm(am, bp + bpf) + mm(apf, bm) + mm(amf, bp)
    return nan_terms > 0, pos > 0, neg > 0


def matmul_parts(a: torch.Tensor, b: torch.Tensor, variant: str = "single"):
    """The exact value of quantised a @ b as float64 parts (hi, lo); see _matmul_parts."""
    hi, lo, _ = _matmul_parts(a, b, variant)
    return hi, lo


def _matmul_parts(a: torch.Tensor, b: torch.Tensor, variant: str):
    """The exact value of quantised a[..., m, k] @ b[..., k, n] as float64 parts (hi, lo).

    Blocks: one per row of a along k, one per column of b along k. "single": dot_bits of the chunk
    length (k_chunks), the exact value is hi + lo (lo None when k fits one chunk). "hilo":
    hilo_bits(k) per slice, the exact value is hi + lo (hi = fl(value)). Non-finite entries
    follow IEEE classes (see _matmul_nonfinite)."""
    if variant not in ("single", "hilo"):
        raise ExactError(f"matmul variant must be 'single' or 'hilo', got {variant!r}")
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise ExactError(f"matmul: inner sizes differ: a[..., {a.shape[-2]}, {k}] @ b[..., {b.shape[-2]}, {b.shape[-1]}]")
    if k == 0:
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        return torch.zeros(shape, dtype=F64, device=a.device), None, False
    fast = _fast_single(a, b, k) if variant == "single" else _fast_hilo(a, b, k)
    if fast is not None:
        return fast[0], fast[1], False
    amax, bmax = _maxabs(a, -1), _maxabs(b, -2)
    flags = None
    if not all_finite(amax, bmax):
        flags = _matmul_nonfinite(a.to(F64), b.to(F64))
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        a = torch.where(torch.isfinite(a), a, zero)
        b = torch.where(torch.isfinite(b), b, zero)
        amax, bmax = _maxabs(a, -1), _maxabs(b, -2)
    if variant == "single":
        nc, kc = k_chunks(k)
        s = dot_bits(kc)
        qa, ea = quantise(a, -1, s, amax)
        qb, eb = quantise(b, -2, s, bmax)
        if nc == 1 or _one_gemm_is_exact(qa, qb):
            hi, lo = torch.matmul(qa, qb), None
        else:
            hi, lo = _chunked_integer_matmul(qa, qb, nc, kc)
        del qa, qb
        hi, lo = _scale(hi, lo, pow2(ea - s), pow2(eb - s))
    elif variant == "hilo":
        s = hilo_bits(k)
        ha, la, ea = quantise_hilo(a, -1, s, amax)
        hb, lb, eb = quantise_hilo(b, -2, s, bmax)
        hi, lo = _hilo_combine(ha, la, hb, lb, ea, eb, s)
    else:
        raise ExactError(f"matmul variant must be 'single' or 'hilo', got {variant!r}")
    if flags is not None:
        hi = apply_nonfinite(hi, *flags)
        if lo is not None:
            lo = torch.where(torch.isfinite(hi), lo, torch.zeros_like(lo))
    return hi, lo, flags is not None


def exact_matmul(a: torch.Tensor, b: torch.Tensor, variant: str = "single") -> torch.Tensor:
    """float32 result of the exact product of quantised a and b, rounded once."""
    hi, lo, nonfinite = _matmul_parts(a, b, variant)
    if lo is not None and not bool(torch.any(lo != 0)):
        lo = None  # hi alone is exact: one conversion rounds it
    out = to_f32_once(hi, lo)
    # NaN only arises from non-finite inputs (finite sums are exact; overflow gives inf)
    return canon_nan(out) if nonfinite else out
