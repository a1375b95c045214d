"""Transcendental functions of exact-v1 as fixed float64 algorithms (docs/exact-v1.md §3).

Each is range reduction plus a fixed polynomial or continued fraction with the constants written
out below, evaluated in a fixed order from IEEE basic operations only; the float32 ops round the
float64 result once. This eager torch code is the definition; oracle.exact.kernels mirrors it.
"""

from __future__ import annotations

import math

import torch

from oracle.exact.quant import F32, F64, canon_nan

# exp: x = k ln2 + r, |r| <= ln2/2; e^r by Taylor to degree 13 (remainder < 5e-18 relative).
INV_LN2 = 1.4426950408889634
LN2_HI = 0.6931471803691238      # 0x1.62e42fee00000p-1: k * LN2_HI is exact for |k| < 2^20
LN2_LO = 1.9082149292705877e-10  # ln 2 - LN2_HI
EXP_C = (1.0, 1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
         0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05, 2.7557319223985893e-06,
         2.755731922398589e-07, 2.505210838544172e-08, 2.08767569878681e-09, 1.6059043836821613e-10)
EXP_LO, EXP_HI = -746.0, 710.0   # beyond these e^x is 0 / inf in float64

# expm1 on |y| < ln2/2: y * sum_{n=0}^{14} y^n / (n+1)!
EXPM1_C = (1.0, 0.5, 0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
           0.001388888888888889, 0.0001984126984126984, 2.48015873015873e-05, 2.7557319223985893e-06,
           2.755731922398589e-07, 2.505210838544172e-08, 2.08767569878681e-09, 1.6059043836821613e-10,
           1.1470745597729725e-11, 7.647163731819816e-13)
EXPM1_SMALL = 0.34657359027997264  # ln2 / 2

# log: x = m 2^e, m in [sqrt(1/2), sqrt 2); log m = 2 atanh(s), s = (m-1)/(m+1), series to s^19.
SQRT_HALF = 0.7071067811865476
LOG_C = (1.0, 0.3333333333333333, 0.2, 0.14285714285714285, 0.1111111111111111, 0.09090909090909091,
         0.07692307692307693, 0.06666666666666667, 0.058823529411764705, 0.05263157894736842)

# erf on |x| < 2: x * sum_{n=0}^{33} (2/sqrt(pi)) (-1)^n x^(2n) / (n! (2n+1)).
ERF_C = (1.1283791670955126, -0.37612638903183754, 0.11283791670955126, -0.026866170645131252,
         0.005223977625442188, -0.0008548327023450853, 0.00012055332981789664, -1.492565035840625e-05,
         1.6462114365889248e-06, -1.6365844691234924e-07, 1.4807192815879218e-08, -1.2290555301717928e-09,
         9.422759064650411e-11, -6.7113668551641105e-12, 4.4632242632864775e-13, -2.7835162072109215e-14,
         1.6342614095367152e-15, -9.063970842808673e-17, 4.763348040515068e-18, -2.3784598852774293e-19,
         1.131218725924631e-20, -5.136209054585811e-22, 2.2308786802746453e-23, -9.28672901131906e-25,
         3.71153285316323e-26, -1.4263930180784176e-27, 5.279103332510834e-29, -1.8841244217042036e-30,
         6.492909974544561e-32, -2.1630383901171243e-33, 6.973730328792914e-35, -2.1781748594796097e-36,
         6.597356545539203e-38, -1.9395213725013487e-39)
ERF_SPLIT = 2.0
# erfc on x >= 2: e^(-x^2)/sqrt(pi) / (x + (1/2)/(x + (2/2)/(x + (3/2)/(x + ...)))), 72 levels,
# evaluated from the innermost level out.
ERFC_CF_TERMS = 72
INV_SQRT_PI = 0.5641895835477563
ERFC_ZERO = 27.5                  # erfc(x) < 2^-1074 beyond: exactly 0 (and erf exactly +-1)

# sin/cos: x = k pi/2 + r (three-part Cody-Waite), |r| <= pi/4, Taylor to r^17 / r^18.
TWO_OVER_PI = 0.6366197723675814
PIO2_1 = 1.5707963267341256       # 0x1.921fb54400000p+0, 33 bits: k * PIO2_1 exact for |k| < 2^20
PIO2_2 = 6.077100506506192e-11
PIO2_3 = 2.0222662487111665e-21
SIN_C = (1.0, -0.16666666666666666, 0.008333333333333333, -0.0001984126984126984, 2.7557319223985893e-06,
         -2.505210838544172e-08, 1.6059043836821613e-10, -7.647163731819816e-13, 2.8114572543455206e-15)
COS_C = (1.0, -0.5, 0.041666666666666664, -0.001388888888888889, 2.48015873015873e-05,
         -2.755731922398589e-07, 2.08767569878681e-09, -1.1470745597729725e-11, 4.779477332387385e-14,
         -1.5619206968586225e-16)
TRIG_MAX = 1048576.0               # 2^20: the reduction is exact-step only below this |x|

# GELU
SQRT_2_OVER_PI = 0.7978845608028654
GELU_A = 0.044715
INV_SQRT2 = 0.7071067811865476
INV_SQRT_2PI = 0.3989422804014327


def _c(v: float, like: torch.Tensor) -> torch.Tensor:
    return torch.full((), v, dtype=F64, device=like.device)


def _horner(coeffs, y: torch.Tensor) -> torch.Tensor:
    """sum c_n y^n by Horner from the highest degree down: p = p * y + c_n (separate mul, add)."""
    p = torch.full_like(y, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = p * y + c
    return p


def _nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), torch.zeros_like(x), x)


def _scale_pow2(p: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """p * 2^k for k in [-1080, 1030] as two exact power-of-two products (only the second can
    round, into float64's subnormal range or to inf)."""
    k = k.to(torch.int64)
    k1 = torch.div(k, 2, rounding_mode="floor")
    k2 = k - k1
    def p2(e):
        return torch.bitwise_left_shift(e + 1023, 52).view(F64)
    return (p * p2(k1)) * p2(k2)


# --- float64 algorithms (inputs float64, outputs float64, NaN in -> NaN out) ------------------


def exp_f64(x: torch.Tensor) -> torch.Tensor:
    xc = torch.clamp(_nan_to_zero(x), EXP_LO, EXP_HI)
    k = torch.round(xc * INV_LN2)
    r = (xc - k * LN2_HI) - k * LN2_LO
    y = _scale_pow2(_horner(EXP_C, r), k)
    return torch.where(torch.isnan(x), x, y)


def expm1_f64(x: torch.Tensor) -> torch.Tensor:
    x0 = _nan_to_zero(x)
    small = x0 * _horner(EXPM1_C, x0)
    big = exp_f64(x0) - 1.0
    y = torch.where(torch.abs(x0) < EXPM1_SMALL, small, big)
    return torch.where(torch.isnan(x), x, y)


def log_f64(x: torch.Tensor) -> torch.Tensor:
    pos = (x > 0) & torch.isfinite(x)
    xs = torch.where(pos, x, torch.ones_like(x))
    m, e = torch.frexp(xs)
    e = e.to(F64)
    low = m < SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = torch.where(low, e - 1.0, e)
    s = (m - 1.0) / (m + 1.0)
    w = s * s
    lm = (2.0 * s) * _horner(LOG_C, w)
    y = (e * LN2_LO + lm) + e * LN2_HI
    inf = _c(math.inf, x)
    y = torch.where(x == 0, -inf, y)
    y = torch.where(x == math.inf, inf, y)
    y = torch.where((x < 0) | torch.isnan(x), _c(math.nan, x), y)
    return y


def tanh_f64(x: torch.Tensor) -> torch.Tensor:
    a = torch.clamp(torch.abs(_nan_to_zero(x)), max=40.0)
    em1 = expm1_f64(a * 2.0)
    t = em1 / (em1 + 2.0)
    y = torch.copysign(t, x)
    return torch.where(torch.isnan(x), x, y)


def _erf_small(a: torch.Tensor) -> torch.Tensor:
    return a * _horner(ERF_C, a * a)


def _erfc_large(a: torch.Tensor) -> torch.Tensor:
    """erfc(a) for a >= 2 by the continued fraction (a clamped to [2, ERFC_ZERO])."""
    a = torch.clamp(a, ERF_SPLIT, ERFC_ZERO)
    f = a
    for n in range(ERFC_CF_TERMS, 0, -1):
        f = a + torch.div(_c(n * 0.5, a), f)  # tensor / tensor: `scalar / t` is reciprocal * scalar
    return exp_f64(-(a * a)) * INV_SQRT_PI / f


def erfc_f64(x: torch.Tensor) -> torch.Tensor:
    x0 = _nan_to_zero(x)
    a = torch.abs(x0)
    small = a < ERF_SPLIT
    es = _erf_small(torch.where(small, a, torch.zeros_like(a)))
    cl = _erfc_large(a)
    cl = torch.where(a >= ERFC_ZERO, torch.zeros_like(cl), cl)
    pos = torch.where(small, 1.0 - es, cl)          # erfc(|x|)
    neg = torch.where(small, 1.0 + es, 2.0 - cl)    # erfc(-|x|)
    y = torch.where(x0 < 0, neg, pos)
    return torch.where(torch.isnan(x), x, y)


def erf_f64(x: torch.Tensor) -> torch.Tensor:
    x0 = _nan_to_zero(x)
    a = torch.abs(x0)
    small = a < ERF_SPLIT
    es = _erf_small(torch.where(small, a, torch.zeros_like(a)))
    cl = _erfc_large(a)
    cl = torch.where(a >= ERFC_ZERO, torch.zeros_like(cl), cl)
    y = torch.copysign(torch.where(small, es, 1.0 - cl), x0)
    return torch.where(torch.isnan(x), x, y)


def _trig_reduce(x: torch.Tensor):
    x0 = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    k = torch.round(x0 * TWO_OVER_PI)
    r = ((x0 - k * PIO2_1) - k * PIO2_2) - k * PIO2_3
    q = torch.remainder(k.to(torch.int64), 4)
    w = r * r
    s = r * _horner(SIN_C, w)
    c = _horner(COS_C, w)
    return q, s, c


def sin_f64(x: torch.Tensor) -> torch.Tensor:
    """sin for |x| <= 2^20 (larger finite x: still deterministic, less accurate); inf, NaN -> NaN."""
    q, s, c = _trig_reduce(x)
    y = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    y = torch.where(x == 0, x, y)  # keeps the sign of zero
    return torch.where(torch.isfinite(x), y, _c(math.nan, x))


def cos_f64(x: torch.Tensor) -> torch.Tensor:
    q, s, c = _trig_reduce(x)
    y = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    return torch.where(torch.isfinite(x), y, _c(math.nan, x))


# --- GELU in float64 -------------------------------------------------------------------------


def gelu_tanh_f64(x: torch.Tensor):
    """(y, h, up) with h = 1 + tanh(u) = 2 / (1 + e^(-2u)), u = c (x + a x^3), up = du/dx."""
    x2 = x * x
    u = SQRT_2_OVER_PI * (x + GELU_A * (x2 * x))
    h = torch.div(_c(2.0, x), 1.0 + exp_f64(-2.0 * u))
    return 0.5 * x * h, h, x2


def gelu_tanh_grad_f64(x: torch.Tensor) -> torch.Tensor:
    """d/dx [x h/2] = h/2 + (x/2) h (2 - h) c (1 + 3a x^2)."""
    _, h, x2 = gelu_tanh_f64(x)
    up = SQRT_2_OVER_PI * (1.0 + (3.0 * GELU_A) * x2)
    return 0.5 * h + ((0.5 * x) * (h * (2.0 - h))) * up


def gelu_erf_f64(x: torch.Tensor) -> torch.Tensor:
    """x/2 erfc(-x/sqrt 2): accurate for large negative x, where 1 + erf would cancel."""
    return (0.5 * x) * erfc_f64(-(x * INV_SQRT2))


def gelu_erf_grad_f64(x: torch.Tensor) -> torch.Tensor:
    """erfc(-x/sqrt 2)/2 + x e^(-x^2/2) / sqrt(2 pi)."""
    return 0.5 * erfc_f64(-(x * INV_SQRT2)) + (x * exp_f64(-0.5 * (x * x))) * INV_SQRT_2PI


# --- sigmoid and SiLU in float64 ------------------------------------------------------------


def _sigmoid_parts(x: torch.Tensor):
    """(s, u) = (sigmoid x, 1 - sigmoid x) without overflow or cancellation: t = exp(-|x|),
    s = 1/(1+t), u = t/(1+t) for x >= 0 and the two swapped for x < 0. NaN in -> NaN out."""
    t = exp_f64(-torch.abs(x))
    d = 1.0 + t
    big = torch.div(_c(1.0, x), d)
    small = t / d
    pos = x >= 0
    return torch.where(pos, big, small), torch.where(pos, small, big)


def sigmoid_f64(x: torch.Tensor) -> torch.Tensor:
    return _sigmoid_parts(x)[0]


def silu_f64(x: torch.Tensor) -> torch.Tensor:
    """x sigmoid(x); silu(-inf) = -0 (its limit), silu(+inf) = +inf."""
    y = x * sigmoid_f64(x)
    return torch.where(x == -math.inf, _c(-0.0, x), y)


def silu_grad_f64(x: torch.Tensor) -> torch.Tensor:
    """d/dx [x s] = s (1 + x u) with u = 1 - s; the limits 1 at +inf and 0 at -inf."""
    s, u = _sigmoid_parts(x)
    d = s * (1.0 + x * u)
    return torch.where(x == math.inf, _c(1.0, x), torch.where(x == -math.inf, _c(0.0, x), d))


# --- rotary position embeddings ----------------------------------------------------------------

ROPE_MAX_POSITIONS = 1 << 20  # angles stay below 2^20, where sin64/cos64 reduce exactly


def rope_inv_freq_f64(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """inv_freq_i = exp64(-(RN64(2i / D) * log64(theta))) for i = 0 .. D/2 - 1 (float64)."""
    two_i = torch.arange(0, head_dim, 2, dtype=F64, device=device)
    a = two_i / torch.full((), float(head_dim), dtype=F64, device=device)
    lt = log_f64(torch.full((), float(theta), dtype=F64, device=device))
    return exp_f64(-(a * lt))


def rope_tables(n_pos: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), float32 [n_pos, D/2]: angle(p, i) = RN64(p * inv_freq_i) for positions
    p = 0 .. n_pos - 1, then RN32(cos64(angle)) and RN32(sin64(angle))."""
    inv = rope_inv_freq_f64(head_dim, theta, device)
    pos = torch.arange(n_pos, dtype=F64, device=device).reshape(n_pos, 1)
    ang = pos * inv.reshape(1, -1)
    return canon_nan(cos_f64(ang).to(F32)), canon_nan(sin_f64(ang).to(F32))


# --- float32 in, float32 out (one rounding), canonical NaN -----------------------------------


def _f32(fn, x: torch.Tensor) -> torch.Tensor:
    return canon_nan(fn(x.to(F64)).to(F32))


def exp32(x):
    return _f32(exp_f64, x)


def log32(x):
    return _f32(log_f64, x)


def tanh32(x):
    return _f32(tanh_f64, x)


def erf32(x):
    return _f32(erf_f64, x)


def sin32(x):
    return _f32(sin_f64, x)


def cos32(x):
    return _f32(cos_f64, x)


def gelu32(x, form: str):
    """GELU rounded once; the infinities take their limits: gelu(inf) = inf, gelu(-inf) = -0."""
    x64 = x.to(F64)
    y = gelu_tanh_f64(x64)[0] if form == "tanh" else gelu_erf_f64(x64)
    y = torch.where(x64 == -math.inf, _c(-0.0, x64), y)
    return canon_nan(y.to(F32))


def gelu_grad32(x, g, form: str):
    """float32 of g * gelu'(x), the product taken in float64 and rounded once; gelu'(inf) = 1,
    gelu'(-inf) = 0 (their limits)."""
    x64 = x.to(F64)
    d = gelu_tanh_grad_f64(x64) if form == "tanh" else gelu_erf_grad_f64(x64)
    d = torch.where(x64 == math.inf, _c(1.0, x64), torch.where(x64 == -math.inf, _c(0.0, x64), d))
    return canon_nan((g.to(F64) * d).to(F32))


def sigmoid32(x):
    return _f32(sigmoid_f64, x)


def sigmoid_grad32(x, g):
    """RN32(f64(g) * (s * u)), s = sigmoid x, u = 1 - s (from x, not from the rounded output)."""
    s, u = _sigmoid_parts(x.to(F64))
    return canon_nan((g.to(F64) * (s * u)).to(F32))


def silu32(x):
    return _f32(silu_f64, x)


def silu_grad32(x, g):
    """RN32(f64(g) * silu'(x)), the derivative in float64."""
    return canon_nan((g.to(F64) * silu_grad_f64(x.to(F64))).to(F32))
