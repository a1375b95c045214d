"""The Llama family's exact ops (sigmoid, SiLU, mul, RMSNorm, rotary embeddings, grouped-query
heads) against float64 references, their edge cases and argument errors, and micro-batch
independence of the RMSNorm weight gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oracle import native
from oracle.exact import ExactError, ExactGradAccumulator, ops
from oracle.exact import transcendental as tx
from tests.oracle.vectors.edge import bits, edge_values


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-300)).item()


def _ulps(a: torch.Tensor, b64: torch.Tensor) -> float:
    """max |a - b| in float32 ulps of b (finite b only)."""
    with np.errstate(over="ignore"):  # the spacing above the largest float32 is inf
        ulp = torch.tensor(np.spacing(np.abs(b64.float().numpy())), dtype=torch.float64)
    return ((a.double() - b64).abs() / ulp).max().item()


def test_sigmoid_and_silu_are_accurate():
    x = torch.cat([edge_values(), torch.randn(5000, generator=_g(1)) * 8]).float()
    fin = torch.isfinite(x)
    ref_s = torch.sigmoid(x.double())
    ref_y = x.double() * ref_s
    assert _ulps(ops.sigmoid(x)[fin], ref_s[fin]) <= 1.0
    assert _ulps(ops.silu(x)[fin], ref_y[fin]) <= 1.0
    y = ops.silu(x)
    # limits and special values: the output is never NaN for a non-NaN input
    assert not torch.isnan(y[~torch.isnan(x)]).any()
    assert bits(ops.silu(torch.tensor([-math.inf, math.inf, -0.0, 0.0]))).tolist() == \
        bits(torch.tensor([-0.0, math.inf, -0.0, 0.0])).tolist()
    assert ops.sigmoid(torch.tensor([-math.inf, math.inf, -200.0])).tolist() == [0.0, 1.0, 0.0]
    assert bits(ops.silu(torch.tensor([math.nan]))).tolist() == [0x7FC00000]


def test_sigmoid_and_silu_gradients():
    x = torch.cat(
        [torch.randn(4000, generator=_g(2)) * 6, torch.tensor([-1e30, 1e30, -100.0, 100.0])]
    ).float()
    g = torch.randn(x.shape, generator=_g(3)).float()
    x64 = x.double().requires_grad_(True)
    torch.nn.functional.silu(x64).backward(g.double())
    xs = x.clone().requires_grad_(True)
    ops.silu(xs).backward(g)
    assert _rel(xs.grad, x64.grad) < 2 ** -22
    s64 = x.double().requires_grad_(True)
    torch.sigmoid(s64).backward(g.double())
    xs = x.clone().requires_grad_(True)
    ops.sigmoid(xs).backward(g)
    assert _rel(xs.grad, s64.grad) < 2 ** -22
    inf = torch.tensor([math.inf, -math.inf]).requires_grad_(True)
    ops.silu(inf).backward(torch.ones(2))
    assert inf.grad.tolist() == [1.0, 0.0]


def test_rms_norm_matches_float64_and_native():
    x = (torch.randn(3, 5, 96, generator=_g(4)) * 3).float()
    w = (1 + 0.1 * torch.randn(96, generator=_g(5))).float()
    g = torch.randn(3, 5, 96, generator=_g(6)).float()
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = ops.rms_norm(xs, ws, 1e-6)
    y.backward(g)
    x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ref = native.rms_norm(x64, w64, 1e-6)
    ref.backward(g.double())
    assert _rel(y, ref) < 2 ** -23
    assert _rel(xs.grad, x64.grad) < 2 ** -21
    assert _rel(ws.grad, w64.grad) < 2 ** -21
    # an all-zero row is rstd = 1/sqrt(eps) times zero, its gradient finite
    z = torch.zeros(1, 8, requires_grad=True)
    ops.rms_norm(z, None, 1e-6).backward(torch.ones(1, 8))
    assert torch.isfinite(z.grad).all()


def test_rms_norm_weight_gradient_independent_of_the_split():
    x = torch.randn(6, 7, 32, generator=_g(7)).float()
    w = (1 + 0.1 * torch.randn(32, generator=_g(8))).float()
    g = torch.randn(6, 7, 32, generator=_g(9)).float()

    def run(splits):
        leaf = w.clone().requires_grad_(True)
        acc = ExactGradAccumulator([leaf])
        for lo, hi in splits:
            with acc.micro_batch():
                ops.rms_norm(x[lo:hi], leaf, 1e-6).backward(g[lo:hi])
        return acc.grads()[0]

    one = run([(0, 6)])
    for splits in ([(0, 3), (3, 6)], [(0, 1), (1, 2), (2, 6)]):
        assert bits(run(splits)).tolist() == bits(one).tolist()
    leaf = w.clone().requires_grad_(True)
    ops.rms_norm(x, leaf, 1e-6).backward(g)  # outside an accumulator: the same rounded gradient
    assert bits(leaf.grad).tolist() == bits(one).tolist()


def test_rope_tables_are_accurate():
    for t, d, theta in ((128, 64, 10000.0), (4096, 128, 500000.0)):
        c, s = ops.rope_tables(t, d, theta)
        i = torch.arange(0, d, 2, dtype=torch.float64)
        ang = torch.arange(t, dtype=torch.float64)[:, None] * (theta ** (-i / d))[None, :]
        assert _ulps(c, torch.cos(ang)) <= 1.0
        assert _ulps(s, torch.sin(ang)) <= 1.0
    inv = tx.rope_inv_freq_f64(64, 10000.0)
    want = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert ((inv - want).abs() / want).max() < 2e-15  # exp64 of an argument up to 9.2: ~10 ulp of it
    assert inv[0].item() == 1.0


def test_rope_matches_float64_and_is_a_rotation():
    t, d = 9, 16
    c, s = ops.rope_tables(t, d, 10000.0)
    x = torch.randn(2, 3, t, d, generator=_g(10)).float()
    g = torch.randn(2, 3, t, d, generator=_g(11)).float()
    xs = x.clone().requires_grad_(True)
    y = ops.rope(xs, c, s)
    y.backward(g)
    x64 = x.double().requires_grad_(True)
    ref = native.rope(x64, c.double(), s.double())
    ref.backward(g.double())
    assert _rel(y, ref) < 2 ** -23 and _rel(xs.grad, x64.grad) < 2 ** -23
    # a rotation keeps each pair's norm; position 0 is the identity
    assert bits(y[:, :, 0]).tolist() == bits(x[:, :, 0]).tolist()
    n_in = x[..., :8] ** 2 + x[..., 8:] ** 2
    n_out = y[..., :8].double() ** 2 + y[..., 8:].double() ** 2
    assert _rel(n_out, n_in.double()) < 1e-6


def test_grouped_query_attention():
    B, H, Hkv, T, D = 2, 6, 2, 5, 8
    q = torch.randn(B, H, T, D, generator=_g(12)).float()
    k = torch.randn(B, Hkv, T, D, generator=_g(13)).float()
    v = torch.randn(B, Hkv, T, D, generator=_g(14)).float()
    g = torch.randn(B, H, T, D, generator=_g(15)).float()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    y = ops.causal_attention(*leaves)
    y.backward(g)
    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    rq, rk, rv = ref_leaves
    ref = native.causal_attention(rq, native.repeat_heads(rk, 3), native.repeat_heads(rv, 3))
    ref.backward(g.double())
    assert _rel(y, ref) < 2 ** -20
    for a, b in zip(leaves, ref_leaves, strict=True):
        assert _rel(a.grad, b.grad) < 2 ** -20
    # widening the kv heads by hand gives the same bytes forward and backward
    k2, v2 = (t.clone().requires_grad_(True) for t in (k, v))
    y2 = ops.causal_attention(q, ops.repeat_heads(k2, 3), ops.repeat_heads(v2, 3))
    y2.backward(g)
    assert bits(y2).tolist() == bits(y).tolist()
    assert bits(k2.grad).tolist() == bits(leaves[1].grad).tolist()


def test_repeat_heads_backward_is_an_exact_sum():
    # 1 + 2^-24 + 2^-24 + ... : a float32 left-to-right sum loses every small term, the exact sum does not
    g = torch.full((1, 4, 1, 1), 2.0 ** -24)
    g[0, 0] = 1.0
    x = torch.zeros(1, 1, 1, 1, requires_grad=True)
    ops.repeat_heads(x, 4).backward(g)
    assert x.grad.item() == 1.0 + 2.0 ** -22  # RN32(1 + 3 * 2^-24), a tie to even; a float32 sum gives 1
    with pytest.raises(ExactError, match="n_rep"):
        ops.repeat_heads(torch.zeros(1, 1, 1, 1), 0)


def test_argument_errors_name_the_problem():
    with pytest.raises(ExactError, match="rms_norm weight shape"):
        ops.rms_norm(torch.zeros(2, 4), torch.ones(3))
    with pytest.raises(ExactError, match="rms_norm eps"):
        ops.rms_norm(torch.zeros(2, 4), None, 0.0)
    with pytest.raises(ExactError, match="rope: tables"):
        ops.rope(torch.zeros(3, 4), torch.zeros(3, 3), torch.zeros(3, 3))
    with pytest.raises(ExactError, match="D even"):
        ops.rope(torch.zeros(3, 5), torch.zeros(3, 2), torch.zeros(3, 2))
    with pytest.raises(ExactError, match="head_dim"):
        ops.rope_tables(4, 3, 10000.0)
    with pytest.raises(ExactError, match="Hkv"):
        ops.causal_attention(torch.zeros(1, 4, 2, 2), torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2, 2))
    with pytest.raises(ExactError, match="mul: shapes"):
        ops.mul(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ExactError, match="float32"):
        ops.silu(torch.zeros(2, dtype=torch.float64))
