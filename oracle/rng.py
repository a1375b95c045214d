"""Counter-based randomness for exact-v1: Philox4x32-10 in int64 tensor arithmetic.

Every random number is a pure function of (seed, step, op site, element index), computed with
integer ops that give the same bits on any device, dispatch level and thread count. torch's own
generators are never used: their output depends on the CPU's vector dispatch level.

Keying (normative; also in docs/exact-v1.md, "RNG keying"):
  key     = (seed mod 2^32, seed >> 32)                       for a 64-bit base seed
  counter = (block mod 2^32, block >> 32, step, site_id)       block = element index // lanes
  site_id = first 4 bytes, little-endian, of BLAKE3(CBOR(["pot/rng-site/v1", site_name]))
Words: element e takes output word e mod 4 of block e // 4. Uniform float32 = (word >> 8) * 2^-24.
Normal: element e takes words (2(e mod 2), 2(e mod 2)+1) of block e // 2 and uses Box-Muller
z = sqrt(-2 ln u1) * cos(2 pi u2), u1 = (w_a + 1) * 2^-32, u2 = w_b * 2^-32, in binary64 with the
basic-operation log and cos defined below and the correctly rounded sqrt of oracle.exact.sqrt,
rounded once to float32 after scaling by std. On CPU the normals come from one compiled pass
(numba) that equals this eager definition bit for bit; the eager one runs on other devices.
Dropout keeps element e iff (word >> 8) >= round(p * 2^24).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from commitments.hashing import digest
from oracle.exact import kernels

MASK32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
# Blocks generated per chunk: bounds peak memory (each intermediate is int64 per block).
_CHUNK_BLOCKS = 1 << 20


class RngError(ValueError):
    """Bad RNG arguments (seed, step or index out of range)."""


def site_id(name: str) -> int:
    """The 32-bit op-site number of a stable site name (e.g. "init/h.0.attn.c_attn.weight")."""
    if not isinstance(name, str) or not name:
        raise RngError(f"an RNG site name must be a non-empty string, got {name!r}")
    return int.from_bytes(digest("pot/rng-site/v1", name)[:4], "little")


def _check_u32(what: str, v: int) -> int:
    if not isinstance(v, int) or not 0 <= v <= MASK32:
        raise RngError(f"{what} must be an integer in [0, 2^32), got {v!r}")
    return v


def _check_seed(seed: int) -> tuple[int, int]:
    if not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise RngError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    return seed & MASK32, seed >> 32


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    # uint32 x uint32 -> (hi, lo) with 16-bit halves, so no int64 intermediate can overflow.
    m_hi, m_lo = m >> 16, m & 0xFFFF
    a_hi, a_lo = a >> 16, a & 0xFFFF
    mid = a_lo * m_hi + a_hi * m_lo  # < 2^33
    t = a_lo * m_lo + ((mid & 0xFFFF) << 16)  # < 2^33
    lo = t & MASK32
    hi = a_hi * m_hi + (mid >> 16) + (t >> 32)  # < 2^32: the full product is < 2^64
    return hi, lo


def philox4x32(counter: Sequence[torch.Tensor], key: tuple[int, int], rounds: int = ROUNDS):
    """Philox4x32-`rounds` on int64 tensors holding uint32 values; returns 4 int64 tensors."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if r + 1 < rounds:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def _check_range(first: int, end: int) -> None:
    if first < 0 or end > 2**64:
        raise RngError(f"block range [{first}, {end}) is outside [0, 2^64)")


def _blocks(seed: int, step: int, site: int, first: int, count: int, device) -> torch.Tensor:
    """Philox output of blocks first..first+count-1 as an int64 tensor [count, 4]."""
    key = _check_seed(seed)
    step = _check_u32("step", step)
    site = _check_u32("site id", site)
    _check_range(first, first + count)
    out = torch.empty((count, 4), dtype=torch.int64, device=device)
    for start in range(0, count, _CHUNK_BLOCKS):
        n = min(_CHUNK_BLOCKS, count - start)
        b = torch.arange(first + start, first + start + n, dtype=torch.int64, device=device)
        lo = b & MASK32
        hi = b >> 32
        c2 = torch.full((n,), step, dtype=torch.int64, device=device)
        c3 = torch.full((n,), site, dtype=torch.int64, device=device)
        r = philox4x32((lo, hi, c2, c3), key)
        out[start : start + n] = torch.stack(r, dim=1)
    return out


def _site(site: str | int) -> int:
    return site_id(site) if isinstance(site, str) else _check_u32("site id", site)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            raise RngError(f"bad shape {tuple(shape)!r}")
        n *= d
    return n


def random_words(seed: int, step: int, site: str | int, shape: Sequence[int], *, offset: int = 0,
                 device=None) -> torch.Tensor:
    """uint32 words (int64 tensor of `shape`) for elements offset .. offset+numel-1."""
    n = _numel(shape)
    if n == 0:
        return torch.empty(tuple(shape), dtype=torch.int64, device=device)
    first, last = offset // 4, (offset + n - 1) // 4
    w = _blocks(seed, step, _site(site), first, last - first + 1, device).reshape(-1)
    return w[offset - 4 * first : offset - 4 * first + n].reshape(tuple(shape))


def uniform(seed: int, step: int, site: str | int, shape: Sequence[int], *, offset: int = 0,
            device=None) -> torch.Tensor:
    """float32 in [0, 1): the top 24 bits of each word times 2^-24 (exact)."""
    w = random_words(seed, step, site, shape, offset=offset, device=device)
    return (w >> 8).to(torch.float32) * torch.tensor(2.0**-24, dtype=torch.float32, device=w.device)


def keep_threshold(p: float) -> int:
    """Dropout threshold: an element is kept iff its top-24-bit word is >= this integer."""
    if not 0.0 <= p < 1.0:
        raise RngError(f"dropout probability must be in [0, 1), got {p!r}")
    return math.floor(p * 2.0**24 + 0.5)  # p * 2^24 is exact; + 0.5 is exact below 2^52


def keep_mask(seed: int, step: int, site: str | int, shape: Sequence[int], p: float, *,
              offset: int = 0, device=None) -> torch.Tensor:
    """Boolean keep-mask for dropout with drop probability p."""
    thr = keep_threshold(p)
    w = random_words(seed, step, site, shape, offset=offset, device=device)
    return (w >> 8) >= thr


# --- binary64 transcendentals from basic operations (used only by the normal transform) -------

_LN2_HI = 6.93147180369123816490e-01  # fdlibm split of ln 2: e * _LN2_HI is exact for |e| < 2^20
_LN2_LO = 1.90821492927058770002e-10
_SQRT2 = 1.4142135623730951
# log(m) = 2 atanh(s) = 2 s sum_k s^2k / (2k+1), s = (m-1)/(m+1), |s| <= 0.1716: 11 terms
# leave a truncation error below 1e-18 relative.
_ATANH_COEF = [1.0 / (2 * k + 1) for k in range(11)]
# Taylor coefficients of cos and sin/x on |x| <= pi/4 (truncation error below 3e-18).
_COS_COEF = [(-1.0) ** k / math.factorial(2 * k) for k in range(9)]
_SIN_COEF = [(-1.0) ** k / math.factorial(2 * k + 1) for k in range(9)]
_HALF_PI = 1.5707963267948966


def _horner(z: torch.Tensor, coef: list[float]) -> torch.Tensor:
    acc = torch.full_like(z, coef[-1])
    for c in reversed(coef[:-1]):
        acc = acc * z + c  # two separate roundings: mul, then add (eager torch never fuses)
    return acc


def log64(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive, normal binary64 values, from basic operations only.

    x = m * 2^e with m in [sqrt(1/2), sqrt(2)) read from the bits; log m = 2 atanh((m-1)/(m+1))
    by an 11-term odd series; result = e*LN2_HI + (log m + e*LN2_LO)."""
    if x.dtype != torch.float64:
        raise RngError("log64 takes a float64 tensor")
    bits = x.view(torch.int64)
    e = (bits >> 52) - 1023
    m = ((bits & ((1 << 52) - 1)) | (1023 << 52)).view(torch.float64)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)
    e = (e + big.to(torch.int64)).to(torch.float64)
    one = torch.ones_like(m)
    s = (m - one) / (m + one)
    p = _horner(s * s, _ATANH_COEF)
    log_m = (s + s) * p
    return e * _LN2_HI + (log_m + e * _LN2_LO)


def cos_2pi(u: torch.Tensor) -> torch.Tensor:
    """cos(2 pi u) for binary64 u, from basic operations only.

    r = u - round(u) in [-1/2, 1/2]; q = round(4r); x = (4r - q) * pi/2 in [-pi/4, pi/4];
    cos(q pi/2 + x) is cos x, -sin x, -cos x or sin x for q mod 4 = 0, 1, 2, 3."""
    if u.dtype != torch.float64:
        raise RngError("cos_2pi takes a float64 tensor")
    r = u - torch.round(u)
    t = r * 4.0
    q = torch.round(t)
    x = (t - q) * _HALF_PI
    z = x * x
    c = _horner(z, _COS_COEF)
    s = x * _horner(z, _SIN_COEF)
    qi = torch.remainder(q.to(torch.int64), 4)
    return torch.where(qi == 0, c, torch.where(qi == 1, -s, torch.where(qi == 2, -c, s)))


def normal(seed: int, step: int, site: str | int, shape: Sequence[int], *, std: float = 1.0,
           offset: int = 0, device=None) -> torch.Tensor:
    """float32 normal(0, std) by Box-Muller over two 32-bit words per element (see module doc).

    On CPU one compiled pass (_normal_k) computes it; elsewhere, or with the kernels off, the
    eager definition below does. Both give the same bits (tests/oracle/test_rng.py)."""
    n = _numel(shape)
    if n == 0:
        return torch.empty(tuple(shape), dtype=torch.float32, device=device)
    if _use_kernel(device) and offset + n < 2**62:
        k0, k1 = _check_seed(seed)
        step = _check_u32("step", step)
        site_n = _site(site)
        _check_range(offset // 2, (offset + n - 1) // 2 + 1)
        out = torch.empty(tuple(shape), dtype=torch.float32)
        with _kernel_threads(n):
            _normal_k(k0, k1, step, site_n, offset, float(std), out.view(-1).numpy())
        return out
    return normal_eager(seed, step, site, shape, std=std, offset=offset, device=device)


def normal_eager(seed: int, step: int, site: str | int, shape: Sequence[int], *, std: float = 1.0,
                 offset: int = 0, device=None) -> torch.Tensor:
    """The normative definition of `normal` in tensor operations (any device)."""
    n = _numel(shape)
    if n == 0:
        return torch.empty(tuple(shape), dtype=torch.float32, device=device)
    first, last = offset // 2, (offset + n - 1) // 2
    pairs = _blocks(seed, step, _site(site), first, last - first + 1, device).reshape(-1, 2)
    pairs = pairs[offset - 2 * first : offset - 2 * first + n]
    return box_muller(pairs[:, 0], pairs[:, 1], std).reshape(tuple(shape))


def box_muller(wa: torch.Tensor, wb: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """float32 std * sqrt(-2 ln u1) cos(2 pi u2) of two int64 tensors of uint32 words."""
    u1 = (wa + 1).to(torch.float64) * 2.0**-32  # (0, 1]: the log is finite
    u2 = wb.to(torch.float64) * 2.0**-32  # [0, 1)
    radius = kernels.sqrt(log64(u1) * -2.0)  # correctly rounded (stock torch.sqrt is not)
    z = radius * cos_2pi(u2)
    return (z * float(std)).to(torch.float32)


def box_muller_compiled(wa: torch.Tensor, wb: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """`box_muller` by the compiled pass's own transform (for the conformance tests)."""
    if kernels.numba is None:
        raise RngError("the compiled RNG pass needs numba")
    wa = wa.to(torch.int64).contiguous().reshape(-1)
    wb = wb.to(torch.int64).contiguous().reshape(-1)
    out = torch.empty(wa.shape, dtype=torch.float32)
    _box_muller_k(wa.numpy(), wb.numpy(), float(std), out.numpy())
    return out


# --- the compiled CPU pass ------------------------------------------------------------------------
#
# One loop over Philox blocks that writes float32 normals straight into the output: the same
# operations as philox4x32, log64, cos_2pi, oracle.exact.sqrt and normal_eager, in the same order,
# each separately rounded (numba without fastmath: no FMA contraction, no reassociation; the
# hardware square root is correctly rounded, as oracle.exact.sqrt is by construction). The eager
# definition stays the reference: tests/oracle/test_rng.py compares the two bit for bit.


def _use_kernel(device) -> bool:
    # a device is None, a torch.device or its name ("cpu", "cuda:0"); str() of each gives the name
    return kernels.enabled() and (device is None or str(device).split(":")[0] == "cpu")


def _kernel_threads(n: int):
    """The compiled kernels' lock and thread count (numba's pool takes one caller at a time)."""
    import contextlib

    @contextlib.contextmanager
    def held():
        threads = 1 if n < kernels.PARALLEL_MIN_ELEMS else max(
            1, min(torch.get_num_threads(), kernels.numba.config.NUMBA_NUM_THREADS))
        with kernels._lock:
            kernels.numba.set_num_threads(threads)
            yield
    return held()


if kernels.numba is not None:
    from numba import njit, prange
    from numba.core import types as _nbt
    from numba.extending import intrinsic

    @intrinsic
    def _as_bits(typingctx, v):
        """The bit pattern of a float64 as an int64 (an LLVM bitcast; no rounding)."""
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(_nbt.int64))
        return _nbt.int64(_nbt.float64), codegen

    @intrinsic
    def _as_f64(typingctx, v):
        """The float64 of an int64 bit pattern (an LLVM bitcast; no rounding)."""
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(_nbt.float64))
        return _nbt.float64(_nbt.int64), codegen

    # Typed as Any: njit's overloads take each option with its own type, not a mixed dict.
    _opts: dict[str, Any] = dict(cache=True, nogil=True, error_model="numpy")  # fastmath stays off
    _LOG_T = tuple(_ATANH_COEF)
    _COS_T = tuple(_COS_COEF)
    _SIN_T = tuple(_SIN_COEF)
    _MANT = (1 << 52) - 1
    _ONE_EXP = 1023 << 52
    _TWO_M32 = 2.0**-32

    @njit(**_opts)
    def _horner_k(coef, z):
        acc = coef[len(coef) - 1]
        for i in range(len(coef) - 2, -1, -1):
            acc = acc * z + coef[i]
        return acc

    @njit(**_opts)
    def _philox_k(c0, c1, c2, c3, k0, k1):
        # int64 lanes holding uint32 values; a 32x32-bit product wraps in int64 with the bits of
        # the unsigned product, so its high word is (p >> 32) & MASK32.
        for r in range(ROUNDS):
            p0 = c0 * PHILOX_M0
            p1 = c2 * PHILOX_M1
            hi0, lo0 = (p0 >> 32) & MASK32, p0 & MASK32
            hi1, lo1 = (p1 >> 32) & MASK32, p1 & MASK32
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            if r + 1 < ROUNDS:
                k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        return c0, c1, c2, c3

    @njit(**_opts)
    def _log_k(x):
        bits = _as_bits(x)
        e = (bits >> 52) - 1023
        m = _as_f64((bits & _MANT) | _ONE_EXP)
        if m > _SQRT2:
            m = m * 0.5
            e += 1
        ef = np.float64(e)
        s = (m - 1.0) / (m + 1.0)
        p = _horner_k(_LOG_T, s * s)
        log_m = (s + s) * p
        return ef * _LN2_HI + (log_m + ef * _LN2_LO)

    @njit(**_opts)
    def _cos_2pi_k(u):
        r = u - np.rint(u)
        t = r * 4.0
        q = np.rint(t)
        x = (t - q) * _HALF_PI
        z = x * x
        qi = np.int64(q) % 4
        if qi == 0:
            return _horner_k(_COS_T, z)
        if qi == 2:
            return -_horner_k(_COS_T, z)
        s = x * _horner_k(_SIN_T, z)
        return -s if qi == 1 else s

    @njit(**_opts)
    def _normal_one(wa, wb, std):
        u1 = np.float64(wa + 1) * _TWO_M32
        u2 = np.float64(wb) * _TWO_M32
        radius = math.sqrt(_log_k(u1) * -2.0)
        return np.float32((radius * _cos_2pi_k(u2)) * std)

    @njit(**_opts)
    def _box_muller_k(wa, wb, std, out):
        for i in range(out.shape[0]):
            out[i] = _normal_one(wa[i], wb[i], std)

    @njit(parallel=True, **_opts)
    def _normal_k(k0, k1, step, site, offset, std, out):
        n = out.shape[0]
        first = offset // 2
        nblocks = (offset + n - 1) // 2 - first + 1
        for j in prange(nblocks):
            b = first + j
            w0, w1, w2, w3 = _philox_k(b & MASK32, b >> 32, np.int64(step), np.int64(site),
                                       np.int64(k0), np.int64(k1))
            e = 2 * b - offset  # the output index of the block's first element
            if e >= 0:
                out[e] = _normal_one(w0, w1, std)
            if e + 1 < n:
                out[e + 1] = _normal_one(w2, w3, std)

