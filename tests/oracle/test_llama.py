"""The Llama-family decoder: its parameter layout, exact-v1 against torch-native on the same
parameters, and steps whose bytes do not depend on the micro-batch split."""

from __future__ import annotations

import pytest
import torch

from commitments.spec import Spec
from oracle import models, native
from oracle.exact import ops
from oracle.step import init_state, step

MODEL = {"kind": "llama", "vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
         "n_embd": 32, "intermediate_size": 48}


def _spec(**model) -> Spec:
    return Spec.from_dict({"model": {**MODEL, **model}, "batch": {"batch_size": 4, "seq_len": 16},
                           "optimizer": {"weight_decay": 0.1}, "rng": {"seed": 5}})


def _batch(spec: Spec, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.model.vocab_size, (spec.batch.batch_size, spec.sample_len), generator=g)


def test_parameter_layout_follows_transformers_names():
    spec = _spec(tie_weights=False)
    ps = {p.name: p for p in models.build(spec.model).param_specs()}
    assert ps["embed_tokens.weight"].shape == (64, 32)
    assert ps["layers.1.self_attn.q_proj.weight"].shape == (32, 32)
    assert ps["layers.1.self_attn.k_proj.weight"].shape == (16, 32)  # 2 kv heads of 8
    assert ps["layers.0.mlp.gate_proj.weight"].shape == (48, 32)
    assert ps["layers.0.mlp.down_proj.weight"].shape == (32, 48)
    assert ps["norm.weight"].init == "ones" and "lm_head.weight" in ps
    assert not any(n.endswith(".bias") for n in ps)
    assert len(ps) == 1 + 2 * 9 + 1 + 1
    assert "lm_head.weight" not in {p.name for p in models.build(_spec().model).param_specs()}
    sites = models.dropout_sites(spec.model)
    assert len(sites) == len(set(sites)) == 6


@pytest.mark.parametrize("tie", [True, False])
def test_exact_forward_matches_torch_native(tie):
    spec = _spec(tie_weights=tie)
    model = models.build(spec.model)
    params = init_state(spec).params()
    idx = _batch(spec)[:, :-1]
    exact = model.forward(ops, params, idx)
    ref = model.forward(native, {k: v.double() for k, v in params.items()}, idx)
    assert ((exact.double() - ref).abs().max() / ref.abs().max()).item() < 1e-5


@pytest.mark.parametrize("model", [{}, {"tie_weights": False, "dropout": 0.1}, {"n_kv_head": 1}])
def test_exact_step_is_independent_of_the_split(model):
    spec = _spec(**model)
    state = init_state(spec)
    batch = _batch(spec)
    one, loss = step(state, batch, spec, 1)
    for mb in (2, 4):
        other, loss2 = step(state, batch, spec, 1, micro_batches=mb)
        assert other.digest() == one.digest() and loss2.view(torch.int32) == loss.view(torch.int32)
    two, _ = step(one, _batch(spec, 1), spec, 2)
    assert two.digest() != one.digest()


def test_a_few_steps_lower_the_loss_on_a_repeated_batch():
    spec = Spec.from_dict({"model": MODEL, "batch": {"batch_size": 4, "seq_len": 16},
                           "optimizer": {"lr": 1e-2}})
    state, batch = init_state(spec), _batch(spec)
    losses = []
    for t in range(1, 5):
        state, loss = step(state, batch, spec, t)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.2


def test_a_one_billion_parameter_configuration_is_a_valid_spec():
    """TinyLlama-1.1B's shape (22 layers, 32 heads sharing 4 kv heads, 2048 wide, SwiGLU 5632,
    vocab 32000, untied head): the parameter count transformers gives it, nothing allocated."""
    spec = Spec.from_dict({"model": {"kind": "llama", "vocab_size": 32000, "block_size": 2048, "n_layer": 22,
                                     "n_head": 32, "n_kv_head": 4, "n_embd": 2048, "intermediate_size": 5632,
                                     "tie_weights": False, "rms_eps": 1e-5},
                           "batch": {"batch_size": 1, "seq_len": 2048}})
    specs = models.build(spec.model).param_specs()
    assert len(specs) == 201
    assert sum(int(torch.Size(p.shape).numel()) for p in specs) == 1_100_048_384
