"""bf16-mixed: the integer RN-even rounding to bfloat16, and steps whose bytes do not depend on
the kernels or the micro-batch split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from commitments.spec import Spec
from oracle import native, profiles
from oracle.exact import ExactError, kernels, ops
from oracle.exact.bf16 import round_bf16
from oracle.step import init_state, step
from tests.oracle.vectors.make_schedule_vectors import PATH

pytestmark = pytest.mark.usefixtures("single_thread")


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy().astype(np.uint32)


def _from_bits(u: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(u.astype(np.uint32).view(np.int32).copy()).view(torch.float32)


def test_round_bf16_reproduces_its_conformance_vectors():
    v = json.loads(Path(PATH).read_text())["round_bf16"]
    x = _from_bits(np.array([int(h, 16) for h in v["x"]], dtype=np.uint64))
    assert [f"{b:08x}" for b in _bits(round_bf16(x)).tolist()] == v["y"]


def test_round_bf16_equals_the_stock_conversion_on_every_upper_half():
    # every 16-bit upper half (sign, exponent, 7 mantissa bits) with the lower halves that decide
    # the rounding: exact, just below, at, just above the tie, and the largest
    hi = np.arange(2**16, dtype=np.uint64) << 16
    lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4321, 0xC0DE], dtype=np.uint64)
    x = _from_bits((hi[:, None] | lows[None, :]).reshape(-1))
    got, want = round_bf16(x), x.to(torch.bfloat16).to(torch.float32)
    nan = torch.isnan(x)
    assert np.array_equal(_bits(got[~nan]), _bits(want[~nan]))
    assert torch.isnan(got[nan]).all() and set(_bits(got[nan]).tolist()) == {0x7FC00000}
    assert np.all(_bits(got) & 0xFFFF == 0)


def test_round_bf16_edges():
    f = torch.tensor
    assert round_bf16(f([3.4e38])).item() == float("inf")  # beyond bf16's largest finite value
    assert round_bf16(f([1.0 + 2**-8])).item() == 1.0  # a tie: to even
    assert round_bf16(f([1.0 + 3 * 2**-8])).item() == 1.0 + 2**-6
    assert torch.equal(round_bf16(f([-0.0])).view(torch.int32), f([-0.0]).view(torch.int32))
    with pytest.raises(ExactError, match="float32"):
        round_bf16(torch.zeros(2, dtype=torch.float64))


def test_bf16_linear_rounds_operands_and_result_and_passes_gradients_straight_through():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g) for s in ((2, 5, 16), (8, 16), (8,)))
    y = ops.linear(x, w, b, bf16=True)
    ref = round_bf16(ops.linear(round_bf16(x), round_bf16(w), round_bf16(b)))
    assert torch.equal(y, ref) and not torch.equal(y, ops.linear(x, w, b))
    xr = x.clone().requires_grad_(True)
    ops.linear(xr, w, b, bf16=True).backward(torch.ones(2, 5, 8))
    assert torch.equal(xr.grad, ops.linear(torch.ones(2, 5, 8), round_bf16(w).t().contiguous()))
    n = native.linear(x, w, b, bf16=True)
    assert torch.allclose(n, y, rtol=2**-7, atol=1e-6)


def _spec(profile="exact-v1", **over):
    d = {"dtype": "bf16-mixed", "profile": profile,
         "model": {"vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16,
                   "dropout": 0.1, "tie_weights": True},
         "optimizer": {"lr": 1e-2, "weight_decay": 0.1, "schedule": "cosine", "warmup_steps": 1,
                       "decay_steps": 4, "min_lr": 1e-3},
         "batch": {"batch_size": 4, "seq_len": 8}, "rng": {"seed": 9}}
    if profile == "torch-native":
        d["hardware"] = {"device": "cpu"}
    return Spec.from_dict(d | over)


def _batch(spec, t):
    g = torch.Generator().manual_seed(t)  # test data only
    return torch.randint(0, spec.model.vocab_size, (spec.batch.batch_size, spec.sample_len), generator=g)


def _walk(spec, steps=2, micro_batches=None):
    st, out = init_state(spec), []
    for t in range(1, steps + 1):
        st, loss = step(st, _batch(spec, t), spec, t, micro_batches=micro_batches)
        out.append((st.digest(), loss.view(torch.int32).item()))
    return out


@pytest.mark.parametrize("matmul", ["single", "hilo"])
def test_bf16_steps_are_the_same_bytes_for_every_split_and_without_the_kernels(matmul):
    spec = _spec(exact={"matmul": matmul})
    one = _walk(spec, micro_batches=1)
    assert _walk(spec, micro_batches=2) == one
    assert _walk(spec, micro_batches=3) == one
    with kernels.disabled():
        assert _walk(spec, micro_batches=4) == one
    assert _walk(Spec.from_dict(spec.canonical() | {"dtype": "float32"})) != one


LLAMA = {"kind": "llama", "vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
         "n_embd": 16, "intermediate_size": 24, "tie_weights": False, "dropout": 0.1}


def test_a_bf16_llama_is_the_same_bytes_for_every_split_and_without_the_kernels():
    spec = _spec(model=LLAMA)
    one = _walk(spec, micro_batches=1)
    assert _walk(spec, micro_batches=4) == one
    with kernels.disabled():
        assert _walk(spec, micro_batches=2) == one


def test_bf16_native_follows_bf16_exact_and_both_follow_float32():
    e = init_state(_spec())
    b = _batch(_spec(), 1)
    _, le = step(e, b, _spec(), 1)
    _, ln_ = step(init_state(_spec("torch-native")), b, _spec("torch-native"), 1)
    _, lf = step(e, b, Spec.from_dict(_spec().canonical() | {"dtype": "float32"}), 1)
    assert abs(float(le) - float(ln_)) < 2e-3
    assert abs(float(le) - float(lf)) < 2e-2 and float(le) != float(lf)


def test_the_profiles_namespaces():
    assert profiles.get("exact-v1", "bf16-mixed").ops.NAME == "exact-v1/bf16-mixed"
    assert profiles.get("torch-native", "bf16-mixed").ops.NAME == "torch-native/bf16-mixed"
    assert profiles.get("exact-v1").ops is ops
    with pytest.raises(profiles.ProfileError, match="dtype"):
        profiles.get("exact-v1", "float16")


def test_bf16_products_equal_their_eager_definition_on_edge_values():
    """linear and matmul in bf16 form, forward and backward, with the kernels and without, on
    finite edge values (subnormals, ties of bfloat16, extreme exponents) and random rows."""
    from tests.oracle.vectors.edge import edge_values

    e = edge_values()
    e = e[torch.isfinite(e) & (e.abs() < 1e18)]
    ties = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 2.0**-126 * (1 + 2**-8)])
    g = torch.Generator().manual_seed(4)
    vals = torch.cat([e, ties, torch.randn(64 - (e.numel() + 4) % 64, generator=g)])
    x = vals.reshape(-1, 16)[:6].reshape(2, 3, 16)
    w = torch.randn(5, 16, generator=g)
    b = vals[:5].clone()

    def run():
        xl, wl, bl = (t.clone().requires_grad_(True) for t in (x, w, b))
        y = ops.linear(xl, wl, bl, bf16=True)
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
        a = x.reshape(2, 3, 16)[:, :, :4].contiguous().requires_grad_(True)
        m = ops.matmul(a, a.transpose(-2, -1).contiguous(), bf16=True)
        m.backward(torch.ones_like(m))
        return [y, xl.grad, wl.grad, bl.grad, m, a.grad]

    on = run()
    with kernels.disabled():
        off = run()
    for i, (p, q) in enumerate(zip(on, off, strict=True)):
        assert torch.equal(p.view(torch.int32), q.view(torch.int32)), i
    assert torch.all(on[0].view(torch.int32) & 0xFFFF == 0) and torch.all(
        on[4].view(torch.int32) & 0xFFFF == 0
    )
