"""Conformance vectors (tests/oracle/vectors/exact_v1.json): the eager definitions and the numba
kernels reproduce every stored output bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from oracle.exact import gemm as G
from oracle.exact import kernels, ops
from oracle.exact import quant as Q
from oracle.exact import transcendental as tx
from tests.oracle.vectors.make_vectors import ELEMENTWISE, PATH, unhx

DOC = json.loads(PATH.read_text())


def _eq(got: torch.Tensor, want_hex: list[str], what: str) -> None:
    want = unhx(want_hex, got.shape)
    gb = got.contiguous().view(torch.int32 if got.dtype == torch.float32 else torch.int64)
    wb = want.view(torch.int32 if want.dtype == torch.float32 else torch.int64)
    bad = (gb != wb).nonzero()
    assert bad.numel() == 0, f"{what}: {bad.shape[0]} outputs differ, first at {bad[:3].tolist()}"


def test_vector_file_is_substantial():
    assert len(DOC["elementwise"]["x"]) >= 400
    assert len(DOC["rows"]) >= 10 and len(DOC["matmul"]) >= 5


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_eager(name):
    x = unhx(DOC["elementwise"]["x"])
    with kernels.disabled():
        _eq(ELEMENTWISE[name](x), DOC["elementwise"][name], name)


@pytest.mark.parametrize("form", ["tanh", "erf"])
def test_gelu_grad_eager_and_kernel(form):
    x, g = unhx(DOC["elementwise"]["x"]), unhx(DOC["elementwise"]["g"])
    _eq(tx.gelu_grad32(x, g, form), DOC["elementwise"][f"gelu_{form}_grad"], f"gelu_{form}_grad eager")
    if kernels.enabled():
        _eq(
            kernels.gelu_grad(x, g, form), DOC["elementwise"][f"gelu_{form}_grad"], f"gelu_{form}_grad kernel"
        )
        _eq(kernels.gelu(x, form), DOC["elementwise"][f"gelu_{form}"], f"gelu_{form} kernel")


@pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available")
def test_exp_kernel():
    _eq(kernels.exp(unhx(DOC["elementwise"]["x"])), DOC["elementwise"]["exp"], "exp kernel")


def test_rows_eager_and_kernel():
    impls = [("eager", ops.softmax_rows_eager, ops.log_softmax_rows_eager, ops.softmax_bwd_rows_eager,
              ops.log_softmax_bwd_rows_eager)]
    if kernels.enabled():
        impls.append(("kernel", kernels.softmax_rows, kernels.log_softmax_rows, kernels.softmax_bwd_rows,
                      kernels.log_softmax_bwd_rows))
    for case in DOC["rows"]:
        x, g = unhx(case["x"], case["shape"]), unhx(case["g"], case["shape"])
        p, y = unhx(case["softmax"], case["shape"]), unhx(case["log_softmax"], case["shape"])
        for name, sm, lsm, smb, lsmb in impls:
            _eq(sm(x), case["softmax"], f"softmax {name}")
            _eq(lsm(x), case["log_softmax"], f"log_softmax {name}")
            _eq(smb(p, g), case["softmax_bwd"], f"softmax_bwd {name}")
            _eq(lsmb(y, g), case["log_softmax_bwd"], f"log_softmax_bwd {name}")


def test_matmul_and_sum():
    for case in DOC["matmul"]:
        a, b = unhx(case["a"], case["a_shape"]), unhx(case["b"], case["b_shape"])
        for v in ("single", "hilo"):
            _eq(G.exact_matmul(a, b, v), case[v], f"matmul {v} {case['a_shape']}")
            # and transposed operands (the linear layout) give the same bytes
            _eq(G.exact_matmul(a, b.t().contiguous().t(), v), case[v], f"matmul {v} strided")
    for case in DOC["sum"]:
        x = unhx(case["x"], case["shape"])
        _eq(Q.exact_sum64(x, 1).float(), case["sum_dim1"], "sum dim 1")
        _eq(Q.exact_sum64(x, None).float(), case["sum_all"], "sum all")


# --- the Llama family's ops: forward and backward through the autograd ops --------------------


def _through(op, *inputs):
    """op(*inputs) with float32 inputs needing grad; returns (output, the function taking g to
    the input gradients)."""
    xs = [t.clone().requires_grad_(True) for t in inputs]
    y = op(*xs)

    def grads(g):
        return torch.autograd.grad(y, xs, g)
    return y.detach(), grads


@pytest.mark.parametrize("name", ["sigmoid", "silu"])
def test_sigmoid_silu_ops(name):
    x, g = unhx(DOC["elementwise"]["x"]), unhx(DOC["elementwise"]["g"])
    y, grads = _through(getattr(ops, name), x)
    _eq(y, DOC["elementwise"][name], f"{name} op")
    _eq(grads(g)[0], DOC["elementwise"][f"{name}_grad"], f"{name} op backward")


def test_rms_norm_op():
    assert len(DOC["rms_norm"]) >= 15
    for case in DOC["rms_norm"]:
        x, g = unhx(case["x"], case["shape"]), unhx(case["g"], case["shape"])
        if "w" in case:
            w = unhx(case["w"])
            y, grads = _through(lambda x, w, e=case["eps"]: ops.rms_norm(x, w, e), x, w)
            dx, dw = grads(g)
            _eq(dw, case["dw"], f"rms_norm dw {case['shape']}")
        else:
            y, grads = _through(lambda x, e=case["eps"]: ops.rms_norm(x, None, e), x)
            (dx,) = grads(g)
        _eq(y, case["y"], f"rms_norm {case['shape']}")
        _eq(dx, case["dx"], f"rms_norm dx {case['shape']}")


def test_rope_op_and_tables():
    for case in DOC["rope"]:
        x, g = unhx(case["x"], case["shape"]), unhx(case["g"], case["shape"])
        half = [case["shape"][0], case["shape"][1] // 2]
        c, s = unhx(case["cos"], half), unhx(case["sin"], half)
        y, grads = _through(lambda x, c=c, s=s: ops.rope(x, c, s), x)
        _eq(y, case["y"], f"rope {case['shape']}")
        _eq(grads(g)[0], case["dx"], f"rope dx {case['shape']}")
    for case in DOC["rope_tables"]:
        c, s = ops.rope_tables(case["n_pos"], case["head_dim"], case["theta"])
        _eq(c, case["cos"], f"rope cos table {case['n_pos']}x{case['head_dim']}")
        _eq(s, case["sin"], f"rope sin table {case['n_pos']}x{case['head_dim']}")
