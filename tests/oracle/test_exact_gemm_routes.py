"""The slice route (int8 digits, torch._int_mm, int32 accumulation) gives the same bytes as the
float64 GEMM route: on the conformance vectors, on random shapes, across K chunks of the int32
accumulation, and on whole training steps."""

from __future__ import annotations

import pytest
import torch

from commitments.spec import Spec
from oracle.exact import gemm as G
from oracle.exact import kernels
from oracle.step import init_state, step
from tests.oracle.test_exact_vectors import DOC, _eq
from tests.oracle.vectors.make_vectors import unhx

pytestmark = pytest.mark.usefixtures("single_thread")

SLICED = ("int7", "int8")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int64)


@pytest.fixture
def sliced_calls(monkeypatch):
    """Counts the 2-D sliced products, so a test knows the route really ran."""
    calls = []
    real = G._int_mm_2d

    def spy(da, db, w):
        calls.append((len(da), len(db), w, da[0].shape[1]))
        return real(da, db, w)

    monkeypatch.setattr(G, "_int_mm_2d", spy)
    return calls


def test_slice_bounds():
    # 21-bit signed operands (|q| <= 2^20) take 3 seven-bit digits: 9 products; 22-bit ones 4.
    assert G.slice_count(20, 7) == 3 and G.slice_count(22, 7) == 4 and G.slice_count(26, 7) == 4
    assert G.slice_count(22, 8) == 3 and G.slice_count(26, 8) == 4 and G.slice_count(6, 7) == 1
    assert G.int32_chunk(7) == 1 << 18 and G.int32_chunk(8) == 1 << 16
    for w in (7, 8):  # the int32 headroom: a chunk of extreme digit products stays below 2^31
        assert G.int32_chunk(w) * (1 << (w - 1)) ** 2 < 2**31
        for b in range(1, 27):  # digits reproduce every extreme integer, top digit in range
            for q in (2**b, -(2**b), 2**b - 1, -(2**b) + 1, 0, 1, -1):
                d = G._digits(torch.tensor([float(q)], dtype=torch.float64), b, w)
                assert all(abs(int(x)) <= 1 << (w - 1) for x in d) and abs(int(d[-1])) <= 64
                assert sum(int(x) << (w * i) for i, x in enumerate(d)) == q
    # GPT-2 shapes are far inside the int64 bound
    assert G.sliced_bound(3072, 22, 22, 7) < G.INT64_BOUND


def test_digits_round_trip_random():
    g = torch.Generator().manual_seed(1)
    for b in (12, 20, 21, 22, 26):
        q = torch.randint(-(2**b), 2**b + 1, (5000,), generator=g, dtype=torch.int64)
        for w in (7, 8):
            d = G._digits(q.to(torch.float64), b, w)
            back = sum(x.to(torch.int64) << (w * i) for i, x in enumerate(d))
            assert torch.equal(back, q)


def test_int32_accumulation_needs_the_k_chunks():
    """Positive control: without K chunks, extreme 8-bit digits overflow int32 (so the chunking is
    load-bearing), and with them the route gives the exact integer."""
    k = 1 << 17
    a = torch.full((17, k), -128, dtype=torch.int8)
    b = torch.full((k, 8), -128, dtype=torch.int8)
    assert int(torch._int_mm(a, b.t().contiguous().t())[0, 0]) != k * 128 * 128  # wrapped
    n = G._int_mm_2d([a], [b], 8)
    assert int(n[0, 0]) == k * 128 * 128 and n.dtype == torch.int64


@pytest.mark.parametrize("name", SLICED)
def test_conformance_vectors(name, sliced_calls):
    with G.route(name):
        for case in DOC["matmul"]:
            a, b = unhx(case["a"], case["a_shape"]), unhx(case["b"], case["b_shape"])
            for v in ("single", "hilo"):
                _eq(G.exact_matmul(a, b, v), case[v], f"{name} matmul {v} {case['a_shape']}")
                _eq(G.exact_matmul(a, b.t().contiguous().t(), v), case[v], f"{name} matmul {v} strided")
            with kernels.disabled():  # the eager quantiser feeds the same route
                _eq(G.exact_matmul(a, b, "single"), case["single"], f"{name} eager single")
    assert sliced_calls


def _both_routes(fn, name):
    with G.route("dgemm"):
        want = fn()
    with G.route(name):
        got = fn()
    return want, got


@pytest.mark.parametrize("name", SLICED)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 7), (17, 64, 9), (33, 130, 40), (8, 700, 24),
                                   (64, 1537, 48), (2, 3072, 5)])
def test_random_shapes(name, m, k, n, sliced_calls):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    a = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-30, 30, (m, 1), generator=g).float())
    b = torch.randn(k, n, generator=g) * 0.02
    a[0, 0] = 0.0
    for v in ("single", "hilo"):
        want, got = _both_routes(lambda v=v: G.exact_matmul(a, b, v), name)
        assert torch.equal(bits(got), bits(want)), (name, v, m, k, n)
        (wh, wl), (gh, gl) = _both_routes(lambda v=v: G.matmul_parts(a, b, v), name)
        assert torch.equal(bits(gh), bits(wh))
        assert (wl is None or not bool(torch.any(wl != 0))) == (gl is None) or torch.equal(bits(gl), bits(wl))
    assert sliced_calls


@pytest.mark.parametrize("name", SLICED)
def test_nonfinite_zero_and_batched(name, sliced_calls):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(4, 3, 6, 40, generator=g)
    b = torch.randn(4, 3, 40, 5, generator=g)
    a[0, 0, 0, 0] = float("inf")
    a[1, 2, 3] = 0.0
    b[2, 1, :, 0] = float("nan")
    a[3, 0, 1, 5] = 1e-40  # subnormal
    for v in ("single", "hilo"):
        want, got = _both_routes(lambda v=v: G.exact_matmul(a, b, v), name)
        assert torch.equal(bits(got), bits(want)), v
    assert sliced_calls


@pytest.mark.parametrize("name,k", [("int8", 70_000), ("int7", 270_000)])
def test_k_beyond_one_int32_chunk(name, k, sliced_calls):
    """K longer than one int32 accumulation (2^16 for 8-bit digits, 2^18 for 7-bit): the route
    splits K and still equals the float64 route, which needs its chunked two-word sum here."""
    g = torch.Generator().manual_seed(k)
    a = torch.randn(3, k, generator=g)
    b = torch.randn(k, 2, generator=g)
    a[:, : k // 2] = 4.0  # a large, one-signed sum: an exact integer beyond 2^53
    b[: k // 2] = 4.0
    want, got = _both_routes(lambda: G.exact_matmul(a, b, "single"), name)
    assert torch.equal(bits(got), bits(want))
    (wh, wl), (gh, gl) = _both_routes(lambda: G.matmul_parts(a, b, "single"), name)
    assert torch.equal(bits(gh), bits(wh)) and wl is not None and gl is not None
    assert torch.equal(bits(gl), bits(wl))
    assert any(c[3] > G.int32_chunk(G.SLICE_BITS[name]) for c in sliced_calls)


def test_route_selection(monkeypatch):
    monkeypatch.delenv("POT_EXACT_GEMM", raising=False)
    assert G.gemm_route(torch.device("cpu")) == ("int8" if G.cpu_int8_exact() else "dgemm")
    with kernels.disabled():  # the CPU slice route is the compiled one: without kernels, float64
        assert G.gemm_route(torch.device("cpu")) == "dgemm"
    assert G.gemm_route(torch.device("cuda")) == "int7"
    monkeypatch.setenv("POT_EXACT_GEMM", "int8")
    assert G.gemm_route(torch.device("cpu")) == "int8"
    with G.route("dgemm"):
        assert G.gemm_route(torch.device("cuda")) == "dgemm"
    monkeypatch.setenv("POT_EXACT_GEMM", "fp8")
    with pytest.raises(G.ExactError, match="POT_EXACT_GEMM"):
        G.gemm_route(torch.device("cpu"))
    with pytest.raises(G.ExactError, match="gemm route"):
        with G.route("tf32"):
            pass


def _spec(matmul: str) -> Spec:
    return Spec.from_dict({
        "model": {"kind": "gpt", "vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32,
                  "dropout": 0.1},
        "optimizer": {"kind": "adamw", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
        "batch": {"batch_size": 3, "seq_len": 16},
        "rng": {"seed": 7},
        "exact": {"matmul": matmul},
    })


def _walk(spec, steps=3):
    st = init_state(spec)
    out = []
    for t in range(1, steps + 1):
        g = torch.Generator().manual_seed(t)  # test data only
        batch = torch.randint(0, spec.model.vocab_size, (spec.batch.batch_size, spec.sample_len), generator=g)
        st, loss = step(st, batch, spec, t)
        out.append((st.digest().hex(), loss.view(torch.int32).item()))
    return out


@pytest.mark.parametrize("matmul", ["single", "hilo"])
def test_gpt_steps_identical_on_every_route(matmul, sliced_calls):
    spec = _spec(matmul)
    with G.route("dgemm"):
        want = _walk(spec)
    assert not sliced_calls
    for name in SLICED:
        with G.route(name):
            assert _walk(spec) == want, name
    assert sliced_calls
