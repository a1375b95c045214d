"""Quantisation, exact sums and exact GEMMs against rational-arithmetic references."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from oracle.exact import gemm as G
from oracle.exact import quant as Q
from tests.oracle.vectors.edge import bits

F32MAX = float(np.finfo(np.float32).max)


def _frac_quantised_row(vals, s):
    """Reference quantisation of one block with Python integers: q and the scale exponent."""
    m = max((abs(v) for v in vals), default=0.0)
    e = 0 if m == 0 else math.frexp(m)[1]
    e = max(e, Q.E_MIN)
    qs = [round(Fraction(v) * Fraction(2) ** (s - e)) for v in vals]  # Python round: half to even
    return qs, e - s


def _ref_matmul(a, b, variant):
    """float32 reference of the exact-v1 product from integer arithmetic."""
    m, k = a.shape
    n = b.shape[1]
    A, B = a.double().tolist(), b.double().tolist()
    out = torch.empty(m, n, dtype=torch.float32)
    if variant == "single":
        s = Q.dot_bits(G.k_chunks(k)[1])
        qa = [_frac_quantised_row(r, s) for r in A]
        qb = [_frac_quantised_row([B[i][j] for i in range(k)], s) for j in range(n)]
        for i in range(m):
            for j in range(n):
                N = sum(x * y for x, y in zip(qa[i][0], qb[j][0], strict=True))
                out[i, j] = Q.round_scaled_int_to_f32(N, qa[i][1] + qb[j][1])
        return out
    s = Q.hilo_bits(k)

    def split(vals):
        q, sc = _frac_quantised_row(vals, s)
        e = sc + s
        his, los = [], []
        for v in vals:
            scaled = Fraction(v) * Fraction(2) ** (s - e)
            hi = round(scaled)
            los.append(round((scaled - hi) * 2**s))
            his.append(hi)
        return his, los, e
    sa = [split(r) for r in A]
    sb = [split([B[i][j] for i in range(k)]) for j in range(n)]
    for i in range(m):
        ha, la, ea = sa[i]
        for j in range(n):
            hb, lb, eb = sb[j]
            N = sum(x * y for x, y in zip(ha, hb, strict=True)) * 2**s
            N += sum(x * y for x, y in zip(ha, lb, strict=True)) + sum(
                x * y for x, y in zip(la, hb, strict=True)
            )
            out[i, j] = Q.round_scaled_int_to_f32(N, ea + eb - 3 * s)
    return out


def _rand(shape, seed, spread=8.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * spread)).float()


def test_bit_budgets():
    assert Q.sum_bits(1) == 53 and Q.sum_bits(2) == 52 and Q.sum_bits(768) == 43
    assert Q.dot_bits(768) == 21 and Q.dot_bits(3072) == 20 and Q.dot_bits(50304) == 18
    for n in (1, 2, 3, 768, 1024, 1025, 3072, 50304, 2**20):
        assert 2 * Q.dot_bits(n) + Q.log2_ceil(n) <= 53
        assert Q.sum_bits(n) + Q.log2_ceil(n) <= 53
        assert 2 * Q.hilo_bits(n) + Q.log2_ceil(n) <= 52


@pytest.mark.parametrize("variant", ["single", "hilo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matmul_equals_integer_reference(variant, seed):
    a, b = _rand((5, 7), seed), _rand((7, 4), seed + 100)
    assert torch.equal(bits(G.exact_matmul(a, b, variant)), bits(_ref_matmul(a, b, variant)))


@pytest.mark.parametrize("k", [512, 513, 1100, 2048])
def test_chunked_single_slice_equals_integer_reference(k):
    # beyond one chunk the integer sum passes 2^53 and is carried exactly as hi + lo
    a, b = _rand((3, k), k, 2.0), _rand((k, 2), k + 1, 2.0)
    nc, kc = G.k_chunks(k)
    assert nc * kc >= k and kc <= G.K_CHUNK and (nc > 1) == (k > G.K_CHUNK)
    assert torch.equal(bits(G.exact_matmul(a, b, "single")), bits(_ref_matmul(a, b, "single")))
    # batched form: same bytes per batch entry
    ab = torch.stack([a, a * 2])
    bb = torch.stack([b, b])
    got = G.exact_matmul(ab, bb, "single")
    assert torch.equal(bits(got[0]), bits(G.exact_matmul(a, b, "single")))


@pytest.mark.parametrize("kern", [True, False])
def test_one_gemm_shortcut_equals_chunked_sum(monkeypatch, kern):
    # with a bound of 0 the chunked path always runs; the result must not change
    from oracle.exact import kernels

    a, b = _rand((6, 1500), 41, 1.0), _rand((1500, 5), 42, 1.0)
    with (kernels.disabled() if not kern else _nullctx()):
        fast = G.exact_matmul(a, b, "single")
        monkeypatch.setattr(G, "ONE_GEMM_BOUND", 0.0)
        chunked = G.exact_matmul(a, b, "single")
    assert torch.equal(bits(fast), bits(chunked))
    assert torch.equal(bits(fast), bits(_ref_matmul(a, b, "single")))


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_chunked_sum_beyond_two_to_the_53_stays_exact():
    # equal-sign values at the top of their blocks: the integer total passes 2^53, so the running
    # float64 sum would round and the split-sum path must carry it
    k = 2048
    v = 1.0 - 2.0**-22
    a = torch.full((2, k), v)
    a[1] *= -1
    a[0, 7] = 0.7
    b = torch.full((k, 3), v)
    s = Q.dot_bits(G.k_chunks(k)[1])
    assert k * (2**s - 1) ** 2 > 2**53
    assert torch.equal(bits(G.exact_matmul(a, b, "single")), bits(_ref_matmul(a, b, "single")))


@pytest.mark.parametrize("variant", ["single", "hilo"])
def test_matmul_subnormal_results_round_once(variant):
    # Products land in float32's subnormal range, where rescaling after a rounding would round twice.
    g = torch.Generator().manual_seed(7)
    a = (torch.rand(6, 9, generator=g) + 0.5) * 2.0**-70
    b = (torch.rand(9, 5, generator=g) - 0.5) * 2.0**-70
    a, b = a.float(), b.float()
    got = G.exact_matmul(a, b, variant)
    assert (got.abs() < 2.0**-126).any() and (got != 0).any()
    assert torch.equal(bits(got), bits(_ref_matmul(a, b, variant)))


def test_matmul_ties_round_to_even():
    # 1 * (1 + 2^-24) is a tie between 1 and 1 + 2^-23 in float32: even wins (1.0);
    # 1 * (1 + 3 * 2^-24) ties between 1 + 2^-23 and 1 + 2^-22: even wins (1 + 2^-22).
    a = torch.tensor([[1.0, 1.0]], dtype=torch.float32)
    for extra, want in ((2.0**-24, 1.0), (3 * 2.0**-24, 1.0 + 2.0**-22)):
        b = torch.tensor([[1.0], [extra]], dtype=torch.float32)
        assert G.exact_matmul(a, b, "hilo").item() == want
        assert _ref_matmul(a, b, "hilo").item() == want


def test_matmul_overflow_is_ieee_infinity():
    a = torch.full((1, 4), 3e38, dtype=torch.float32)
    b = torch.full((4, 1), 2.0, dtype=torch.float32)
    assert G.exact_matmul(a, b).item() == math.inf
    assert G.exact_matmul(a, -b).item() == -math.inf


def test_matmul_non_finite_classes():
    inf, nan = math.inf, math.nan
    a = torch.tensor([[inf, 1.0], [inf, 0.0], [inf, 1.0], [nan, 1.0], [1.0, 2.0], [-inf, 1.0]])
    b = torch.tensor([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0]])
    got = G.exact_matmul(a, b)
    # reference: IEEE float64 products summed term by term (no zero-skipping)
    want = torch.empty(6, 3, dtype=torch.float32)
    for i in range(6):
        for j in range(3):
            terms = [a[i, t].item() * b[t, j].item() for t in range(2)]
            want[i, j] = math.fsum(terms) if all(math.isfinite(t) for t in terms) else sum(terms)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    fin = ~torch.isnan(want)
    assert torch.equal(got[fin], want[fin])
    assert (bits(got[torch.isnan(got)]) == 0x7FC00000).all()


def test_matmul_independent_of_threads_and_batch_split():
    a, b = _rand((33, 300), 11, 3.0), _rand((300, 17), 12, 3.0)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = G.exact_matmul(a, b)
        torch.set_num_threads(max(2, old))
        two = G.exact_matmul(a, b)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(bits(one), bits(two))
    # rows computed separately (a different GEMM blocking) give the same bytes
    rows = torch.cat([G.exact_matmul(a[i:i + 1], b) for i in range(a.shape[0])])
    assert torch.equal(bits(one), bits(rows))


def test_exact_sum_equals_rational_reference():
    rnd = random.Random(5)
    for n in (1, 2, 3, 10, 257, 4000):
        x = _rand((n,), rnd.randrange(1000), 10.0)
        s = Q.sum_bits(n)
        q, sc = _frac_quantised_row(x.double().tolist(), s)
        want = Q.round_scaled_int_to_f32(sum(q), sc)
        got = Q.exact_sum64(x, 0).to(torch.float32).item()
        assert got == want or (got == 0 and want == 0)
    # independent of order
    x = _rand((4096,), 3, 6.0)
    perm = torch.randperm(4096, generator=torch.Generator().manual_seed(1))
    assert Q.exact_sum64(x, 0).item() == Q.exact_sum64(x[perm], 0).item()


def test_exact_sum_non_finite_classes():
    inf, nan = math.inf, math.nan
    rows = torch.tensor(
        [[1.0, inf, 2.0], [1.0, -inf, 0.0], [inf, -inf, 0.0], [nan, 1.0, 2.0], [1.0, 2.0, 3.0]]
    )
    got = Q.exact_sum64(rows, 1)
    assert got[0] == inf and got[1] == -inf and math.isnan(got[2]) and math.isnan(got[3]) and got[4] == 6.0


def test_to_f32_once_matches_rational_rounding():
    rnd = random.Random(9)
    for _ in range(3000):
        e = rnd.randrange(-200, 127)
        hi = math.ldexp(rnd.random() + 0.5, e) * rnd.choice((1, -1))
        lo = math.ldexp(rnd.random() - 0.5, e - 53 - rnd.randrange(0, 30))
        if rnd.random() < 0.2:  # exact float32 midpoints: the low word decides the tie
            h32 = float(np.float32(hi))
            hi = h32 + math.ldexp(1.0, math.frexp(h32)[1] - 25) * (1 if h32 > 0 else -1)
            lo = rnd.choice((0.0, math.ldexp(1.0, e - 80), -math.ldexp(1.0, e - 80)))
        hs, ls = Q.two_sum(torch.tensor(hi, dtype=torch.float64), torch.tensor(lo, dtype=torch.float64))
        got = Q.to_f32_once(hs, ls).item()
        want = Q.fraction_to_f32(Fraction(hi) + Fraction(lo))
        assert got == want, (hi, lo, got, want)


def test_round_scaled_int_to_f32_edges():
    assert Q.round_scaled_int_to_f32(1, -149) == 2.0**-149
    assert Q.round_scaled_int_to_f32(1, -150) == 0.0          # tie with 0: even
    assert Q.round_scaled_int_to_f32(3, -151) == 2.0**-149     # 0.75 ulp rounds up
    assert Q.round_scaled_int_to_f32(2**24 + 1, 0) == 2.0**24  # tie: even
    assert Q.round_scaled_int_to_f32(2**24 + 3, 0) == 2.0**24 + 4
    assert Q.round_scaled_int_to_f32(1, 128) == math.inf
    assert Q.round_scaled_int_to_f32(-(2**24 - 1), 104) == -F32MAX


def test_canonical_nan_bits():
    odd = torch.from_numpy(np.array([0xFFC01234], dtype=np.uint32).view(np.float32))
    assert bits(Q.canon_nan(odd)).item() == 0x7FC00000


def test_quantise_rejects_bad_variant_and_shapes():
    with pytest.raises(Q.ExactError, match="variant"):
        G.exact_matmul(torch.ones(2, 2), torch.ones(2, 2), "triple")
    with pytest.raises(Q.ExactError, match="inner sizes"):
        G.exact_matmul(torch.ones(2, 3), torch.ones(2, 2))


GPT2_SHAPES = [((256, 768), (768, 768)), ((256, 768), (768, 3072)), ((256, 3072), (3072, 768))]


@pytest.mark.parametrize("sa,sb", GPT2_SHAPES)
def test_gemm_accuracy_against_float64_on_gpt2_shapes(sa, sb):
    g = torch.Generator().manual_seed(sum(sa) + sum(sb))
    a = torch.randn(sa, generator=g)
    b = torch.randn(sb, generator=g) * 0.02
    ref = a.double() @ b.double()

    def err(c):
        return (c.double() - ref).abs().mean().item()

    e_torch = err(a @ b)
    e_single = err(G.exact_matmul(a, b, "single"))
    e_hilo = err(G.exact_matmul(a, b, "hilo"))
    assert e_single <= 4 * e_torch, (e_single, e_torch)
    assert e_hilo < e_torch, (e_hilo, e_torch)
    # hi/lo is (nearly) the correctly rounded result: its error is float32's own rounding
    e_rounded = err(ref.float())
    assert e_hilo <= 1.01 * e_rounded


def test_block_exponent_from_the_bits_equals_frexp():
    """The integer-only exponent read (same on every device) equals frexp's, clamped, on float64
    values across the whole range (subnormals, E_MIN's neighbours, the largest finite) and float32."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-1074, 1023, (50000,), generator=g).double())
    edges = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308,
             1.0, 0.5, 0.9999999999999999, 2.0**-960, 2.0**-961, 2.0**-962, 2.0**-959 * 0.75]
    x = torch.cat([x, torch.tensor(edges, dtype=torch.float64)]).abs()
    x = x[torch.isfinite(x)]
    for v in (x, x.float()[torch.isfinite(x.float())]):
        _, e = torch.frexp(v.to(torch.float64))
        e = e.to(torch.int64)
        want = torch.clamp(torch.where(v == 0, torch.zeros_like(e), e), min=Q.E_MIN)
        assert torch.equal(Q.block_exponent(v), want)
