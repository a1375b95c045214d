"""The CPU form of the int8 slice route (gemm._fast_sliced: digits written by the quantiser
kernels, one torch._int_mm per shift over the concatenated digit pairs, the shifts added in the
epilogue) gives the float64 route's bytes, bit for bit: results, two-word parts, every operand
layout, tile edges, the two-word (|N| > 2^53) path, non-finite inputs and whole training steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from commitments.spec import Spec
from oracle import cpu_int8
from oracle.exact import gemm as G
from oracle.exact import kernels
from oracle.exact.quant import quantise
from tests.oracle.test_exact_gemm_routes import _walk
from tests.oracle.vectors.edge import edge_values

pytestmark = [pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available"),
              pytest.mark.usefixtures("single_thread")]

SLICE_KERNELS = ("_digits_rows_k", "_digits_rows_part_k", "_digits_cols_k", "_digits_cols_part_k",
                 "_digits_round_tile_k", "_digits_parts_tile_k", "_digits_round_par_k", "_digits_parts_par_k")


def _edges(n: int) -> torch.Tensor:
    """n finite edge values (signed zeros, subnormals, float32 extremes, their neighbours)."""
    v = edge_values()
    v = v[torch.isfinite(v)]
    return v.repeat(-(-n // v.numel()))[:n]


def bits(t):
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def _same(a, b):
    assert (a is None) == (b is None)
    if a is not None:
        assert a.shape == b.shape and a.dtype == b.dtype
        assert torch.equal(bits(a), bits(b))


@pytest.fixture
def sliced(monkeypatch):
    """Counts the products the compiled slice route served (so a test knows it really ran)."""
    calls = []
    real = G._sliced_tiles

    def spy(da, db, k, p, epilogue):
        calls.append((da.shape[0], k, db.shape[0]))
        return real(da, db, k, p, epilogue)

    monkeypatch.setattr(G, "_sliced_tiles", spy)
    return calls


def _both(fn, *args):
    """fn(*args) on the float64 route and on the int8 route (compiled on CPU)."""
    with G.route("dgemm"):
        want = fn(*args)
    with G.route("int8"):
        got = fn(*args)
    return want, got


def _check(a, b):
    want, got = _both(G.exact_matmul, a, b)
    _same(got, want)
    (wh, wl), (gh, gl) = _both(G.matmul_parts, a, b)
    _same(gh, wh)
    _same(gl, wl)


def _layouts(x):
    return (x, x.t().contiguous().t())  # row-major and column-major, same values


def compile_slice_kernels():
    """Call every slice kernel, serial and parallel bodies (for the machine-code scan)."""
    x = torch.randn(16, 40)
    d = np.empty((16, 120), np.int8)
    e = np.empty(16, np.int64)
    kernels._digits_rows_k(x.numpy(), 22, False, d, e)
    kernels._digits_rows_part_k(x.numpy(), 22, True, d, e, 0, 16)
    dc = np.empty((40, 48), np.int8)
    ec = np.empty(40, np.int64)
    kernels._digits_cols_k(x.numpy(), 22, True, dc, ec)
    kernels._digits_cols_part_k(x.numpy(), 22, False, dc, ec, 0, 2)
    p = np.zeros((5, 16, 40), np.int32)
    out = np.empty((16, 40), np.float32)
    hi = np.empty((16, 40))
    kernels._digits_round_tile_k(p, e, ec, 22, out, 0, 0, 0, 16)
    kernels._digits_parts_tile_k(p, e, ec, 22, hi, hi, True, 0, 0, 0, 16)
    kernels._digits_round_par_k(p, e, ec, 22, out, 0, 0)
    kernels._digits_parts_par_k(p, e, ec, 22, hi, hi, True, 0, 0)


def test_probe_and_route_selection(monkeypatch):
    assert cpu_int8.int_mm_probe()  # this torch._int_mm is exact (a wrong one would fail below)
    real = torch._int_mm

    def saturating(a, b, out=None):  # positive control: a kernel that saturates int16 pair sums
        r = real(a.clamp(-64, 63), b)
        return r if out is None else out.copy_(r)

    monkeypatch.setattr(torch, "_int_mm", saturating)
    assert not cpu_int8.int_mm_probe()
    monkeypatch.setattr(torch, "_int_mm", real)
    monkeypatch.delenv("POT_EXACT_GEMM", raising=False)
    assert G.cpu_int8_exact() == (cpu_int8.has_amx() and torch.backends.mkldnn.is_available())
    assert G.gemm_route(torch.device("cpu")) == ("int8" if cpu_int8.has_amx() else "dgemm")


def test_int32_headroom_of_the_concatenated_shifts():
    # 22-bit operands: 3 digits, low ones in [-128, 128), the top one at most 64; the heaviest
    # shift (t = 1 and t = 2) sums 2^15 per contraction index, so k < 2^16 fits int32
    assert G.slice_count(22, 8) == 3 and G.shift_bound(22, 8) == 1 << 15
    assert 65535 * G.shift_bound(22, 8) < 2**31 <= 65536 * G.shift_bound(22, 8)
    # brute force over every digit pattern's extreme: the bound is the largest shift sum
    mags = [128, 128, 64]
    worst = max(sum(mags[i] * mags[t - i] for i in range(3) if 0 <= t - i < 3) for t in range(5))
    assert worst == G.shift_bound(22, 8)
    # beyond the headroom the compiled route declines (the float64 route serves)
    a = torch.ones(2, 65536)
    assert G._fast_sliced(a, a.t(), 65536, 22, True) is None


@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("rev", [False, True])
def test_digits_are_the_quantised_integers(rows, rev):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 300, generator=g) * torch.exp(torch.randn(37, 1, generator=g) * 8)
    x[0] = 0.0
    x[1, :7] = torch.tensor([3.4e38, -3.4e38, 1e-45, -1e-45, 1.17e-38, -0.0, 2.0**-149])
    x[2] = _edges(300)
    t = x if rows else x.t().contiguous()  # the same blocks, read by the row or the column kernel
    d = torch.empty(37, 900, dtype=torch.int8)
    e = kernels.quant_digits(t, 22, rows, rev, d)
    q, qe = quantise(x, -1, 22)
    order = [2, 1, 0] if rev else [0, 1, 2]
    back = sum(d[:, 300 * order[i]:300 * (order[i] + 1)].to(torch.int64) << (8 * i) for i in range(3))
    assert torch.equal(back, q.to(torch.int64))
    assert torch.equal(e, qe.reshape(-1))
    assert int(d[:, 300 * order[2]:300 * (order[2] + 1)].abs().max()) <= 64  # the top digit


def test_nonfinite_blocks_are_refused():
    x = torch.randn(9, 200)
    x[4, 7] = float("nan")
    d = torch.empty(9, 600, dtype=torch.int8)
    assert kernels.quant_digits(x, 22, True, False, d) is None
    assert (
        kernels.quant_digits(x.t().contiguous(), 22, False, False, torch.empty(9, 600, dtype=torch.int8))
        is None
    )


@pytest.mark.parametrize(
    "m,k,n", [(1, 129, 1), (3, 200, 5), (256, 768, 768), (513, 300, 257), (64, 3072, 100), (700, 1024, 600)]
)
def test_random_shapes_every_layout(m, k, n, sliced):
    g = torch.Generator().manual_seed(m * 7 + n)
    a = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g) * 4)
    b = torch.randn(k, n, generator=g) * torch.exp(torch.randn(1, n, generator=g) * 4)
    for x in _layouts(a):
        for y in _layouts(b):
            _check(x, y)
    assert sliced and all(c[1] == k for c in sliced)


def test_edge_values_zero_blocks_and_strided_operands(sliced):
    g = torch.Generator().manual_seed(5)
    a = torch.randn(40, 390, generator=g)
    a[3] = 0.0
    a[5, :300] = _edges(300)
    a[7] = -0.0
    b = torch.randn(390, 70, generator=g) * 1e-30
    b[:, 9] = 0.0
    b[:, 11] = 2.0**-140
    _check(a, b)
    big = torch.randn(60, 900, generator=g)
    _check(big[::2, 100:500], torch.randn(800, 33, generator=g)[::2])  # strided views
    _check(a.unsqueeze(0), b.unsqueeze(0))  # leading dims of size one: one product
    assert len(sliced) >= 4


def test_integers_beyond_2_53_take_two_words(sliced):
    # x = 1 - 2^-24 quantises to 2^22, 2^-22 to 1: row 550 of a against any column of b sums
    # 1022 terms 2^44 and one term 1, N = 1022 2^44 + 1 > 2^53, which needs two words (lo = +-1
    # before scaling); row 551 gives N = 1023 2^44, one word. Only the second tile row of the
    # output needs lo, so the lazily made lo meets tiles before and after it.
    k, m, n = 1024, 600, 600
    one = 1.0 - 2.0**-24
    a = torch.randn(m, k)
    a[550] = one
    a[550, 1] = 2.0**-22
    a[551] = -one
    b = torch.full((k, n), one)
    b[1] = 2.0**-22
    _check(a, b)
    with G.route("int8"):
        hi, lo = G.matmul_parts(a, b)
    assert lo is not None and bool(torch.all(lo[550] != 0))
    assert bool(torch.all(lo[:550] == 0)) and bool(torch.all(lo[551:] == 0))
    assert sliced


def test_nonfinite_inputs_give_the_general_path_result():
    a = torch.randn(20, 300)
    a[2, 3] = float("inf")
    a[4, 4] = float("nan")
    b = torch.randn(300, 10)
    b[7, 1] = float("-inf")
    _check(a, b)


def test_two_threads_equal_one(monkeypatch):
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(600, 700, generator=g), torch.randn(700, 520, generator=g)
    with G.route("int8"):
        one = G.exact_matmul(a, b), G.matmul_parts(a, b)[0]
        old = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            two = G.exact_matmul(a, b), G.matmul_parts(a, b)[0]
        finally:
            torch.set_num_threads(old)
    for x, y in zip(one, two, strict=True):
        _same(x, y)


def _spec(matmul: str) -> Spec:
    # wide enough that every product has k >= 129 (3 digits): the compiled route serves them
    return Spec.from_dict({
        "model": {"kind": "gpt", "vocab_size": 96, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 160,
                  "dropout": 0.1},
        "optimizer": {"kind": "adamw", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
        "batch": {"batch_size": 2, "seq_len": 16},
        "rng": {"seed": 11},
        "exact": {"matmul": matmul},
    })


def test_gpt_steps_identical_on_the_compiled_route(sliced):
    spec = _spec("single")
    with G.route("dgemm"):
        want = _walk(spec, 2)
    with G.route("int8"):
        assert _walk(spec, 2) == want
    assert sliced
    with kernels.disabled(), G.route("int8"):  # the eager slice route agrees too
        assert _walk(spec, 1) == want[:1]


def test_a_torch_without_cpu_int_mm_keeps_the_float64_route(monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("_int_mm: not implemented for CPU")

    monkeypatch.setattr(cpu_int8, "has_amx", lambda: True)
    monkeypatch.setattr(torch, "_int_mm", refuse)
    assert cpu_int8.fast_and_exact() is False
