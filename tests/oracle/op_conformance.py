"""Op-level conformance of the stock torch operations exact-v1 allows (oracle.exact.allowed_ops):
each is compared result for result with a reference correct by construction, on random and edge
inputs, contiguous and strided. Run as a child process per ATEN_CPU_CAPABILITY by
tests/oracle/test_op_conformance.py; prints one JSON object.

    python -m tests.oracle.op_conformance

References: numpy's float64 operations (the hardware's IEEE instructions), float32 ones as RN32
of the float64 result (innocuous double rounding for + - * / sqrt: 53 >= 2*24 + 2), numpy int64
arithmetic, spot checks against Python floats, fractions and integers.
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction

import numpy as np
import torch

from oracle.exact import kernels
from oracle.exact import sqrt as xsqrt
from oracle.exact.quant import fraction_to_f32

N = 1 << 16
F32, F64, I64 = torch.float32, torch.float64, torch.int64


# --- inputs ------------------------------------------------------------------------------------


def _edges(dt) -> np.ndarray:
    fi = np.finfo(dt)
    v = [
        0.0,
        1.0,
        1.5,
        2.0,
        3.0,
        0.5,
        1e-3,
        7.0,
        1e10,
        float(fi.max),
        float(fi.tiny),
        float(fi.smallest_subnormal),
        float(fi.smallest_subnormal) * 3,
        float(fi.tiny) - float(fi.smallest_subnormal),
        float(fi.eps),
        math.inf,
        math.nan,
        0.1,
        1.0 / 3.0,
        2.5,
        0.75,
    ]
    a = np.array(v, dtype=dt)
    with np.errstate(over="ignore"):
        a = np.concatenate([a, np.nextafter(a, dt(np.inf)), np.nextafter(a, dt(0))])
    return np.concatenate([a, -a])


def float_inputs(dt, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two operand arrays: every pair of edge values, random bit patterns (all exponents, both
    signs, subnormals), and nearby random values (where rounding decides every bit)."""
    g = np.random.default_rng(seed)
    e = _edges(dt)
    ea, eb = np.repeat(e, len(e)), np.tile(e, len(e))
    ity = np.uint32 if dt == np.float32 else np.uint64
    top = 0xFF800000 if dt == np.float32 else 0xFFF0000000000000

    def bits(n):
        return (g.integers(0, top, n, dtype=np.uint64, endpoint=False).astype(ity)).view(dt)

    def near(n):
        return (g.standard_normal(n) * np.exp(g.uniform(-20, 20, n))).astype(dt)

    h = N // 2
    a = np.concatenate([ea, bits(h), near(h)])
    b = np.concatenate([eb, bits(h), near(h) * dt(1.0 + 2.0**-10)])
    return a, b


def int_inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    a = np.concatenate([g.integers(0, 2**32, N), g.integers(-(2**31), 2**31, N), [0, 1, -1, 2**32 - 1]])
    b = np.concatenate([g.integers(0, 2**31, N), g.integers(-(2**15), 2**15, N), [1, -1, 3, 2**16]])
    return a.astype(np.int64), b.astype(np.int64)


def layout(a: np.ndarray, strided: bool) -> torch.Tensor:
    """a as a tensor: contiguous, or every second element of a buffer twice as long."""
    if not strided:
        return torch.from_numpy(a.copy())
    buf = np.zeros(2 * len(a), dtype=a.dtype)
    buf[::2] = a
    t = torch.from_numpy(buf)[::2]
    assert t.stride() == (2,)
    return t


def _np(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy()


def mismatches(got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bits differ (any NaN matches any NaN: exact-v1 makes NaNs canonical)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    if got.dtype.kind == "f":
        ity = {4: np.int32, 8: np.int64}[got.dtype.itemsize]
        same = got.view(ity) == want.view(ity)
        return int(np.count_nonzero(~(same | (np.isnan(got) & np.isnan(want)))))
    return int(np.count_nonzero(got != want))


# --- cases: name -> (names of oracle.exact.allowed_ops they check, fn(strided) -> [(got, want)]) --

CASES: dict[str, tuple[tuple[str, ...], object]] = {}


def case(name: str, *covers: str):
    def deco(fn):
        CASES[name] = (covers, fn)
        return fn
    return deco


def _f64(x):
    return x.astype(np.float64)


for _dt, _tdt, _sfx in ((np.float32, F32, "f32"), (np.float64, F64, "f64")):
    def _binary(dt=_dt, sfx=_sfx):
        def ops(strided):
            a, b = float_inputs(dt, 1 if dt == np.float32 else 2)
            x, y = layout(a, strided), layout(b, strided)
            wide = dt == np.float32

            def ref(f):
                with np.errstate(all="ignore"):
                    return (f(_f64(a), _f64(b)).astype(dt)) if wide else f(a, b)
            return [
                (_np(x + y), ref(np.add)),
                (_np(x.add(y)), ref(np.add)),
                (_np(x.clone().add_(y)), ref(np.add)),
                (_np(x - y), ref(np.subtract)),
                (_np(x.clone().sub_(y)), ref(np.subtract)),
                (_np(x * y), ref(np.multiply)),
                (_np(torch.mul(x, y)), ref(np.multiply)),
                (_np(x.clone().mul_(y)), ref(np.multiply)),
                (_np(x.mul(y)), ref(np.multiply)),
                (_np(x / y), ref(np.divide)),
                (_np(torch.div(x, y)), ref(np.divide)),
                (_np(torch.copysign(x, y)), np.copysign(a, b)),
            ]
        return ops
    case(f"arith_{_sfx}", "+", "-", "*", "/", "add", "add_", "sub_", "mul", "mul_", "torch.mul", "torch.div",
         "torch.copysign")(_binary())

    def _unary(dt=_dt):
        def ops(strided):
            a, _ = float_inputs(dt, 3)
            x = layout(a, strided)
            fin = np.isfinite(a)
            xf = layout(a[fin], strided)
            m, e = np.frexp(a[fin])
            tm, te = torch.frexp(xf)
            with np.errstate(all="ignore"):
                lo, hi = (-746.0 if dt == np.float64 else -100.0), 40.0
                return [
                    (_np(-x), -a),
                    (_np(torch.abs(x)), np.abs(a)),
                    (_np(torch.round(x)), np.rint(a)),
                    (_np(x.clone().round_()), np.rint(a)),
                    (_np(x.clone().floor_()), np.floor(a)),
                    (_np(torch.clamp(x, lo, hi)), np.minimum(np.maximum(a, lo), hi)),
                    (_np(torch.clamp(x, max=hi)), np.minimum(a, hi)),
                    (_np(torch.clamp(x, min=lo)), np.maximum(a, lo)),
                    (_np(tm), m),
                    (_np(te).astype(np.int64), e.astype(np.int64)),
                    (_np(torch.isnan(x)), np.isnan(a)),
                    (_np(torch.isfinite(x)), np.isfinite(a)),
                ]
        return ops
    case(f"unary_{_sfx}", "unary -", "torch.abs", "torch.round", "round_", "floor_", "torch.clamp",
         "torch.frexp")(_unary())

    def _compare(dt=_dt):
        def ops(strided):
            a, b = float_inputs(dt, 4)
            x, y = layout(a, strided), layout(b, strided)
            return [(_np(x < y), a < b), (_np(x <= y), a <= b), (_np(x > y), a > b), (_np(x >= y), a >= b),
                    (_np(x == y), a == b), (_np(x != y), a != b)]
        return ops
    case(f"compare_{_sfx}", "< <= > >= == !=")(_compare())

    def _reduce(dt=_dt):
        def ops(strided):
            a, _ = float_inputs(dt, 5)
            n = len(a) // 256 * 256
            rows = a[:n].reshape(-1, 256)
            x = layout(a[:n], strided).reshape(-1, 256)
            fin = a[np.isfinite(a)]
            mn, mx = torch.aminmax(layout(fin, strided))
            return [
                (_np(torch.amax(x, dim=-1)), np.max(rows, axis=-1)),
                (
                    _np(torch.amax(torch.abs(x), dim=-1, keepdim=True)),
                    np.max(np.abs(rows), axis=-1, keepdims=True),
                ),
                (_np(mn), np.min(fin)),
                (_np(mx), np.max(fin)),
            ]
        return ops
    case(f"reduce_{_sfx}", "torch.amax", "torch.aminmax")(_reduce())


@case("scalar_f64", "+", "-", "*", "/")
def _scalar(strided):
    """float64 tensor with a Python float (the exact paths' Horner steps and constants)."""
    a, b = float_inputs(np.float64, 6)
    x = layout(a, strided)
    out = []
    with np.errstate(all="ignore"):
        for c in (0.5, 2.0, 1.4426950408889634, -0.044715, 1e-300, 3.0):
            out += [(_np(x * c), a * c), (_np(x + c), a + c), (_np(x - c), a - c), (_np(c - x), c - a),
                    (_np(x / torch.full((), c, dtype=F64)), a / c)]
    return out


@case("convert", "to")
def _convert(strided):
    a64, _ = float_inputs(np.float64, 7)
    a32, _ = float_inputs(np.float32, 8)
    g = np.random.default_rng(9)
    ints = np.concatenate([g.integers(-(2**62), 2**62, N), g.integers(-(2**53), 2**53, N)]).astype(np.int64)
    whole = np.rint(g.standard_normal(N) * np.exp(g.uniform(0, 40, N)))
    flags = g.integers(0, 2, N).astype(bool)
    with np.errstate(all="ignore"):
        return [
            (_np(layout(a64, strided).to(F32)), a64.astype(np.float32)),
            (_np(layout(a32, strided).to(F64)), a32.astype(np.float64)),
            (_np(layout(ints, strided).to(F64)), ints.astype(np.float64)),
            (_np(layout(whole, strided).to(I64)), whole.astype(np.int64)),
            (_np(layout(flags, strided).to(F64)), flags.astype(np.float64)),
        ]


@case(
    "integer",
    "torch.remainder",
    "torch.bitwise_and",
    "torch.bitwise_left_shift",
    "torch.bitwise_right_shift",
    "torch.div",
    "~, &, ^, bitwise or",
    "<< >>",
    "%",
    "+",
    "-",
    "*",
    "max",
    "min",
)
def _integer(strided):
    a, b = int_inputs(10)
    x, y = layout(a, strided), layout(b, strided)
    sh = np.abs(b) % 31
    s = layout(sh, strided)
    small = a % (1 << 31)
    xs = layout(small, strided)
    nz = np.where(b == 0, 1, b)
    z = layout(nz, strided)
    return [
        (_np(x + y), a + b), (_np(x - y), a - b), (_np(xs * (y & 0xFFFF)), small * (b & 0xFFFF)),
        (_np(x ^ y), a ^ b), (_np(x & y), a & b), (_np(x | y), a | b), (_np(~x), ~a),
        (_np(torch.bitwise_and(x, 0xFFFF)), a & 0xFFFF),
        (_np(xs << s), small << sh), (_np(torch.bitwise_left_shift(xs, s)), small << sh),
        (_np(x >> s), a >> sh), (_np(torch.bitwise_right_shift(x, s)), a >> sh),
        (_np(torch.remainder(x, 4)), np.remainder(a, 4)), (_np(x % z), np.remainder(a, nz)),
        (_np(torch.div(x, z, rounding_mode="floor")), np.floor_divide(a, nz)),
        (np.array(x.max().item()), np.array(a.max())), (np.array(x.min().item()), np.array(a.min())),
    ]


@case("int8_gemm", "torch._int_mm")
def _int8_gemm(strided):
    """int8 x int8 with int32 accumulation, as the slice route uses it (|sum| <= 2^30)."""
    g = np.random.default_rng(12)
    out = []
    for lo, hi, k in ((-64, 65, 512), (-128, 128, 1024)):
        qa = g.integers(lo, hi, (256, k))
        qb = g.integers(lo, hi, (k, 256))
        qa[0, :] = qb[:, 0] = lo  # a row and a column at the extreme digit
        ta = layout(qa.reshape(-1).astype(np.int8), strided).reshape(256, k)
        tb = torch.from_numpy(qb.astype(np.int8)).t().contiguous().t()  # column-major operand
        out.append((_np(torch._int_mm(ta.contiguous(), tb)).astype(np.int64), qa @ qb))
    return out


@case("exact_sums", "torch.sum", "torch.matmul", "index_add_")
def _exact_sums(strided):
    """Integer-valued float64 with every partial sum below 2^53 (as the exact paths keep them)."""
    g = np.random.default_rng(11)
    q = g.integers(-(2**36), 2**36, (64, 1024))            # the whole sum below 2^53
    x = layout(q.reshape(-1).astype(np.float64), strided).reshape(64, 1024)
    qa = g.integers(-(2**21), 2**21, (96, 512))             # 512 * 2^42 = 2^51
    qb = g.integers(-(2**21), 2**21, (512, 80))
    ta = layout(qa.reshape(-1).astype(np.float64), strided).reshape(96, 512)
    tb = torch.from_numpy(qb.astype(np.float64)).t().contiguous().t()  # column-major operand
    rows = g.integers(-(2**40), 2**40, (4096, 48))
    ids = g.integers(0, 100, 4096)
    acc = torch.zeros(100, 48, dtype=F64).index_add_(
        0, torch.from_numpy(ids), torch.from_numpy(rows.astype(np.float64))
    )
    want = np.zeros((100, 48), dtype=np.int64)
    np.add.at(want, ids, rows)
    return [(_np(torch.sum(x, dim=1)).astype(np.int64), q.sum(axis=1)),
            (np.array(torch.sum(x).item()).astype(np.int64), np.array(q.sum())),  # < 2^53 too
            (_np(torch.matmul(ta, tb)).astype(np.int64), qa @ qb),
            (_np(acc).astype(np.int64), want)]


@case("sqrt", "oracle.exact.sqrt")
def _sqrt(strided):
    a64, _ = float_inputs(np.float64, 12)
    a32, _ = float_inputs(np.float32, 13)
    with np.errstate(invalid="ignore"):
        r64, r32 = np.sqrt(a64), np.sqrt(_f64(a32)).astype(np.float32)
    out = [(_np(xsqrt.sqrt64(layout(a64, strided))), r64), (_np(xsqrt.sqrt32(layout(a32, strided))), r32)]
    if kernels.enabled():
        out += [
            (_np(kernels.sqrt(layout(a64, strided))), r64),
            (_np(kernels.sqrt(layout(a32, strided))), r32),
        ]
    return out


def spot_checks() -> int:
    """numpy's float64 references against Python floats and fractions (correct by construction)."""
    bad = 0
    a, b = float_inputs(np.float64, 2)
    a, b = a[-3000:], b[-3000:]
    pa, pb = a.tolist(), b.tolist()
    with np.errstate(all="ignore"):
        for f, py in ((np.add, float.__add__), (np.subtract, float.__sub__), (np.multiply, float.__mul__),
                      (np.divide, lambda u, v: u / v if v else math.nan)):
            want = np.array([py(u, v) for u, v in zip(pa, pb, strict=True)])
            got = f(a, b)
            fin = np.isfinite(want) & (b != 0)
            bad += mismatches(got[fin], want[fin])
        roots = np.sqrt(np.abs(a))
    bad += sum(math.sqrt(abs(u)) != r for u, r in zip(pa, roots.tolist(), strict=True))
    a32, b32 = float_inputs(np.float32, 1)
    for u, v in zip(a32[-800:].tolist(), b32[-800:].tolist(), strict=True):
        if math.isfinite(u) and math.isfinite(v) and v != 0:
            q = np.float32((np.float64(u) / np.float64(v)).astype(np.float32))
            exact = fraction_to_f32(Fraction(u) / Fraction(v))
            if math.isfinite(exact) and float(q) != exact:
                bad += 1
    return bad


def _signed_zeros(n: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.zeros(n)
    return a, -a


CONTROLS = {
    "torch.sqrt_f32": lambda a32, a64, s: (
        _np(torch.sqrt(layout(a32, s))),
        np.sqrt(_f64(a32)).astype(np.float32),
    ),
    "torch.sqrt_f64": lambda a32, a64, s: (_np(torch.sqrt(layout(a64, s))), np.sqrt(a64)),
    # a square root rounded more than once (x * rsqrt(x) in float32) is wrong on every machine:
    # the harness must see it, whatever the libraries do with stock sqrt
    "rsqrt_mul_f32": lambda a32, a64, s: (
        _np(layout(a32, s) * torch.rsqrt(layout(a32, s))),
        np.sqrt(_f64(a32)).astype(np.float32),
    ),
    # IEEE minimum(+0, -0) is -0; torch's depends on the layout, so exact paths select with where
    "torch.minimum_zeros": lambda a32, a64, s: (
        _np(torch.minimum(layout(_signed_zeros(N)[0], s), layout(_signed_zeros(N)[1], s))),
        _signed_zeros(N)[1],
    ),
}


def run() -> dict:
    res: dict = {"capability": torch.backends.cpu.get_cpu_capability(), "mismatches": {}, "elements": {},
                 "controls": {}}
    warnings.simplefilter("ignore")
    for name, (_, fn) in CASES.items():
        for strided in (False, True):
            key = f"{name}{'_strided' if strided else ''}"
            pairs = fn(strided)
            res["mismatches"][key] = sum(mismatches(g, w) for g, w in pairs)
            res["elements"][key] = sum(int(np.asarray(w).size) for _, w in pairs)
    res["spot_checks"] = spot_checks()
    g = np.random.default_rng(14)
    a32 = (g.random(N) * 100).astype(np.float32)
    a64 = g.random(N) * 100
    for name, fn in CONTROLS.items():
        for strided in (False, True):
            res["controls"][f"{name}{'_strided' if strided else ''}"] = mismatches(*fn(a32, a64, strided))
    return res


if __name__ == "__main__":
    print(json.dumps(run()))
