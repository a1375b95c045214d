"""The numba kernels equal the eager exact-v1 definitions bit for bit (DESIGN §3 rule 6)."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

from oracle.exact import kernels, ops
from oracle.exact import transcendental as tx
from tests.oracle.vectors.edge import bits, edge_rows, edge_values, random_values

pytestmark = pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available")


def _inputs():
    return torch.cat([edge_values(), random_values(20000, 1)])


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    diff = (bits(a) != bits(b)).nonzero()
    assert diff.numel() == 0, f"{diff.numel()} elements differ, first at {diff[:5].tolist()}"


@pytest.mark.parametrize("n", [1, 7, 511, 512, 513, 1537])
def test_erf_gelu_blocks_equal_eager_at_every_length(n):
    # the erf kernels work in blocks of _ERF_BLOCK elements, each series a pass over the block;
    # lengths around the block size, with every branch of erfc64 (series, continued fraction,
    # zero tail, NaN, infinities) spread through the blocks
    pool = torch.cat([edge_values(), random_values(2000, 7) * 8])
    x = pool[torch.randperm(pool.numel(), generator=torch.Generator().manual_seed(n))][:n]
    g = random_values(n, 8)[:n]
    _same(kernels.gelu(x, "erf"), tx.gelu32(x, "erf"))
    _same(kernels.gelu_grad(x, g, "erf"), tx.gelu_grad32(x, g, "erf"))


def test_exp_kernel_equals_eager():
    x = _inputs()
    _same(kernels.exp(x), tx.exp32(x))


@pytest.mark.parametrize("form", ["tanh", "erf"])
def test_gelu_kernels_equal_eager(form):
    x = _inputs()
    g = torch.cat([edge_values().flip(0), random_values(20000, 2)])
    _same(kernels.gelu(x, form), tx.gelu32(x, form))
    _same(kernels.gelu_grad(x, g, form), tx.gelu_grad32(x, g, form))
    ones = torch.ones_like(x)
    _same(kernels.gelu_grad(x, ones, form), tx.gelu_grad32(x, ones, form))


def test_sigmoid_and_silu_kernels_equal_eager():
    x = _inputs()
    g = torch.cat([edge_values().flip(0), random_values(20000, 3)])
    ones = torch.ones_like(x)
    _same(kernels.sigmoid(x), tx.sigmoid32(x))
    _same(kernels.silu(x), tx.silu32(x))
    for gg in (g, ones):
        _same(kernels.sigmoid_grad(x, gg), tx.sigmoid_grad32(x, gg))
        _same(kernels.silu_grad(x, gg), tx.silu_grad32(x, gg))
    inf = torch.tensor([float("-inf"), float("inf"), -0.0, 0.0])
    assert bits(kernels.silu(inf)).tolist() == bits(torch.tensor([-0.0, float("inf"), -0.0, 0.0])).tolist()
    assert kernels.silu_grad(inf, torch.ones(4)).tolist() == [0.0, 1.0, 0.5, 0.5]


def test_silu_op_takes_the_kernel_and_keeps_the_eager_bytes(monkeypatch):
    g = torch.Generator().manual_seed(8)
    x = (torch.randn(64, 300, generator=g) * 12).requires_grad_()
    gy = torch.randn(64, 300, generator=g)
    for op in (ops.silu, ops.sigmoid):
        y = op(x)
        (dx,) = torch.autograd.grad(y, x, gy)
        monkeypatch.setattr(ops, "_use_kernels", lambda *ts: False)
        y0 = op(x)
        (dx0,) = torch.autograd.grad(y0, x, gy)
        monkeypatch.undo()
        _same(y, y0)
        _same(dx, dx0)


def _row_batches():
    g = torch.Generator().manual_seed(3)
    yield from ([r.unsqueeze(0)] for r in edge_rows())
    yield [torch.randn(64, 33, generator=g) * 5]
    yield [torch.randn(8, 1000, generator=g) * 30]
    yield [(torch.randn(4, 17, generator=g) * 1e-38)]


def test_softmax_rows_equal_eager():
    for (x,) in _row_batches():
        _same(kernels.softmax_rows(x), ops.softmax_rows_eager(x))
        _same(kernels.log_softmax_rows(x), ops.log_softmax_rows_eager(x))
        g = torch.randn(x.shape, generator=torch.Generator().manual_seed(x.numel()))
        p = ops.softmax_rows_eager(x)
        y = ops.log_softmax_rows_eager(x)
        _same(kernels.softmax_bwd_rows(p, g), ops.softmax_bwd_rows_eager(p, g))
        _same(kernels.log_softmax_bwd_rows(y, g), ops.log_softmax_bwd_rows_eager(y, g))
        # gradients holding edge values too
        ge = (
            edge_values()[: x.shape[-1]].expand(x.shape[0], -1) if x.shape[-1] <= edge_values().numel() else g
        )
        _same(kernels.softmax_bwd_rows(p, ge.contiguous()), ops.softmax_bwd_rows_eager(p, ge.contiguous()))


def test_cross_entropy_rows_equal_eager():
    for (x,) in _row_batches():
        t = torch.arange(x.shape[0]) % x.shape[1]
        lk, mk, sk = kernels.ce_rows(x, t)
        le, me, se = ops.ce_rows_eager(x, t)
        _same(lk, le)
        _same(mk, me)
        assert torch.equal(sk.view(torch.int64), se.view(torch.int64))
        for g, total in ((1.0, 7), (0.37, 1000), (-2.0, 3)):
            scale = (torch.tensor(g, dtype=torch.float64), torch.tensor(float(total), dtype=torch.float64))
            _same(kernels.ce_bwd_rows(x, t, mk, sk, scale), ops.ce_bwd_rows_eager(x, t, me, se, scale))


def test_ops_give_same_bytes_with_and_without_kernels():
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(3, 5, 40, generator=g) * 3).requires_grad_(True)
    outs = []
    for use in (True, False):
        ctx = kernels.disabled() if not use else _null()
        with ctx:
            xx = x.detach().clone().requires_grad_(True)
            y = ops.gelu(xx, "erf") * 0.5
            z = ops.log_softmax(y, dim=1)
            w = ops.softmax(z, dim=-1)
            t = torch.arange(15).reshape(3, 5) % 40
            loss = ops.cross_entropy(ops.add(w, ops.exp(y)), t)
            loss.backward()
            outs.append((loss.detach(), xx.grad))
    _same(outs[0][0], outs[1][0])
    _same(outs[0][1], outs[1][1])


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_canonical_nan_from_kernels():
    x = torch.tensor([np.array([0xFFC01234], dtype=np.uint32).view(np.float32)[0], float("nan")])
    for y in (kernels.exp(x), kernels.gelu(x, "tanh"), kernels.gelu(x, "erf"), kernels.sigmoid(x),
              kernels.silu(x), kernels.silu_grad(x, torch.ones(2)), kernels.sigmoid_grad(x, torch.ones(2))):
        assert (bits(y) == 0x7FC00000).all()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 mnemonic scan")
def test_no_fused_multiply_add_in_machine_code():
    import numba

    fma = ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")
    # positive control: with fastmath LLVM does contract a*b+c on this CPU (if it has FMA)
    ctl = numba.njit(fastmath=True)(lambda a, b, c: a * b + c)
    ctl(1.0, 2.0, 3.0)
    has_fma_unit = any(m in ctl.inspect_asm(ctl.signatures[0]) for m in fma)
    if not has_fma_unit:
        pytest.skip("this CPU has no FMA instructions to look for")
    # compile every kernel for its signatures (by calling it) ...
    test_softmax_rows_equal_eager()
    test_cross_entropy_rows_equal_eager()
    test_exp_kernel_equals_eager()
    test_gelu_kernels_equal_eager("tanh")
    test_gelu_kernels_equal_eager("erf")
    test_sigmoid_and_silu_kernels_equal_eager()
    from tests.oracle.test_optim_kernels import _compile_all

    _compile_all()  # the optimizer updates and the clipping sum
    _compile_gemm_kernels()
    from tests.oracle.test_exact_gemm_cpu_slices import SLICE_KERNELS, compile_slice_kernels

    compile_slice_kernels()
    scanned = 0
    names = set()
    for name, k in kernels.all_kernels():
        # ... and recompile it uncached and serial with the same options (cached code cannot be
        # inspected), then scan its assembly, callees included
        fresh = numba.njit(nogil=True, error_model="numpy")(k.py_func)
        for sig in k.signatures:
            fresh.compile(sig)
            asm = fresh.inspect_asm(sig).lower()
            scanned += 1
            # (a rounding kernel such as _to_f32_k has only the binary64 -> binary32 conversion;
            # the SGD update only float32 arithmetic)
            assert any(op in asm for op in ("mulsd", "mulpd", "addsd", "addpd", "sqrtsd", "sqrtpd", "sqrtss",
                                            "sqrtps", "cvtsd2ss", "cvtpd2ps", "mulss", "mulps")), \
                f"{name}: no float64 arithmetic or conversion found; the scan is blind"
            for mnemonic in fma:
                assert mnemonic not in asm, f"{name}: {mnemonic} in the machine code"
            names.add(name)
    assert scanned >= 9
    gemm = {"_quant_rows_part_k", "_quant_cols_part_k", "_scale_round_part_k", "_scale2_part_k"}
    assert gemm <= names, gemm - names
    assert {"_sigmoid_k", "_sigmoid_grad_k", "_silu_k", "_silu_grad_k"} <= names
    from tests.oracle.test_optim_kernels import OPT_KERNELS

    assert set(OPT_KERNELS) <= names, set(OPT_KERNELS) - names
    assert set(SLICE_KERNELS) <= names, set(SLICE_KERNELS) - names


def _compile_gemm_kernels():
    """Call the GEMM operand quantisers and the epilogues (serial bodies, which kernels._split
    runs on any number of threads)."""
    x = torch.randn(16, 40)
    q = np.empty((16, 40))
    e = np.empty(16, np.int64)
    ss = np.zeros(16)
    kernels._quant_rows_part_k(x.numpy(), 22, q, e, ss, True, 0, 16)
    flat = x.numpy().reshape(-1)
    kernels._quant_cols_part_k(
        flat, 22, q.reshape(-1), np.empty(40, np.int64), np.zeros(40), True, 16, 40, 1024, 0, 1
    )
    out = np.empty((16, 40), np.float32)
    ea, eb = np.zeros(16, np.int64), np.zeros(40, np.int64)
    kernels._scale_round_part_k(q, ea, eb, 22, out, 0, 16)
    kernels._scale2_part_k(q, ea, eb, 22, 0, 16)


def test_fold_kernel_equals_eager_fold():
    from oracle.exact.accumulate import Fold

    g = torch.Generator().manual_seed(21)
    n, nb = 4000, 9
    mag = torch.exp(torch.randn(nb, n, generator=g, dtype=torch.float64) * 40)  # wide exponents: some inexact
    vals = torch.randn(nb, n, generator=g, dtype=torch.float64) * mag
    vals[3, :5] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e308])
    vals[4, :5] = torch.tensor([float("-inf"), 1.0, 2.0, -0.0, 1e308])
    outs = []
    for use in (True, False):
        with (_null() if use else kernels.disabled()):
            f = Fold((n,), "cpu")
            f.add_many(vals[:2])
            f.add_many(vals[2:])
            outs.append((f.hi, f.lo, f.result(), f.inexact))
    (h1, l1, r1, i1), (h2, l2, r2, i2) = outs
    assert torch.equal(h1.view(torch.int64)[~torch.isnan(h1)], h2.view(torch.int64)[~torch.isnan(h2)])
    assert torch.equal(torch.isnan(h1), torch.isnan(h2))
    assert torch.equal(l1.view(torch.int64), l2.view(torch.int64))
    _same(r1, r2)
    assert i1 == i2 and i1 > 0  # the wide exponent range does exercise the inexact branch


def _lane_sum(v: list[float]) -> float:
    """A block's sum of squares in the row kernel's order, in Python floats (binary64): 32 lane
    sums, lane l taking the indices l mod 32 in index order, then the lanes added in order."""
    lanes = [0.0] * kernels._SS_LANES
    for j, x in enumerate(v):
        lanes[j % kernels._SS_LANES] += x * x
    t = 0.0
    for x in lanes:
        t += x
    return t


def _chain_sum(v: list[float]) -> float:
    t = 0.0
    for x in v:
        t += x * x
    return t


@pytest.mark.parametrize("k", [1, 31, 32, 33, 777, 1500])
def test_quant_sums_of_squares_follow_their_order_and_bound(k):
    """ss of the row kernel is the lane-order sum and ss of the column kernel the k-order chain,
    bit for bit, where the sums do round (26-bit integers, squares near 2^52); both lie within
    the relative error (k + 31) 2^-53 of the exact integer sum that gemm.KERNEL_ONE_GEMM_BOUND
    allows for."""
    g = torch.Generator().manual_seed(29)
    x = torch.randn(6, k, generator=g) * torch.exp(torch.randn(6, 1, generator=g))
    x[2] = 1.0  # all integers 2^(s-1): equal squares, an exact sum
    s = 26
    differ = 0
    for r in range(x.shape[0]):  # one block at a time: ss is the largest block's sum
        q, _, ss = kernels.quant_rows(x[r:r + 1].contiguous(), s)
        v = [float(t) for t in q[0].tolist()]
        assert ss == _lane_sum(v)
        qc, _, ssc = kernels.quant_cols(x[r:r + 1].t().contiguous(), s)
        assert torch.equal(qc.t().contiguous().view(torch.int64), q.view(torch.int64))
        assert ssc == _chain_sum(v)
        differ += ss != ssc
        exact = sum(int(t) ** 2 for t in v)
        for got in (ss, ssc):
            assert abs(got - exact) <= (k + 31) * 2.0**-53 * exact
    assert differ or k < 64  # the long blocks' sums do round, each order its own way


def test_quant_rows_kernel_equals_eager_quantisation():
    from oracle.exact import quant as Q

    g = torch.Generator().manual_seed(23)
    x = (torch.randn(40, 77, generator=g) * torch.exp(torch.randn(40, 1, generator=g) * 30)).float()
    x[0] = 0.0
    x[1] = torch.tensor(1e-45)
    x[2, :3] = torch.tensor([2.0**-149, -(2.0**-148), 3e38])
    x[4] = edge_values()[:77].nan_to_num(0.0, 0.0, 0.0)
    for s in (9, 21, 22, 26):
        # row 3: exact ties at s bits (q = 1.5, 2.5, -0.5 before rounding) -> 2, 2, -0
        x[3] = 0.0
        x[3, :4] = torch.tensor([1.0, 1.5 * 2.0 ** (1 - s), 2.5 * 2.0 ** (1 - s), -0.5 * 2.0 ** (1 - s)])
        q, e, ss = kernels.quant_rows(x, s)
        assert q[3, 1:4].tolist() == [2.0, 2.0, -0.0]
        assert ss == pytest.approx((q * q).sum(dim=1).max().item(), rel=1e-12)
        qe, ee = Q.quantise(x, -1, s)
        assert torch.equal(e, ee)
        assert torch.equal(q.view(torch.int64), qe.view(torch.int64))
    bad = x.clone()
    bad[5, 3] = float("inf")
    assert kernels.quant_rows(bad, 21) is None


def test_matmul_fast_path_equals_general_path():
    from oracle.exact import gemm as G

    g = torch.Generator().manual_seed(29)
    for m, k, n in ((5, 300, 7), (3, 1100, 4), (2, 50, 3)):
        x = (torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g) * 4)).float()
        w = (torch.randn(n, k, generator=g) * torch.exp(torch.randn(n, k, generator=g) * 4)).float()
        fast = G.exact_matmul(x, w.t())
        with kernels.disabled():
            slow = G.exact_matmul(x, w.t())
        _same(fast, slow)


def test_layer_norm_and_sequence_sum_kernels_equal_eager():
    g = torch.Generator().manual_seed(31)
    x = (torch.randn(3, 5, 48, generator=g) * torch.exp(torch.randn(3, 5, 1, generator=g) * 3) + 2).float()
    x[0, 0] = 0.0
    x[0, 1, :4] = torch.tensor([float("inf"), 1.0, 2.0, 3.0])
    x[0, 2, 0] = float("nan")
    x[1, 0] = edge_values()[20:68].nan_to_num(0.0, 1e30, -1e30)
    w, b = torch.randn(48, generator=g), torch.randn(48, generator=g)
    gy = torch.randn(3, 5, 48, generator=g)
    for ww, bb in ((w, b), (None, None), (w, None)):
        res = []
        for use in (True, False):
            with (_null() if use else kernels.disabled()):
                xr = x.clone().requires_grad_(True)
                wr = ww.clone().requires_grad_(True) if ww is not None else None
                br = bb.clone().requires_grad_(True) if bb is not None else None
                y = ops.layer_norm(xr, wr, br)
                y.backward(gy)
                res.append([y.detach(), xr.grad] + [t.grad for t in (wr, br) if t is not None])
        for a, c in zip(*res, strict=True):
            _same(a, c)
    v = torch.randn(4, 33, 7, generator=g, dtype=torch.float64) * torch.exp(
        torch.randn(4, 33, 7, generator=g, dtype=torch.float64) * 20
    )
    v[0, 3, 0], v[1, 2, 1], v[1, 3, 1], v[2, 0, 2] = float("inf"), float("inf"), float("-inf"), float("nan")
    from oracle.exact.quant import exact_sum64
    k, e = kernels.seq_sums(v), exact_sum64(v, dim=1)
    assert torch.equal(torch.isnan(k), torch.isnan(e))
    assert torch.equal(k[~torch.isnan(k)].view(torch.int64), e[~torch.isnan(e)].view(torch.int64))


def test_hilo_fast_path_equals_general_path():
    from oracle.exact import gemm as G
    from oracle.exact import quant as Q

    g = torch.Generator().manual_seed(37)
    for m, k, n in ((5, 300, 7), (3, 1100, 4), (4, 20, 3)):
        x = (torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g) * 4)).float()
        w = (torch.randn(n, k, generator=g) * torch.exp(torch.randn(n, k, generator=g) * 4)).float()
        hk = kernels.quant_rows_hilo(x, Q.hilo_bits(k))
        he, le, ee = Q.quantise_hilo(x, -1, Q.hilo_bits(k))
        assert torch.equal(hk[0].view(torch.int64), he.view(torch.int64))
        assert torch.equal(hk[1].view(torch.int64), le.view(torch.int64)) and torch.equal(hk[2], ee)
        fast = G.exact_matmul(x, w.t(), "hilo")
        with kernels.disabled():
            slow = G.exact_matmul(x, w.t(), "hilo")
        _same(fast, slow)


def _hilo_round_eager(top, mid, ea, eb, s):
    """exact_matmul's float32 of a hi/lo product from its GEMM outputs, by the eager code."""
    from oracle.exact import gemm as G
    from oracle.exact import quant as Q

    hi, lo = G._hilo_finish(top.clone(), mid.clone(), ea.view(-1, 1), eb.view(1, -1), s)
    return Q.to_f32_once(hi, None if not bool(torch.any(lo != 0)) else lo)


def _hilo_epilogue_cases(g, m: int, n: int):
    """(top, mid) float64 integers as the hi/lo GEMMs give them (|top| < 2^52, |mid| < 2^53):
    random ones, float32 ties and near-ties of the final value, signed zeros."""
    top = torch.randint(-(2**50), 2**50, (m, n), generator=g, dtype=torch.int64).to(torch.float64)
    mid = torch.randint(-(2**52), 2**52, (m, n), generator=g, dtype=torch.int64).to(torch.float64)
    # top 2^s + mid on a float32 tie (mid 0) or one unit beside it (the low word then 1): for a
    # 24-bit m32, top = m32 2^24 + 2^23 puts top 2^s exactly half a float32 unit above m32 2^(24+s)
    m32 = torch.randint(2**23, 2**24, (m, n), generator=g, dtype=torch.int64)
    tie_top = (m32 * 2**24 + 2**23).to(torch.float64)
    pick = torch.randint(0, 4, (m, n), generator=g)
    delta = torch.randint(-1, 2, (m, n), generator=g).to(torch.float64)
    sign = torch.where(torch.rand(m, n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    top = torch.where(pick == 0, tie_top * sign, top)
    mid = torch.where(pick == 0, delta * sign, mid)
    top[0, :4] = torch.tensor([0.0, -0.0, -0.0, 0.0], dtype=torch.float64)
    mid[0, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0], dtype=torch.float64)
    return top, mid


@pytest.mark.parametrize("scale", ["unit", "subnormal", "overflow"])
def test_hilo_epilogue_kernel_equals_eager(scale):
    g = torch.Generator().manual_seed(41)
    m, n, s = 37, 53, 21
    top, mid = _hilo_epilogue_cases(g, m, n)
    # block exponents (the values are near 2^71 before the scalings by 2^(ea - 2s) and 2^(eb - s)):
    # results near 2^-15, from zero through float32's subnormals to small normals, and around
    # float32's largest values into overflow
    base = {"unit": -10, "subnormal": -74, "overflow": 60}[scale]
    ea = torch.randint(base - 12, base + 12, (m,), generator=g, dtype=torch.int64)
    eb = torch.randint(base - 12, base + 12, (n,), generator=g, dtype=torch.int64)
    got = kernels.hilo_round_f32(top, mid, ea, eb, s)
    assert got is not None
    _same(got, _hilo_round_eager(top, mid, ea, eb, s))


def test_hilo_epilogue_kernel_leaves_the_all_zero_low_words_case_to_the_eager_code():
    from oracle.exact import gemm as G

    s = 21
    ea, eb = torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    # every low word zero: exact_matmul rounds the high words alone, so -0 + -0 stays -0
    top = torch.tensor([[-0.0, 1.0, 2.0], [3.0, 0.0, -5.0]], dtype=torch.float64)
    mid = torch.tensor([[-0.0, 7.0, 0.0], [1.0, 0.0, 4.0]], dtype=torch.float64)
    assert kernels.hilo_round_f32(top, mid, ea, eb, s) is None
    assert bits(_hilo_round_eager(top, mid, ea, eb, s))[0, 0] == bits(torch.tensor(-0.0))
    # no such -0: the pass covers it
    top[0, 0] = 0.0
    _same(kernels.hilo_round_f32(top, mid, ea, eb, s), _hilo_round_eager(top, mid, ea, eb, s))
    # and when the pass declines, exact_matmul takes the eager rounding for the same bytes
    g = torch.Generator().manual_seed(43)
    x = (torch.randn(6, 200, generator=g) * torch.exp(torch.randn(6, 200, generator=g) * 3)).float()
    w = (torch.randn(5, 200, generator=g) * torch.exp(torch.randn(5, 200, generator=g) * 3)).float()
    want = G.exact_matmul(x, w.t(), "hilo")
    real = kernels.hilo_round_f32
    try:
        kernels.hilo_round_f32 = lambda *a, **k: None
        declined = G.exact_matmul(x, w.t(), "hilo")
    finally:
        kernels.hilo_round_f32 = real
    with kernels.disabled():
        _same(G.exact_matmul(x, w.t(), "hilo"), want)
    _same(declined, want)


def _fold_result_cases():
    """(hi, lo) float64 pairs: float32 ties and near-ties, subnormal and overflowing results,
    signed zeros, non-finite words and NaN payloads."""
    g = torch.Generator().manual_seed(29)
    n = 6000
    f32 = (
        (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 30)).float().to(torch.float64)
    )
    ulp = torch.abs(f32) * 2.0**-24  # half a float32 unit: hi on or near a tie
    hi = torch.cat([f32 + ulp, f32 - ulp, f32, torch.randn(n, generator=g, dtype=torch.float64) * 1e-40])
    lo = torch.cat([torch.randn(n, generator=g, dtype=torch.float64) * 1e-30 * torch.abs(f32),
                    -torch.abs(f32) * 2.0**-60, torch.zeros(n, dtype=torch.float64),
                    torch.randn(n, generator=g, dtype=torch.float64) * 1e-60])
    special = torch.tensor([
        (0.0, 0.0), (-0.0, 0.0), (-0.0, -0.0), (0.0, -0.0), (float("inf"), 1.0), (float("-inf"), 0.0),
        (float("nan"), 0.0), (1.0, float("nan")), (1.0, float("inf")), (float("inf"), float("-inf")),
        (3.4028235677973366e38, 3e30), (3.4028235677973366e38, -1.0), (1e308, 1e308), (2.0**-150, 1e-300),
        (2.0**-150, -1e-300), (-(2.0**-150), 1e-300), (2.0**-149 * 1.5, 1e-310), (1.0 + 2.0**-24, 1e-300),
        (1.0 + 2.0**-24, -1e-300), (1.0 + 2.0**-24, 0.0), (1.0 + 3 * 2.0**-24, 0.0)], dtype=torch.float64)
    hi = torch.cat([hi, special[:, 0]])
    lo = torch.cat([lo, special[:, 1]])
    nan_payload = torch.tensor([0x7FF0000000000123, -0x000FFFFFFFFFFFF1], dtype=torch.int64).view(
        torch.float64
    )
    return torch.cat([hi, nan_payload]), torch.cat([lo, torch.zeros(2, dtype=torch.float64)])


@pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available")
def test_fold_result_and_f64_to_f32_kernels_equal_eager():
    from oracle.exact.accumulate import Fold
    from oracle.exact.quant import canon_nan

    hi, lo = _fold_result_cases()
    outs = []
    for use in (True, False):
        with (_null() if use else kernels.disabled()):
            f = Fold(hi.shape, "cpu")
            f.hi, f.lo, f.count = hi.clone(), lo.clone(), 2
            one = Fold(hi.shape, "cpu")
            one.add(hi.clone())
            outs.append((f.result(), one.result()))
    (r1, o1), (r2, o2) = outs
    assert torch.equal(bits(r1), bits(r2))
    assert torch.equal(bits(o1), bits(o2))
    assert torch.equal(bits(kernels.f64_to_f32(hi)), bits(canon_nan(hi.to(torch.float32))))
    assert int(torch.isnan(r1).sum()) >= 4 and bool((bits(r1)[torch.isnan(r1)] == 0x7FC00000).all())
