"""The single-slice CPU fast path with its column quantiser and per-thread float64 workspaces gives
the eager definition's bytes (and the row-kernel path's, on transposed copies, that it replaced)
on every layout, never hands out a tensor that aliases a workspace, and is safe from several
threads at once (docs/exact-v1.md §6)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from oracle.exact import gemm as G
from oracle.exact import kernels
from oracle.exact.quant import dot_bits, pow2
from tests.oracle.test_exact_gemm_routes import _spec, _walk
from tests.oracle.vectors.edge import edge_values

pytestmark = [pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available"),
              pytest.mark.usefixtures("single_thread", "float64_route")]


@pytest.fixture
def float64_route():
    """These tests are of the float64 route's workspaces (a CPU with AMX takes the int8 slice
    route by default: tests/oracle/test_exact_gemm_cpu_slices.py)."""
    with G.route("dgemm"):
        yield


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64) if t.dtype == torch.float64 else t.view(torch.int32)


def _same(a, b) -> None:
    if a is None or b is None:
        assert a is None and b is None
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a.contiguous()), bits(b.contiguous()))


def _data(g, *shape, spread=4.0):
    """Gaussian values with row-to-row and element-to-element exponents spread by `spread`."""
    return (torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * spread)).float()


def _eager(fn, *args):
    with kernels.disabled():
        return fn(*args)


def _row_kernel_single(a, b, k, rounded):
    """The fast path as it was before the column quantiser and the workspaces: every operand's
    blocks made rows of a contiguous copy for the row kernel, every output a fresh tensor."""
    nc, kc = G.k_chunks(k)
    s = dot_bits(kc)

    def quant(x, dim):
        t = (x if dim == -1 else x.transpose(-2, -1)).contiguous()
        res = kernels.quant_rows(t.reshape(-1, t.shape[-1]), s)
        if res is None:
            return None
        q, e, ss = res
        q, e = q.reshape(t.shape), e.reshape(*t.shape[:-1], 1)
        return (q, e, ss) if dim == -1 else (q.transpose(-2, -1), e.transpose(-2, -1), ss)

    qa, qb = quant(a, -1), quant(b, -2)
    if qa is None or qb is None:
        return None
    (qa, ea, ssa), (qb, eb, ssb) = qa, qb
    hi, lo = G._single_product(qa, qb, s, nc, kc, lambda: math.sqrt(ssa) * math.sqrt(ssb) <= G.ONE_GEMM_BOUND)
    if rounded and lo is None and hi.dim() == 2:
        return kernels.scale_round_f32(hi, ea.reshape(-1), eb.reshape(-1), s), None
    return G._scale(hi, lo, pow2(ea - s), pow2(eb - s))


def _old_exact_matmul(a, b):
    fast = _row_kernel_single(a, b, a.shape[-1], True)
    if fast[0].dtype == torch.float32:
        return fast[0]
    hi, lo = fast
    if lo is not None and not bool(torch.any(lo != 0)):
        lo = None
    from oracle.exact.quant import to_f32_once
    return to_f32_once(hi, lo)


def _in_workspace(t: torch.Tensor) -> bool:
    """Whether t's memory overlaps one of this thread's workspaces."""
    lo = t.untyped_storage().data_ptr()
    hi = lo + t.untyped_storage().nbytes()
    for buf in G._ws.bufs.values():
        b0 = buf.untyped_storage().data_ptr()
        if lo < b0 + buf.untyped_storage().nbytes() and b0 < hi:
            return True
    return False


def _check(a, b, old=True):
    """exact_matmul and matmul_parts of a @ b: the fast path equals the eager definition (and the
    row-kernel path), and no result lives in a workspace."""
    y = G.exact_matmul(a, b)
    hi, lo = G.matmul_parts(a, b)
    _same(y, _eager(G.exact_matmul, a, b))
    ehi, elo = _eager(G.matmul_parts, a, b)
    _same(hi, ehi)
    _same(lo, elo)
    if old:
        _same(y, _old_exact_matmul(a, b))
        ohi, olo = _row_kernel_single(a, b, a.shape[-1], False)
        _same(hi, ohi)
        _same(lo, olo)
    for t in (y, hi, lo):
        assert t is None or not _in_workspace(t)
    return y


@pytest.fixture
def col_calls(monkeypatch):
    """Counts the column quantiser's calls (it must serve the row-major column blocks)."""
    calls = []
    real = kernels.quant_cols

    def spy(x, s, out=None, need_ss=True):
        calls.append(tuple(x.shape))
        return real(x, s, out=out, need_ss=need_ss)
    monkeypatch.setattr(kernels, "quant_cols", spy)
    return calls


# --- the column quantiser against the row kernel and the eager quantiser ----------------------


def test_column_kernel_equals_row_kernel_on_the_transpose():
    from oracle.exact import quant as Q

    g = torch.Generator().manual_seed(41)
    edge = edge_values().nan_to_num(0.0, 0.0, 0.0)
    for shape in ((1, 1), (7, 1), (1, 9), (40, 77), (513, 3), (3, 1500), (2, 257, 1030), (2, 3, 5, 7)):
        x = _data(g, *shape, spread=10.0)
        n = min(x.numel(), edge.numel())
        x.view(-1)[:n] = edge[:n]
        x[..., 0, :] = 0.0  # one zero row: zero columns' exponent is 0
        for s in (9, 21, 22, 26):
            if s == 22:  # ties at s bits, round half to even: 1.5 -> 2, 2.5 -> 2, -0.5 -> -0
                x.view(-1)[-4:] = torch.tensor([1.0, 1.5 * 2.0 ** (1 - s), 2.5 * 2.0 ** (1 - s),
                                                -0.5 * 2.0 ** (1 - s)])[:min(4, x.numel())]
            q, e, ss = kernels.quant_cols(x, s)
            qe, ee = Q.quantise(x, -2, s)
            _same(q, qe)
            assert torch.equal(e, ee)
            xt = x.transpose(-2, -1).contiguous()
            qr, er, ssr = kernels.quant_rows(xt.reshape(-1, xt.shape[-1]), s)
            _same(q.transpose(-2, -1).reshape(qr.shape), qr)
            # each kernel adds a block's squares in its own fixed order (rows: 32 lanes; columns:
            # k order): both lie within the error that KERNEL_ONE_GEMM_BOUND allows for
            assert ss == pytest.approx(ssr, rel=(x.shape[-2] + 31) * 2.0**-52, abs=0.0)
            out = torch.empty(x.shape, dtype=torch.float64)
            q2, _, ss2 = kernels.quant_cols(x, s, out=out)
            assert q2 is out and ss2 == ss
            _same(out, qe)
            assert kernels.quant_cols(x, s, need_ss=False)[2] == 0.0
    for bad in (math.inf, -math.inf, math.nan):
        x = _data(g, 30, 40)
        x[17, 3] = bad
        assert kernels.quant_cols(x, 22) is None
        assert kernels.quant_rows(x, 22) is None


def test_kernels_on_two_threads_equal_one():
    g = torch.Generator().manual_seed(43)
    x = _data(g, 700, 800)  # above the parallel threshold: the prange kernels run
    torch.set_num_threads(1)
    r1, c1 = kernels.quant_rows(x, 22), kernels.quant_cols(x, 22)
    torch.set_num_threads(2)
    try:
        r2, c2 = kernels.quant_rows(x, 22), kernels.quant_cols(x, 22)
    finally:
        torch.set_num_threads(1)
    for (q1, e1, s1), (q2, e2, s2) in ((r1, r2), (c1, c2)):
        _same(q1, q2)
        assert torch.equal(e1, e2) and s1 == s2


# --- the product, every layout ------------------------------------------------------------------


SHAPES = [(1, 1, 1), (1, 5, 1), (3, 1, 4), (5, 300, 7), (17, 512, 9), (8, 513, 6), (2, 1100, 3),
          (33, 768, 65), (64, 768, 768), (256, 768, 768), (256, 3072, 768), (256, 768, 3072)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_random_shapes_every_layout(m, k, n, col_calls):
    g = torch.Generator().manual_seed(m * 1000003 + k * 1009 + n)
    x = _data(g, m, k)
    w = _data(g, n, k)
    # the linear layouts: x @ w.T (row kernel on both) and g @ w (column kernel on w)
    _check(x, w.t())
    gy = _data(g, m, n)
    _check(gy, w)
    assert (n, k) in col_calls or min(n, k) == 1  # w's columns, read in place
    # a transposed a (the weight gradient's dy.T @ x) and strided, non-contiguous operands
    _check(x.t().contiguous().t(), w.t())
    wide = _data(g, m, 2 * k)
    _check(wide[:, ::2], w.t().contiguous()[:, :])
    _check(x, _data(g, 2 * n, k)[::2].t())


def test_random_shapes_drawn():
    g = torch.Generator().manual_seed(47)
    for _ in range(12):
        m, k, n = (int(torch.randint(1, hi, (), generator=g)) for hi in (80, 1400, 80))
        a, b = _data(g, m, k), _data(g, k, n)
        _check(a, b)
        _check(a, b.t().contiguous().t())


def test_batched_operands():
    g = torch.Generator().manual_seed(53)
    a = _data(g, 2, 3, 20, 600)
    b = _data(g, 2, 3, 600, 30)
    _check(a, b)                                   # column kernel on a batch
    _check(a, b.transpose(-2, -1).contiguous().transpose(-2, -1))  # row kernel on b's transpose
    _check(a.transpose(-2, -1).contiguous().transpose(-2, -1), b)  # column kernel on a's transpose
    _check(a, b[0, 0])                             # broadcast batch
    _check(a[:, :, :, :300], b[:, :, ::2])          # strided


def test_head_like_product():
    """The LM head's shapes once: x @ W.T (the forward) and dy @ W (dx: W's 50304-long columns)."""
    g = torch.Generator().manual_seed(59)
    w = torch.randn(50304, 768, generator=g) * 0.02
    x = torch.randn(64, 768, generator=g)
    _check(x, w.t(), old=False)
    _same(G.exact_matmul(x, w.t()), _old_exact_matmul(x, w.t()))
    dy = torch.randn(16, 50304, generator=g) * 1e-3
    y = G.exact_matmul(dy, w)
    _same(y, _eager(G.exact_matmul, dy, w))
    _same(y, _old_exact_matmul(dy, w))
    G.release_workspaces()


def test_long_contractions_take_the_chunked_paths():
    """K > 512 where one GEMM is not provably exact: +-1 values (the chunk sums stay below 2^53)
    and all ones (they pass it: the H/L split), through the workspaces."""
    g = torch.Generator().manual_seed(61)
    for k in (1100, 3072):
        signs = torch.where(torch.rand(9, k, generator=g) < 0.5, -1.0, 1.0)
        cols = torch.where(torch.rand(k, 7, generator=g) < 0.5, -1.0, 1.0)
        for a, b in ((signs, cols), (torch.ones(9, k), torch.ones(k, 7)), (signs, torch.ones(7, k).t())):
            _check(a, b)
            hi, lo = G.matmul_parts(a, b)
            if torch.equal(a, torch.ones(9, k)) and k == 3072:
                assert lo is not None  # k 2^42 > 2^53: the split path, two words


def test_nonfinite_inputs_take_the_general_path():
    g = torch.Generator().manual_seed(67)
    for bad in (math.inf, -math.inf, math.nan):
        a, b = _data(g, 6, 700), _data(g, 700, 5)
        a2 = a.clone()
        a2[2, 11] = bad
        y = G.exact_matmul(a2, b)
        _same(y, _eager(G.exact_matmul, a2, b))
        b2 = b.clone()
        b2[300, 4] = bad  # a is quantised into its workspace first, then b's column fails
        _same(G.exact_matmul(a, b2), _eager(G.exact_matmul, a, b2))
        hi, lo = G.matmul_parts(a, b2)
        ehi, elo = _eager(G.matmul_parts, a, b2)
        _same(hi, ehi)
        _same(lo, elo)
        _check(a, b)  # and the next finite call is unaffected


# --- workspaces: reuse, aliasing, threads, the cap -----------------------------------------------


def test_growing_and_shrinking_shapes_reuse_the_workspaces():
    G.release_workspaces()
    g = torch.Generator().manual_seed(71)
    sizes = [
        (4, 64, 4),
        (64, 768, 300),
        (8, 100, 5),
        (128, 1100, 700),
        (1, 3, 1),
        (64, 768, 300),
        (30, 700, 2),
    ]
    cases = [(_data(g, m, k), _data(g, n, k)) for m, k, n in sizes]
    want = [_eager(G.exact_matmul, x, w.t()) for x, w in cases]
    want_gx = [_eager(G.exact_matmul, _data(torch.Generator().manual_seed(i), x.shape[0], w.shape[0]), w)
               for i, (x, w) in enumerate(cases)]
    for _ in range(2):
        for i, (x, w) in enumerate(cases):
            _same(G.exact_matmul(x, w.t()), want[i])
            gy = _data(torch.Generator().manual_seed(i), x.shape[0], w.shape[0])
            _same(G.exact_matmul(gy, w), want_gx[i])
    # the buffers grew to the largest request and stayed
    assert G._ws.bufs["qb"].numel() >= 700 * 1100 and G._ws.bufs["out"].numel() >= 128 * 700


def test_results_never_alias_a_workspace():
    g = torch.Generator().manual_seed(73)
    a, b = _data(g, 40, 900), _data(g, 900, 50)
    c, d = _data(g, 60, 800), _data(g, 800, 30)
    y1 = G.exact_matmul(a, b)
    h1, l1 = G.matmul_parts(a, b)
    keep = (y1.clone(), h1.clone(), None if l1 is None else l1.clone())
    y2 = G.exact_matmul(c, d)  # the same workspaces, refilled
    h2, _ = G.matmul_parts(c, d)
    _same(y1, keep[0])
    _same(h1, keep[1])
    _same(l1, keep[2])
    # a caller writing into its result leaves the next call's bytes alone
    y1.fill_(math.nan)
    h1.fill_(math.nan)
    _same(G.exact_matmul(a, b), keep[0])
    _same(G.matmul_parts(a, b)[0], keep[1])
    for t in (y1, h1, y2, h2):
        assert not _in_workspace(t)


def test_autograd_saves_no_workspace():
    from oracle.exact import ops

    g = torch.Generator().manual_seed(79)
    x = _data(g, 2, 5, 700, spread=1.0).requires_grad_(True)
    w = (torch.randn(600, 700, generator=g) * 0.05).requires_grad_(True)
    b = torch.randn(600, generator=g).requires_grad_(True)
    out = []
    for use in (True, False):
        ctx = kernels.disabled() if not use else _Null()
        with ctx:
            xx, ww, bb = (t.detach().clone().requires_grad_(True) for t in (x, w, b))
            y = ops.linear(xx, ww, bb)
            z = ops.matmul(y.reshape(10, 600), ww)  # ww's columns: the column kernel, both passes
            # other products between the forward and the backward refill every workspace
            G.exact_matmul(_data(g, 50, 800), _data(g, 800, 40))
            (z * z).sum().backward()
            out.append((y.detach(), z.detach(), xx.grad, ww.grad, bb.grad))
    for p, q in zip(*out, strict=True):
        _same(p, q)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_two_threads_at_once():
    g = torch.Generator().manual_seed(83)
    jobs = {
        "a": [(_data(g, 64, 768), _data(g, 300, 768).t()), (_data(g, 5, 1100), _data(g, 1100, 9))],
        "b": [(_data(g, 16, 300), _data(g, 300, 900)), (_data(g, 128, 513), _data(g, 70, 513).t())],
    }
    want = {k: [_eager(G.exact_matmul, a, b) for a, b in v] for k, v in jobs.items()}
    errors, bufs = [], {}
    start = threading.Barrier(2)

    def run(name):
        try:
            start.wait()
            for _ in range(6):
                for (a, b), y in zip(jobs[name], want[name], strict=True):
                    if not torch.equal(bits(G.exact_matmul(a, b)), bits(y)):
                        errors.append(name)
            bufs[name] = {k: v.untyped_storage().data_ptr() for k, v in G._ws.bufs.items()}
        except BaseException as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(n,)) for n in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not set(bufs["a"].values()) & set(bufs["b"].values())  # each thread its own buffers


def test_reentrant_call_gets_fresh_buffers(monkeypatch):
    """A product started while this thread's workspaces are in use (here from inside the column
    quantiser) leaves them to the outer call."""
    g = torch.Generator().manual_seed(89)
    a, b = _data(g, 20, 700), _data(g, 700, 30)
    c, d = _data(g, 7, 600), _data(g, 600, 11)
    want_ab, want_cd = _eager(G.exact_matmul, a, b), _eager(G.exact_matmul, c, d)
    real = kernels.quant_cols
    inner = []

    def nested(x, s, out=None, need_ss=True):
        if not inner:
            inner.append(None)
            assert G._ws.busy
            inner[0] = G.exact_matmul(c, d)
        return real(x, s, out=out, need_ss=need_ss)
    monkeypatch.setattr(kernels, "quant_cols", nested)
    _same(G.exact_matmul(a, b), want_ab)
    _same(inner[0], want_cd)
    assert not G._ws.busy


def test_workspace_cap(monkeypatch):
    g = torch.Generator().manual_seed(97)
    small, big = (_data(g, 8, 600), _data(g, 600, 8)), (_data(g, 64, 2000), _data(g, 2000, 300))
    want = [_eager(G.exact_matmul, *p) for p in (small, big)]
    monkeypatch.setenv(G.WORKSPACE_ENV, "0")
    G.release_workspaces()
    for p, y in zip((small, big), want, strict=True):
        _same(G.exact_matmul(*p), y)
    assert not G._ws.bufs  # off: every buffer fresh
    monkeypatch.setenv(G.WORKSPACE_ENV, "1")  # 1 MiB: the small product's buffers, not the big one's
    for _ in range(2):
        for p, y in zip((small, big), want, strict=True):
            _same(G.exact_matmul(*p), y)
    assert 0 < sum(b.numel() for b in G._ws.bufs.values()) <= 1 << 20  # bytes
    monkeypatch.setenv(G.WORKSPACE_ENV, "lots")
    G.release_workspaces()  # the cap is read when a buffer grows
    with pytest.raises(G.ExactError):
        G.exact_matmul(*small)
    monkeypatch.delenv(G.WORKSPACE_ENV)
    G.release_workspaces()


@pytest.mark.parametrize("matmul", ["single", "hilo"])
def test_gpt_walk_identical_with_and_without_kernels_and_workspaces(matmul, monkeypatch):
    spec = _spec(matmul)
    want = _walk(spec)
    with kernels.disabled():
        assert _walk(spec) == want
    monkeypatch.setenv(G.WORKSPACE_ENV, "0")
    assert _walk(spec) == want


def test_kernel_cauchy_schwarz_bound_takes_one_gemm_between_2_52_and_2_53(monkeypatch):
    """Operands whose kernel-computed norm product lies between 2^52 and 2^53: the CPU kernels'
    sums of squares have a known error, so one GEMM is proven exact there (KERNEL_ONE_GEMM_BOUND)
    where the eager path, with vector_norm's looser accuracy, still chunks; both give the same
    bytes."""
    g = torch.Generator().manual_seed(11)
    k, n_big = 3072, 1536
    sign = lambda *s: torch.randint(0, 2, s, generator=g).to(torch.float32) * 2 - 1  # noqa: E731
    a = torch.randn(8, k, generator=g) * 1e-3
    b = torch.randn(k, 24, generator=g) * 1e-3
    a[:, :n_big] = sign(8, n_big)
    b[:n_big, :] = sign(n_big, 24)
    nc, kc = G.k_chunks(k)
    s = dot_bits(kc)
    ssa = G._kernel_quant(a, -1, s, None, "qa", True)[2]
    ssb = G._kernel_quant(b, -2, s, None, "qb", True)[2]
    assert 2.0**52 < math.sqrt(ssa) * math.sqrt(ssb) <= G.KERNEL_ONE_GEMM_BOUND
    with kernels.disabled():
        want = G.exact_matmul(a, b)
        want_hi, want_lo = G.matmul_parts(a, b)

    def no_chunks(*args, **kw):
        raise AssertionError("the kernel path chunked a product its bound proves exact")

    monkeypatch.setattr(G, "_chunked_integer_matmul", no_chunks)
    got = G.exact_matmul(a, b)
    got_hi, got_lo = G.matmul_parts(a, b)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(got_hi.view(torch.int64), want_hi.view(torch.int64))
    assert got_lo is None and (want_lo is None or not bool(torch.any(want_lo != 0)))


def test_scale_parts_is_the_two_eager_scalings():
    """kernels.scale_parts (the one-pass scaling of a single matrix's parts) equals _scale's two
    in-place multiplies bit for bit, at the extremes of the block exponents too."""
    g = torch.Generator().manual_seed(31)
    x = torch.randn(37, 300, generator=g, dtype=torch.float64) * 2.0**40
    x = x.round()  # integers, as the parts are
    x[0, :4] = torch.tensor([0.0, -0.0, 2.0**62, -(2.0**62)], dtype=torch.float64)
    ea = torch.randint(-149, 128, (37,), generator=g)
    eb = torch.randint(-149, 128, (300,), generator=g)
    ea[:2] = torch.tensor([-149, 127])
    eb[:2] = torch.tensor([-149, 127])
    want = G._scale(x.clone(), None, pow2(ea - 22).view(-1, 1), pow2(eb - 22).view(1, -1))[0]
    got = kernels.scale_parts(x.clone(), ea, eb, 22)
    _same(got, want)
