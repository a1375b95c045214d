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
    """e with max|x| < 2^e <= 2 max|x| (frexp's exponent), 0 for an all-zero block; int64."""
    _, e = torch.frexp(maxabs.to(F64))
    e = e.to(torch.int64)
    return torch.clamp(torch.where(maxabs == 0, torch.zeros_like(e), e), min=E_MIN)


def quantise(x: torch.Tensor, dim: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integers q (float64) and block exponents e (int64, kept dim) with x ~ q * 2^(e - s).

    One block per line along `dim`. x must be finite (callers take the non-finite path first)."""
    maxabs = torch.amax(torch.abs(x), dim=dim, keepdim=True)
    e = block_exponent(maxabs)
    q = torch.round(torch.mul(x, pow2(s - e)) if x.dtype == F64 else torch.mul(x.to(F64), pow2(s - e)))
    return q, e


def quantise_hilo(x: torch.Tensor, dim: int, s: int):
    """Two slices with one block exponent: x ~ (hi * 2^s + lo) * 2^(e - 2s), |lo| <= 2^(s-1)."""
    maxabs = torch.amax(torch.abs(x), dim=dim, keepdim=True)
    e = block_exponent(maxabs)
    scaled = torch.mul(x.to(F64), pow2(s - e))
    hi = torch.round(scaled)
    lo = torch.round((scaled - hi) * pow2(torch.full_like(e, s)))  # scaled - hi is exact
    return hi, lo, e


def _finite_mask_all(*maxes: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(m).all()) for m in maxes)


def _nonfinite_class(x: torch.Tensor, dim: int | None, keepdim: bool):
    """(has NaN, has +inf, has -inf) per reduced line."""
    def anyr(m):
        return m.any() if dim is None else m.any(dim=dim, keepdim=keepdim)
    return anyr(torch.isnan(x)), anyr(x == math.inf), anyr(x == -math.inf)


def _apply_nonfinite(val: torch.Tensor, has_nan, has_pinf, has_ninf) -> torch.Tensor:
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
    if _finite_mask_all(maxabs):
        clean, cls = x, None
    else:
        clean = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))
        cls = _nonfinite_class(x, dim, True)
        maxabs = torch.amax(torch.abs(clean), dim=dim, keepdim=True)
    e = block_exponent(maxabs)
    q = torch.round(torch.mul(clean.to(F64), pow2(s - e)))
    val = torch.sum(q, dim=dim, keepdim=True) * pow2(e - s)
    if cls is not None:
        val = _apply_nonfinite(val, *cls)
    return val if keepdim else val.squeeze(dim)


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
    from oracle.exact import kernels  # here: kernels imports this module

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
    from oracle.exact import kernels  # here: kernels imports this module

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


def _quant_inplace(x: torch.Tensor, e: torch.Tensor, s: int) -> torch.Tensor:
    """round_half_even(x * 2^(s - e)) as a new float64 tensor, the scaling and rounding in place."""
    q = x.to(F64, copy=True)
    q.mul_(pow2(s - e))
    return q.round_()


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
    if not _finite_mask_all(amax, bmax):
        flags = _matmul_nonfinite(a.to(F64), b.to(F64))
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        a = torch.where(torch.isfinite(a), a, zero)
        b = torch.where(torch.isfinite(b), b, zero)
        amax, bmax = _maxabs(a, -1), _maxabs(b, -2)
    ea, eb = block_exponent(amax), block_exponent(bmax)
    if variant == "single":
        nc, kc = k_chunks(k)
        s = dot_bits(kc)
        qa, qb = _quant_inplace(a, ea, s), _quant_inplace(b, eb, s)
        if nc == 1 or _one_gemm_is_exact(qa, qb):
            hi, lo = torch.matmul(qa, qb), None
        else:
            hi, lo = _chunked_integer_matmul(qa, qb, nc, kc)
        del qa, qb
        hi, lo = _scale(hi, lo, pow2(ea - s), pow2(eb - s))
    elif variant == "hilo":
        s = hilo_bits(k)
        two_s = pow2(torch.full((), s, dtype=torch.int64, device=a.device))
        sa = a.to(F64, copy=True).mul_(pow2(s - ea))
        ha = torch.round(sa)
        la = sa.sub_(ha).mul_(two_s).round_()      # sa - ha is exact
        sb = b.to(F64, copy=True).mul_(pow2(s - eb))
        hb = torch.round(sb)
        lb = sb.sub_(hb).mul_(two_s).round_()
        hi, lo = _hilo_combine(ha, la, hb, lb, ea, eb, s)
    else:
        raise ExactError(f"matmul variant must be 'single' or 'hilo', got {variant!r}")
    if flags is not None:
        hi = _apply_nonfinite(hi, *flags)
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
