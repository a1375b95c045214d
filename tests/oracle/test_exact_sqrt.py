"""The correctly rounded square root of exact-v1 (oracle.exact.sqrt and its CPU kernel): equal,
result for result, to Python's math.sqrt and numpy's sqrt (both correctly rounded), on edge cases
and random inputs; the kernel equals the eager form; the conformance vectors hold for both."""

from __future__ import annotations

import json
import math
import platform
from fractions import Fraction

import numpy as np
import pytest
import torch

from oracle.exact import kernels, ops
from oracle.exact import sqrt as xsqrt
from tests.oracle.vectors.make_vectors import PATH, sqrt_inputs32, sqrt_inputs64, unhx

DOC = json.loads(PATH.read_text())
NAN64, NAN32 = 0x7FF8000000000000, 0x7FC00000


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous()
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32).numpy()


def _ref64(x: np.ndarray) -> np.ndarray:
    """numpy's sqrt (the hardware instruction), NaN made canonical as exact-v1 does."""
    with np.errstate(invalid="ignore"):
        r = np.sqrt(x)
    r[np.isnan(r)] = np.nan
    return r


def _random64(n: int, seed: int) -> torch.Tensor:
    g = np.random.default_rng(seed)
    return torch.from_numpy(g.integers(0, 0x7FF0000000000000, n, dtype=np.int64).view(np.float64))


def _random32(n: int, seed: int) -> torch.Tensor:
    g = np.random.default_rng(seed)
    return torch.from_numpy(g.integers(0, 0x7F800000, n, dtype=np.int64).astype(np.int32).view(np.float32))


def _impls():
    out = [("eager", xsqrt.sqrt64, xsqrt.sqrt32)]
    if kernels.enabled():
        out.append(("kernel", kernels.sqrt, kernels.sqrt))
    return out


@pytest.mark.parametrize("name,f64,f32", _impls())
def test_equals_numpy_and_math_sqrt(name, f64, f32):
    x = torch.cat([sqrt_inputs64(), _random64(1 << 16, 1)])
    got = _bits(f64(x))
    assert (got == _ref64(x.numpy()).view(np.int64)).all(), f"{name} float64 differs from numpy"
    for v, b in zip(x.tolist()[:3000], got[:3000].tolist(), strict=True):
        if v >= 0:
            assert np.int64(b) == np.float64(math.sqrt(v)).view(np.int64), (name, v)
        else:
            assert b == NAN64, (name, v)
    x32 = torch.cat([sqrt_inputs32(), _random32(1 << 16, 2)])
    ref32 = _ref64(x32.numpy().astype(np.float64)).astype(np.float32)  # double rounding innocuous
    assert (_bits(f32(x32)) == ref32.view(np.int32)).all(), f"{name} float32 differs"
    with np.errstate(invalid="ignore"):
        direct = np.sqrt(x32.numpy())
    direct[np.isnan(direct)] = np.nan
    assert (_bits(f32(x32)) == direct.view(np.int32)).all(), f"{name} float32 differs from numpy float32"


def test_special_values():
    x = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, -5e-324, 4.0, 5e-324], dtype=torch.float64
    )
    for _, f64, f32 in _impls():
        y = f64(x)
        assert _bits(y).tolist()[:2] == [0, np.float64(-0.0).view(np.int64)]
        assert y[2].item() == math.inf and y[7].item() == 2.0
        assert (_bits(y)[3:7] == NAN64).all()
        assert y[8].item() == math.sqrt(5e-324)
        y32 = f32(x.float())
        neg0 = np.float32(-0.0).view(np.int32)  # -5e-324 becomes -0 in float32
        assert (_bits(y32)[3:6] == NAN32).all() and _bits(y32)[1] == neg0 and _bits(y32)[6] == neg0


def test_exact_squares_and_their_neighbours_by_fractions():
    """Against the definition: y = RN(sqrt x) iff (y - ulp-/2)^2 < x < (y + ulp/2)^2, in rationals."""
    g = np.random.default_rng(5)
    m = g.integers(2**25, 2**26, 300).astype(np.float64)
    sq = np.concatenate([m * m * 4.0 ** g.integers(-520, 480, 300), m * m * 2.0**-1074])
    sq = sq[(sq > 0) & np.isfinite(sq)]
    x = np.concatenate([sq, np.nextafter(sq, 0), np.nextafter(sq, np.inf)])
    y = xsqrt.sqrt64(torch.from_numpy(x)).numpy()
    for xv, yv in zip(x.tolist(), y.tolist(), strict=True):
        fy, fx = Fraction(yv), Fraction(xv)
        lo = (fy + Fraction(np.nextafter(yv, 0.0))) / 2
        hi = (fy + Fraction(np.nextafter(yv, math.inf))) / 2
        assert lo * lo < fx < hi * hi, xv
    assert (y[: len(sq)] ** 2 == sq).all()  # exact squares have exact roots


def test_largest_values_and_subnormals():
    big = np.array(
        [float.fromhex("0x1.fffffffffffffp+1023"), float.fromhex("0x1.ffffffffffffep+1023"), 2.0**1023]
    )
    tiny = np.array([5e-324, 1e-323, 2.0**-1030, float.fromhex("0x0.fffffffffffffp-1022"), 2.0**-1022])
    x = np.concatenate([big, tiny])
    for _, f64, _f32 in _impls():
        assert (_bits(f64(torch.from_numpy(x))) == _ref64(x).view(np.int64)).all()
    f32max = np.array(
        [np.finfo(np.float32).max, np.float32(1e-45), np.float32(1.1754942e-38)], dtype=np.float32
    )
    assert (_bits(xsqrt.sqrt32(torch.from_numpy(f32max))) == np.sqrt(f32max).view(np.int32)).all()


def test_bad_dtypes_are_refused():
    with pytest.raises(ValueError, match="float64"):
        xsqrt.sqrt64(torch.ones(2))
    with pytest.raises(ValueError, match="float32"):
        xsqrt.sqrt32(torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32 or float64"):
        kernels.sqrt(torch.ones(2, dtype=torch.int64))


def test_kernel_equals_eager_strided_and_shaped():
    x = torch.from_numpy(np.abs(np.random.default_rng(3).standard_normal((64, 48)))).t()  # not contiguous
    assert not x.is_contiguous()
    assert torch.equal(_t64(kernels.sqrt(x)), _t64(xsqrt.sqrt64(x)))
    assert kernels.sqrt(x).shape == x.shape
    assert kernels.sqrt(torch.ones(())).shape == ()


def _t64(t):
    return t.contiguous().view(torch.int64)


# --- conformance vectors ---------------------------------------------------------------------


def test_sqrt_vectors_eager_and_kernel():
    v = DOC["sqrt"]
    x32, x64 = unhx(v["x32"]), unhx(v["x64"])
    assert len(v["x32"]) >= 500 and len(v["x64"]) >= 500
    for name, f64, f32 in _impls():
        assert (_bits(f32(x32)) == _bits(unhx(v["sqrt32"]))).all(), f"{name} sqrt32 vectors"
        assert (_bits(f64(x64)) == _bits(unhx(v["sqrt64"]))).all(), f"{name} sqrt64 vectors"


def test_layer_norm_vectors_eager_and_kernel():
    """Layer norm's rstd takes a binary64 sqrt: the eager form (oracle.exact.sqrt) and the kernel
    (the hardware instruction) give the stored bytes."""
    modes = [kernels.disabled]
    if kernels.enabled():
        modes.append(_Null)
    for case in DOC["layer_norm"]:
        x = unhx(case["x"], case["shape"])
        w = unhx(case["w"]) if "w" in case else None
        b = unhx(case["b"]) if "b" in case else None
        for mode in modes:
            with mode():
                y = ops.layer_norm(x, w, b, case["eps"])
            assert (_bits(y) == _bits(unhx(case["y"], case["shape"]))).all(), (mode, case["shape"])


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_layer_norm_kernel_equals_eager_on_many_rows():
    g = torch.Generator().manual_seed(23)
    x = (torch.randn(512, 96, generator=g) * torch.exp(torch.randn(512, 1, generator=g) * 4)).float()
    w, b = torch.randn(96, generator=g), torch.randn(96, generator=g)
    y = ops.layer_norm(x, w, b)
    with kernels.disabled():
        ye = ops.layer_norm(x, w, b)
    assert torch.equal(y.view(torch.int32), ye.view(torch.int32))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not kernels.enabled(),
                    reason="x86 mnemonic scan of the numba kernels")
def test_sqrt_kernels_use_the_ieee_instruction():
    import numba

    kernels.sqrt(torch.ones(4))
    kernels.sqrt(torch.ones(4, dtype=torch.float64))
    for k in (kernels._sqrt32_k, kernels._sqrt64_k):
        fresh = numba.njit(nogil=True, error_model="numpy")(k.py_func)
        for sig in k.signatures:
            fresh.compile(sig)
            asm = fresh.inspect_asm(sig).lower()
            assert "sqrtsd" in asm or "sqrtpd" in asm or "sqrtss" in asm or "sqrtps" in asm, k
            for mnemonic in ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub"):
                assert mnemonic not in asm


def test_every_float32_in_one_and_four_exhaustively():
    """All 2^24 float32 values in [1, 4): every float32 input reduces to one of them times an
    exact power of four, so this covers the float32 root's rounding for every input."""
    lo, hi = np.float32(1.0).view(np.int32), np.float32(4.0).view(np.int32)
    for start in range(int(lo), int(hi), 1 << 21):
        x = torch.from_numpy(
            np.arange(start, min(start + (1 << 21), int(hi)), dtype=np.int32).view(np.float32)
        )
        want = np.sqrt(x.numpy()).view(np.int32)
        assert (_bits(xsqrt.sqrt32(x)) == want).all()
        if kernels.enabled():
            assert (_bits(kernels.sqrt(x)) == want).all()
