"""The exact ops and their gradients against float64 references, argument errors, and
independence from thread count."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oracle.exact import ExactError, ops
from oracle.exact import quant as Q
from tests.oracle.vectors.edge import bits


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (a normwise bound)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-300)).item()


def _check(op, ref, inputs, tol_out, tol_grad, seed=0):
    """Compare op(*inputs) and its input gradients with ref on float64 copies."""
    xs = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = op(*xs)
    gy = torch.randn(y.shape, generator=_g(seed)).float()
    y.backward(gy)
    x64 = [t.double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    r = ref(*x64)
    r.backward(gy.double())
    assert _rel(y.detach(), r.detach()) <= tol_out, ("out", _rel(y.detach(), r.detach()))
    for a, b in zip(xs, x64, strict=True):
        if a.is_floating_point():
            assert _rel(a.grad, b.grad) <= tol_grad, ("grad", _rel(a.grad, b.grad))
    return y


EPS32 = 2.0**-24


@pytest.mark.parametrize("variant", ["single", "hilo"])
def test_linear_and_matmul(variant):
    g = _g(1)
    x, w, b = (
        torch.randn(3, 5, 64, generator=g),
        torch.randn(32, 64, generator=g),
        torch.randn(32, generator=g),
    )
    tol = 64 * EPS32 if variant == "single" else 4 * EPS32
    _check(lambda x, w, b: ops.linear(x, w, b, variant=variant), F.linear, [x, w, b], tol, tol)
    a, c = torch.randn(2, 3, 7, 40, generator=g), torch.randn(2, 3, 40, 9, generator=g)
    _check(lambda a, c: ops.matmul(a, c, variant=variant), torch.matmul, [a, c], tol, tol)


def test_sum_mean():
    x = torch.randn(4, 50, 3, generator=_g(2)).float()
    for dim in (None, 0, 1, -1):
        for keep in (False, True):
            if dim is None and keep:
                continue
            _check(
                lambda t, d=dim, k=keep: ops.sum(t, d, k),
                lambda t, d=dim, k=keep: torch.sum(t) if d is None else torch.sum(t, d, k),
                [x],
                2 * EPS32,
                0.0,
            )
            _check(
                lambda t, d=dim, k=keep: ops.mean(t, d, k),
                lambda t, d=dim, k=keep: torch.mean(t) if d is None else torch.mean(t, d, k),
                [x],
                2 * EPS32,
                EPS32,
            )


def test_sum_is_exact_and_order_free():
    x = (torch.randn(1000, generator=_g(3)) * torch.exp(torch.randn(1000, generator=_g(4)) * 3)).float()
    got = ops.sum(x).item()
    s = Q.sum_bits(1000)
    m = x.abs().max().item()
    e = math.frexp(m)[1]
    q = sum(round(Fraction(v) * 2 ** (s - e)) for v in x.double().tolist())
    assert got == Q.round_scaled_int_to_f32(q, e - s)
    assert bits(ops.sum(x.flip(0))) == bits(ops.sum(x))


def test_softmax_log_softmax():
    x = (torch.randn(6, 33, generator=_g(5)) * 4).float()
    for dim in (-1, 0):
        _check(
            lambda t, d=dim: ops.softmax(t, d),
            lambda t, d=dim: torch.softmax(t, d),
            [x],
            2 * EPS32,
            8 * EPS32,
        )
        _check(lambda t, d=dim: ops.log_softmax(t, d), lambda t, d=dim: torch.log_softmax(t, d), [x],
               2 * EPS32, 8 * EPS32)


def test_layer_norm():
    g = _g(6)
    x, w, b = (
        torch.randn(2, 5, 48, generator=g) * 3 + 1,
        torch.randn(48, generator=g),
        torch.randn(48, generator=g),
    )
    _check(lambda x, w, b: ops.layer_norm(x, w, b), lambda x, w, b: F.layer_norm(x, (48,), w, b, 1e-5),
           [x, w, b], 4 * EPS32, 16 * EPS32)
    _check(lambda x: ops.layer_norm(x, None, None), lambda x: F.layer_norm(x, (48,), None, None, 1e-5),
           [x], 4 * EPS32, 16 * EPS32)


@pytest.mark.parametrize("form", ["tanh", "erf"])
def test_gelu(form):
    x = (torch.randn(7, 40, generator=_g(7)) * 3).float()
    _check(lambda t: ops.gelu(t, form), lambda t: F.gelu(t, approximate="tanh" if form == "tanh" else "none"),
           [x], 2 * EPS32, 4 * EPS32)


def test_embedding_and_exact_scatter_add():
    g = _g(8)
    w = torch.randn(10, 6, generator=g)
    idx = torch.tensor([[1, 1, 3, 9, 1], [0, 3, 3, 3, 2]])
    _check(ops.embedding, lambda i, w: F.embedding(i, w), [idx, w], 0.0, 2 * EPS32)
    # rows never used get exactly zero; a row used once gets its gradient unchanged
    wr = w.clone().requires_grad_(True)
    gy = torch.randn(2, 5, 6, generator=g)
    ops.embedding(idx, wr).backward(gy)
    assert (wr.grad[[4, 5, 6, 7, 8]] == 0).all()
    assert torch.equal(wr.grad[9], gy[0, 3])


def test_cross_entropy():
    g = _g(9)
    x = (torch.randn(3, 4, 11, generator=g) * 3).float()
    t = torch.randint(0, 11, (3, 4), generator=g)
    _check(lambda x: ops.cross_entropy(x, t), lambda x: F.cross_entropy(x.reshape(-1, 11), t.reshape(-1)),
           [x], 4 * EPS32, 4 * EPS32)
    _check(
        lambda x: ops.cross_entropy(x, t, total_count=100),
        lambda x: F.cross_entropy(x.reshape(-1, 11), t.reshape(-1), reduction="sum") / 100,
        [x],
        4 * EPS32,
        4 * EPS32,
    )


def test_dropout():
    x = torch.randn(4, 9, generator=_g(10)).float().requires_grad_(True)
    keep = torch.rand(4, 9, generator=_g(11)) > 0.3
    y = ops.dropout(x, 0.3, keep)
    kp = np.float32(1 - 0.3)
    want = np.where(keep.numpy(), x.detach().numpy() / kp, np.float32(0))
    assert np.array_equal(y.detach().numpy().view(np.int32), want.astype(np.float32).view(np.int32))
    y.backward(torch.ones_like(y))
    assert np.array_equal(x.grad.numpy(), np.where(keep.numpy(), np.float32(1) / kp, np.float32(0)))
    assert ops.dropout(x, 0.0, None) is x


@pytest.mark.parametrize("variant", ["single", "hilo"])
def test_causal_attention(variant):
    g = _g(12)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=g) for _ in range(3))

    def ref(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tol = 64 * EPS32 if variant == "single" else 16 * EPS32
    _check(lambda q, k, v: ops.causal_attention(q, k, v, variant=variant), ref, [q, k, v], tol, tol)
    keep = torch.rand(2, 3, 9, 9, generator=g) > 0.2

    def ref_drop(q, k, v):
        att = (q @ k.transpose(-2, -1)) / math.sqrt(8)
        att = att.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        return (att * keep / (1 - 0.2)) @ v
    _check(lambda q, k, v: ops.causal_attention(q, k, v, variant=variant, dropout_p=0.2, dropout_mask=keep),
           ref_drop, [q, k, v], tol, tol)


def test_add():
    a, b = torch.randn(3, 4, generator=_g(13)), torch.randn(3, 4, generator=_g(14))
    _check(ops.add, torch.add, [a, b], EPS32, 0.0)


def test_sum_of_squares_exact():
    g = _g(15)
    ts = [torch.randn(70000, generator=g) * 1e-3, torch.randn(3, 5, generator=g) * 1e3, torch.zeros(4),
          torch.tensor([1e-40, 3e18])]
    got = ops.sum_of_squares(ts)
    assert got.dtype == torch.float32 and got.dim() == 0
    # reference: the same chunk quantisation with exact rationals
    total = Fraction(0)
    for t in ts:
        flat = [v * v for v in t.double().reshape(-1).tolist()]
        for c in range(0, len(flat), ops.SOS_CHUNK):
            chunk = flat[c:c + ops.SOS_CHUNK]
            m = max(chunk)
            if m == 0:
                continue
            e = math.frexp(m)[1]
            s = Q.sum_bits(ops.SOS_CHUNK)
            total += Fraction(sum(round(Fraction(v) * 2 ** (s - e)) for v in chunk)) * Fraction(2) ** (e - s)
    assert got.item() == Q.fraction_to_f32(total)
    # order of the list matters only through the exact sum: permuted lists give the same bytes
    assert bits(ops.sum_of_squares(ts[::-1])) == bits(got)
    assert math.isnan(ops.sum_of_squares([torch.tensor([1.0, math.nan])]).item())
    assert ops.sum_of_squares([torch.tensor([1.0, -math.inf])]).item() == math.inf


def test_same_bytes_for_one_and_two_threads():
    g = _g(16)
    x, w = torch.randn(4, 8, 96, generator=g), torch.randn(200, 96, generator=g)
    t = torch.randint(0, 200, (4, 8), generator=g)
    old = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            loss = ops.cross_entropy(ops.gelu(ops.linear(ops.layer_norm(xr, None, None), wr), "erf"), t)
            loss.backward()
            outs.append([loss.detach(), xr.grad, wr.grad])
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*outs, strict=True):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ops.linear(torch.ones(2, 3, dtype=torch.float64), torch.ones(4, 3)), "expected float32"),
        (lambda: ops.linear(torch.ones(2, 3), torch.ones(4, 5)), "does not match"),
        (lambda: ops.linear(torch.ones(2, 3), torch.ones(4, 3), variant="fast"), "variant"),
        (lambda: ops.matmul(torch.ones(2, 3, 4), torch.ones(3, 4, 5)), "equal batch dims"),
        (lambda: ops.sum(torch.ones(2, 3), dim=5), "out of range"),
        (lambda: ops.embedding(torch.tensor([0, 7]), torch.ones(5, 2)), "index 7 outside"),
        (lambda: ops.embedding(torch.tensor([0.0]), torch.ones(5, 2)), "int64"),
        (lambda: ops.cross_entropy(torch.ones(2, 3), torch.tensor([0, 3])), "target 3 outside"),
        (lambda: ops.cross_entropy(torch.ones(2, 3), torch.tensor([[0, 1]])), "targets shape"),
        (lambda: ops.cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), total_count=0), "positive int"),
        (lambda: ops.dropout(torch.ones(2), 1.0, torch.ones(2, dtype=torch.bool)), "p must be"),
        (lambda: ops.dropout(torch.ones(2), 0.5, torch.ones(3, dtype=torch.bool)), "keep_mask shape"),
        (lambda: ops.dropout(torch.ones(2), 0.5, torch.ones(2)), "bool"),
        (lambda: ops.add(torch.ones(2, 3), torch.ones(3)), "shapes differ"),
        (lambda: ops.gelu(torch.ones(2), "relu"), "form"),
        (lambda: ops.layer_norm(torch.ones(2, 3), torch.ones(4), None), "weight shape"),
        (
            lambda: ops.causal_attention(torch.ones(2, 3, 4), torch.ones(2, 3, 4), torch.ones(2, 3, 4)),
            r"\[B, H, T, D\]",
        ),
        (lambda: ops.causal_attention(*(torch.ones(1, 1, 2, 2),) * 3, dropout_p=0.1), "dropout_mask"),
        (lambda: ops.sum_of_squares([]), "at least one"),
    ],
)
def test_bad_input_is_refused_with_a_reason(call, match):
    with pytest.raises(ExactError, match=match):
        call()


def test_non_finite_inputs_give_specified_outputs():
    inf = math.inf
    odd_nan = torch.from_numpy(np.array([0xFFC01234], dtype=np.uint32).view(np.float32))[0].item()
    x = torch.tensor([[1.0, 2.0], [inf, 1.0], [odd_nan, 1.0], [inf, -inf]])
    w = torch.tensor([[1.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    y = ops.linear(x, w)
    # row 1: inf*1 + 1 = inf; inf*0 -> NaN; -inf. Row 2: NaN. Row 3: inf - inf, then inf*0 twice: NaN
    assert y[0].tolist() == [3.0, 2.0, -1.0]
    assert y[1, 0] == inf and math.isnan(y[1, 1]) and y[1, 2] == -inf
    assert torch.isnan(y[2]).all()
    assert torch.isnan(y[3]).all()
    assert (bits(y[torch.isnan(y)]) == 0x7FC00000).all()
    for out in (ops.softmax(x, -1), ops.layer_norm(x, None, None), ops.add(x, x), ops.sum(x, 1)):
        assert (bits(out[torch.isnan(out)]) == 0x7FC00000).all()
    assert torch.isnan(ops.softmax(x, -1)[1:]).all() and not torch.isnan(ops.softmax(x, -1)[0]).any()
    s = ops.sum(x, 1)
    assert s[0] == 3.0 and s[1] == inf and math.isnan(s[2]) and math.isnan(s[3])
    big = torch.full((2, 3), 3e38)
    assert (ops.sum(big, 1) == inf).all()  # exact sum overflows float32: IEEE infinity
