"""The compiled optimizer updates and clipping sum equal the eager definitions bit for bit."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from commitments.spec import OptimizerSpec
from oracle import models, native, optim
from oracle.exact import kernels, ops
from oracle.exact import quant as Q
from tests.oracle.test_exact_gemm_routes import _walk
from tests.oracle.test_step import _spec
from tests.oracle.vectors.edge import edge_values, random_values

pytestmark = pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available")

I32, I64 = torch.int32, torch.int64
F32_MAX = float.fromhex("0x1.fffffep127")


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
    diff = (a.contiguous().view(I32) != b.contiguous().view(I32)).nonzero()
    assert diff.numel() == 0, f"{diff.numel()} elements differ, first at {diff[:5].tolist()}"


def _f32_from_bits(words) -> torch.Tensor:
    return torch.from_numpy(np.array(words, dtype=np.uint32).view(np.float32).copy())


# NaNs with odd payloads and signs, a signalling one among them
ODD_NANS = _f32_from_bits([0xFFC01234, 0x7F800001, 0x7FA00000, 0xFFFFFFFF, 0x7FC00000])


def _finite_edges() -> torch.Tensor:
    e = edge_values()
    return e[torch.isfinite(e)]


def _combos(*cols: torch.Tensor) -> list[torch.Tensor]:
    """Every combination of the columns' values (a full grid), flattened."""
    grids = torch.meshgrid(*cols, indexing="ij")
    return [gr.reshape(-1).contiguous() for gr in grids]


def _hypers(t: int, wd: float, kind: str = "adamw"):
    spec = OptimizerSpec(kind=kind, lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=wd, momentum=0.9)
    return optim.Hyper.of(spec, t, "cpu")


def _eager(fn, *args):
    with kernels.disabled():
        return fn(*args)


ADAM_CASES = [(t, wd, d) for t in (1, 1000) for wd in (0.0, 0.1) for d in (False, True)]


def _adam_inputs():
    """(p, g, m, v) sets: random values of wide exponents (the parallel path too), the grid of
    finite edge values (zeros, subnormals, ties, the largest floats: g*g overflows, v = 0 so the
    denominator is eps), and sets holding inf and NaN with odd payloads."""
    r = [random_values(150_000, s) for s in range(4)]
    yield "random", r[0], r[1], r[2], torch.abs(r[3])
    f = _finite_edges()
    small = f[:: 3]
    vpos = torch.cat([torch.abs(small[:12]), torch.tensor([0.0, 1e-45, F32_MAX])])
    p, g, m, v = _combos(small[:20], small, small[:15], vpos)
    yield "finite-edge-grid", p, g, m, v
    z = torch.zeros(4096)
    yield "v=0", random_values(2048, 7), torch.zeros(4096), random_values(2048, 8), z
    yield "huge-g", random_values(2048, 9), torch.full((4096,), F32_MAX), z, z
    e = torch.cat([edge_values(), ODD_NANS])
    n = e.numel()
    rp = random_values(n // 2 + 1, 10)[:n]
    for i, name in enumerate("pgmv"):
        vals = [rp, rp.flip(0), rp.roll(3), torch.abs(rp)]
        vals[i] = e if name != "v" else torch.cat([torch.abs(e[:-len(ODD_NANS)]), ODD_NANS])
        yield f"nonfinite-{name}", *vals
    yield "negative-v", rp, rp, rp, -torch.abs(rp)


@pytest.mark.parametrize(("t", "wd", "decay"), ADAM_CASES)
def test_adamw_kernel_equals_eager(t, wd, decay):
    hp = _hypers(t, wd)
    for name, p, g, m, v in _adam_inputs():
        got = optim.adamw(p, g, m, v, hp, decay)
        want = _eager(optim.adamw, p, g, m, v, hp, decay)
        for a, b in zip(got, want, strict=True):
            _bits_equal(a, b)
        raw = kernels.adamw(p, g, m, v, hp, decay)
        nan = torch.isnan(want[0]) | torch.isnan(want[1]) | torch.isnan(want[2])
        assert (raw is None) == bool(nan.any()), name  # NaN: the eager code runs for this tensor
        # the kernel itself on every element whose outputs hold no NaN
        ok = ~nan
        sub = [x[ok].contiguous() for x in (p, g, m, v)]
        raw = kernels.adamw(*sub, hp, decay)
        assert raw is not None, name
        for a, b in zip(raw, want, strict=True):
            _bits_equal(a, b[ok])
    # inputs are not modified, outputs are new tensors
    p, g, m, v = (random_values(500, s) for s in range(4))
    keep = [x.clone() for x in (p, g, m, v)]
    out = optim.adamw(p, g, m, v, hp, decay)
    assert all(torch.equal(a.view(I32), b.view(I32)) for a, b in zip((p, g, m, v), keep, strict=True))
    assert not any(o.data_ptr() == x.data_ptr() for o in out for x in (p, g, m, v))


def test_adamw_edge_grid_reaches_the_edges():
    """The finite edge grid exercises what it should: overflowing g*g, v = 0 (denominator eps),
    signed zeros and subnormals in the outputs the kernel computes itself."""
    hp = _hypers(1000, 0.1)
    _, p, g, m, v = list(_adam_inputs())[1]
    want = _eager(optim.adamw, p, g, m, v, hp, True)
    ok = ~(torch.isnan(want[0]) | torch.isnan(want[1]) | torch.isnan(want[2]))
    assert int(ok.sum()) > 0.9 * ok.numel()
    out = kernels.adamw(*(x[ok].contiguous() for x in (p, g, m, v)), hp, True)
    assert bool(torch.isinf(out[2]).any())  # some g*g overflowed
    assert bool((out[2] == 0).any())
    neg0 = torch.tensor(-0.0).view(I32)
    assert bool((out[0].view(I32) == neg0).any()) and bool((out[1].view(I32) == neg0).any())
    tiny = (out[0] != 0) & (out[0].abs() < 1.17549435e-38)
    assert bool(tiny.any())


@pytest.mark.parametrize(("wd", "decay"), [(0.0, True), (0.01, False), (0.01, True)])
def test_sgd_kernel_equals_eager(wd, decay):
    for t in (1, 1000):
        hp = _hypers(t, wd, "sgd")
        for name, p, g, m, _ in _adam_inputs():
            got = optim.sgd(p, g, m, hp, decay)
            want = _eager(optim.sgd, p, g, m, hp, decay)
            for a, b in zip(got, want, strict=True):
                _bits_equal(a, b)
            raw = kernels.sgd(p, g, m, hp, decay)
            nan = torch.isnan(want[0]) | torch.isnan(want[1])
            assert (raw is None) == bool(nan.any()), name
            ok = ~nan
            raw = kernels.sgd(p[ok].contiguous(), g[ok].contiguous(), m[ok].contiguous(), hp, decay)
            assert raw is not None, name
            for a, b in zip(raw, want, strict=True):
                _bits_equal(a, b[ok])


def test_update_dispatch_falls_back_for_other_layouts():
    hp = _hypers(3, 0.1)
    p, g, m, v = (random_values(300, s).reshape(20, 30) for s in range(4))
    pt = p.t()  # not contiguous: the eager code runs
    got = optim.adamw(pt, g.t(), m.t(), v.abs().t(), hp, True)
    want = _eager(optim.adamw, pt, g.t(), m.t(), v.abs().t(), hp, True)
    for a, b in zip(got, want, strict=True):
        _bits_equal(a, b)
    pr = p.clone().requires_grad_(True)  # an autograd graph to record: eager
    out = optim.adamw(pr, g, m, v.abs(), hp, True)
    assert out[0].requires_grad


# --- the clipping sum ----------------------------------------------------------------------------


def _eager_chunk_terms(flat: torch.Tensor) -> list[tuple[int, int]]:
    """ops.sum_of_squares's terms of one finite tensor, by its eager code."""
    sq = flat.to(torch.float64) * flat.to(torch.float64)
    pad = (-sq.numel()) % ops.SOS_CHUNK
    sq = torch.cat([sq, torch.zeros(pad, dtype=torch.float64)])
    s = Q.sum_bits(ops.SOS_CHUNK)
    q, e = Q.quantise(sq.reshape(-1, ops.SOS_CHUNK), 1, s)
    return [(int(n), int(x)) for n, x in zip(torch.sum(q, dim=1).tolist(), (e.squeeze(1) - s).tolist(),
                                              strict=True) if n]


def _sos_lists():
    g = torch.Generator().manual_seed(41)
    wide = lambda n: (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 12)).float()  # noqa: E731
    ties = torch.zeros(70000)
    ties[:3] = torch.tensor([1.5, 3 * 2.0**-18, 5 * 2.0**-18])  # squares 4.5 and 12.5 units at s = 37: ties
    yield "sizes", [wide(n) for n in (1, 65535, 65536, 65537, 200003, 3 * 65536)]
    yield "empty", [torch.zeros(0), torch.randn(7, generator=g), torch.zeros(0, 5)]
    yield "all-zero", [torch.zeros(100), torch.zeros(70000), -torch.zeros(3)]
    yield "only-empty", [torch.zeros(0)]
    yield "subnormal", [torch.full((1000,), 1e-45), torch.tensor([2.0**-149, -(2.0**-126), 1e-40])]
    yield "subnormal+normal", [torch.tensor([1e-45, 1.0, -1e-40] * 30000)]
    yield "huge", [torch.full((5,), F32_MAX), torch.randn(100, generator=g)]
    yield "ties", [ties, torch.tensor([1.0, 2.0**-19])]
    yield "wide-2d", [wide(300 * 700).reshape(300, 700), wide(64).reshape(8, 8)[:, ::2]]
    yield "inf", [wide(1000), torch.tensor([1.0, -math.inf]), wide(70000)]
    yield "nan", [wide(1000), torch.cat([wide(70000), ODD_NANS]), torch.tensor([math.inf])]
    yield "nan-late", [torch.tensor([math.inf]), wide(10), torch.cat([torch.zeros(65536), ODD_NANS[:1]])]
    yield "edges", [edge_values(), _finite_edges()]


def test_sum_of_squares_kernel_equals_eager():
    for name, ts in _sos_lists():
        got = ops.sum_of_squares(ts)
        want = _eager(ops.sum_of_squares, ts)
        assert got.view(I32).item() == want.view(I32).item(), name
    assert math.isnan(ops.sum_of_squares(next(x for n, x in _sos_lists() if n == "nan")).item())
    assert ops.sum_of_squares(next(x for n, x in _sos_lists() if n == "inf")).item() == math.inf
    assert ops.sum_of_squares(next(x for n, x in _sos_lists() if n == "huge")).item() == math.inf


def test_sum_of_squares_chunk_terms_equal_eager():
    s = Q.sum_bits(ops.SOS_CHUNK)
    assert s == 37
    for name, ts in _sos_lists():
        for t in ts:
            flat = t.reshape(-1)
            if not flat.numel():
                continue
            bad, terms = kernels.sum_of_squares_chunks(flat, ops.SOS_CHUNK, s)
            sq = flat.double() * flat.double()
            if not bool(torch.isfinite(sq).all()):
                assert bad == ("nan" if bool(torch.isnan(sq).any()) else "inf") and terms == [], name
                continue
            assert bad is None and terms == _eager_chunk_terms(flat), name
    # the ties round to even: 4.5 -> 4, 12.5 -> 12 units of 2^(2 - 37)
    ties = next(x for n, x in _sos_lists() if n == "ties")[0]
    (n, e), = kernels.sum_of_squares_chunks(ties[:3], ops.SOS_CHUNK, s)[1]
    assert e == 2 - 37 and n == int(2.25 * 2**35) + 4 + 12


# --- clipping -------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", [ops, native], ids=["exact", "native"])
def test_clip_equals_eager(namespace):
    g = torch.Generator().manual_seed(43)
    base = [torch.randn(300, 70, generator=g), torch.randn(70, generator=g) * 1e-30, torch.zeros(0)]
    cases = {
        "clipped": (base, 1.0),
        "coef-1": ([x * 1e-4 for x in base], 1.0),
        "coef-1-signed-zeros-subnormals": ([torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 1e-38])], 1.0),
        "inf": (base + [torch.tensor([math.inf])], 1.0),
        "nan": (base + [ODD_NANS.clone()], 1.0),
        "huge": ([torch.full((3,), F32_MAX)], 1.0),
        "off": (base, 0.0),
        "max-norm-inf": (base, math.inf),
    }
    for name, (grads, c) in cases.items():
        got, norm = optim.clip(namespace, grads, c)
        want, wnorm = _eager(optim.clip, namespace, grads, c)
        _bits_equal(norm, wnorm)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _bits_equal(a, b)
        if name.startswith("coef-1"):
            assert all(a is b for a, b in zip(got, grads, strict=True)), name  # no pass over them


# --- whole steps -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("over", [
    {},
    {"optimizer": {"grad_clip": 1e6}},
    {"optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "grad_clip": 0.5}},
], ids=["adamw-clipped", "adamw-coef-1", "sgd"])
def test_three_step_walk_same_digests_with_and_without_kernels(over, monkeypatch):
    spec = _spec(**over)
    ran = {"adamw": 0, "sgd": 0, "sum_of_squares_chunks": 0}

    def counting(name):
        fn = getattr(kernels, name)

        def call(*a, **k):
            out = fn(*a, **k)
            ran[name] += out is not None and (name != "sum_of_squares_chunks" or out[0] is None)
            return out
        return call

    for name in ran:
        monkeypatch.setattr(kernels, name, counting(name))
    fast = _walk(spec, 3)
    n_params = len(models.build(spec.model).param_specs())
    assert ran[spec.optimizer.kind] == 3 * n_params and ran["sum_of_squares_chunks"] == 3 * n_params
    with kernels.disabled():
        slow = _walk(spec, 3)
    assert fast == slow


# --- the machine code: float32 operations only, no fused multiply-add ------------------------------

OPT_KERNELS = ("_adamw_k", "_sgd_k", "_sos_chunks_k")


def _compile_all():
    hp = _hypers(2, 0.1)
    x = random_values(100, 3)
    kernels.adamw(x, x, x, x.abs(), hp, True)
    kernels.sgd(x, x, x, _hypers(2, 0.1, "sgd"), True)
    kernels.sum_of_squares_chunks(x, ops.SOS_CHUNK, 37)
    kernels.sum_of_squares_chunks(torch.tensor([1.0, math.nan]), ops.SOS_CHUNK, 37)


def test_update_kernels_do_float32_operations_in_float32():
    """Each float32 operation of the updates is an LLVM float operation, not a binary64 one
    rounded afterwards (the only binary64 values are the unboxed scalar arguments)."""
    import numba

    _compile_all()
    for name in ("_adamw_k", "_sgd_k"):
        k = getattr(kernels, name)
        for sig in k.signatures:
            fresh = numba.njit(nogil=True, error_model="numpy")(k.py_func)
            fresh.compile(sig)
            ir = fresh.inspect_llvm(sig)
            f32_ops = re.findall(r"= f(?:add|sub|mul|div) (?:<\d+ x )?float\b", ir)
            f64_ops = re.findall(r"= f(?:add|sub|mul|div) (?:<\d+ x )?double\b", ir)
            assert len(f32_ops) >= (6 if name == "_adamw_k" else 4), name
            assert not f64_ops, f"{name}: {f64_ops[:3]}"
            assert "fmuladd" not in ir and "llvm.fma" not in ir, name
