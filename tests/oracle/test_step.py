"""The step: a pure function of (state, batch, spec, t); micro-batch splits give the same bytes."""

from __future__ import annotations

import pytest
import torch

import oracle
from commitments.spec import Spec
from oracle import models
from oracle.step import StepError, as_batch, init_state, step

pytestmark = pytest.mark.usefixtures("single_thread")


def _spec(**over):
    base = {
        "model": {"kind": "gpt", "vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16,
                  "dropout": 0.1},
        "optimizer": {"kind": "adamw", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
        "batch": {"batch_size": 4, "seq_len": 8},
        "rng": {"seed": 5},
    }
    for k, v in over.items():
        base[k] = base.get(k, {}) | v if isinstance(v, dict) else v
    return Spec.from_dict(base)


def _batch(spec, seed=0):
    g = torch.Generator().manual_seed(seed)  # test data only
    return torch.randint(0, spec.model.vocab_size, (spec.batch.batch_size, spec.sample_len), generator=g)


def _walk(spec, steps, micro_batches=1):
    st = init_state(spec)
    out = []
    for t in range(1, steps + 1):
        st, loss = step(st, _batch(spec, t), spec, t, micro_batches=micro_batches)
        out.append((st.digest(), loss.view(torch.int32).item()))
    return st, out


@pytest.mark.parametrize("over", [
    {},
    {"model": {"tie_weights": False, "gelu": "erf", "bias": False}},
    {"optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.9}},
    {"model": {"kind": "mlp", "hidden": (24, 20), "dropout": 0.2}},
    {"exact": {"matmul": "hilo"}},
], ids=["gpt", "gpt-untied-erf-nobias", "sgd", "mlp", "hilo"])
def test_micro_batches_give_identical_bytes(over):
    spec = _spec(**over)
    _, one = _walk(spec, 2, 1)
    _, two = _walk(spec, 2, 2)
    _, four = _walk(spec, 2, 4)
    assert one == two == four


def test_step_is_pure_and_learns():
    spec = _spec()
    st0 = init_state(spec)
    b = _batch(spec, 1)
    a, la = step(st0, b, spec, 1)
    c, lc = step(st0, b.clone(), spec, 1)
    assert a.digest() == c.digest() and torch.equal(la.view(torch.int32), lc.view(torch.int32))
    assert st0.step == 0 and a.step == 1  # the input state is not modified
    assert abs(float(la) - torch.log(torch.tensor(64.0)).item()) < 0.3  # initial loss near ln(vocab)
    st = a
    for t in range(2, 11):
        st, loss = step(st, b, spec, t)  # one batch over and over: it starts to memorise it
    assert float(loss) < 0.8 * float(la)


def test_dropout_is_keyed_by_step():
    spec = _spec()
    st0 = init_state(spec)
    b = _batch(spec)
    nodrop = _spec(model={"dropout": 0.0})
    a, _ = step(st0, b, spec, 1)
    c, _ = step(init_state(nodrop), b, nodrop, 1)
    assert a.params()["wte"].ne(c.params()["wte"]).any()


def test_package_entry_points():
    spec = _spec()
    st = oracle.init_state(spec)
    new, loss = oracle.step.step(st, _batch(spec), spec, 1)
    assert isinstance(new, oracle.TrainState) and loss.dtype == torch.float32
    assert isinstance(oracle.norm_bucket.norm_bucket(st, new), int)


def test_torch_native_profile_agrees_closely_with_exact():
    spec = _spec()
    native = Spec.from_dict(spec.canonical() | {"profile": "torch-native", "hardware": {"device": "cpu"}})
    b = _batch(spec)
    e, le = step(init_state(spec), b, spec, 1)
    n, ln_ = step(init_state(native), b, native, 1)
    assert abs(float(le) - float(ln_)) < 1e-4
    assert torch.allclose(e.params()["wte"], n.params()["wte"], atol=1e-5)


def test_refusals():
    spec = _spec()
    st = init_state(spec)
    b = _batch(spec)
    with pytest.raises(StepError, match="needs the state after step 1"):
        step(st, b, spec, 2)
    with pytest.raises(StepError, match="step_index"):
        step(st, b, spec, 0)
    with pytest.raises(StepError, match="shape"):
        step(st, b[:, :-1], spec, 1)
    with pytest.raises(StepError, match="int64"):
        step(st, b.to(torch.int32), spec, 1)
    with pytest.raises(StepError, match="token id 64"):
        step(st, torch.full_like(b, 64), spec, 1)
    with pytest.raises(StepError, match="micro_batches"):
        step(st, b, spec, 1, micro_batches=5)
    other = _spec(model={"n_embd": 32})
    with pytest.raises(StepError, match="has shape"):
        step(st, b, other, 1)
    with pytest.raises(StepError, match="integer token ids"):
        as_batch(b.numpy().astype("float32"), spec)


def test_dropout_sites_are_distinct():
    cfg = _spec(model={"n_layer": 12}).model
    sites = models.dropout_sites(cfg)
    from oracle.rng import site_id

    assert len({site_id(s) for s in sites}) == len(sites) == 1 + 3 * 12
    names = [p.name for p in models.build(cfg).param_specs()]
    assert len({site_id("init/" + n) for n in names} | {site_id(s) for s in sites}) == len(names) + len(sites)


def test_the_specs_micro_batches_are_the_default_split_and_any_split_replays_it():
    spec = _spec(batch={"micro_batches": 4}, optimizer={"schedule": "cosine", "warmup_steps": 1,
                                                        "decay_steps": 3})
    st0, b = init_state(spec), _batch(spec, 2)
    a, la = step(st0, b, spec, 1)  # the spec's split: 4 micro-batches
    for split in (1, 2, 3):
        c, lc = step(st0, b, spec, 1, micro_batches=split)
        assert c.digest() == a.digest() and torch.equal(lc.view(torch.int32), la.view(torch.int32))


def test_torch_native_replays_only_the_specs_split():
    spec = _spec(batch={"micro_batches": 2}, profile="torch-native", hardware={"device": "cpu"})
    st0, b = init_state(spec), _batch(spec, 3)
    a, _ = step(st0, b, spec, 1)
    c, _ = step(st0, b, spec, 1, micro_batches=2)
    assert a.digest() == c.digest()
    with pytest.raises(StepError, match="under torch-native the split changes the bytes"):
        step(st0, b, spec, 1, micro_batches=1)


def test_a_schedule_changes_the_update_and_warmup_starts_small():
    plain = _spec(model={"dropout": 0.0})
    warm = _spec(model={"dropout": 0.0}, optimizer={"warmup_steps": 100})
    st_p, st_w = init_state(plain), init_state(warm)
    assert st_p.digest() == st_w.digest()  # the initial state does not depend on the schedule
    b = _batch(plain, 4)
    a, _ = step(st_p, b, plain, 1)
    c, _ = step(st_w, b, warm, 1)
    moved_plain = (a.params()["wte"] - st_p.params()["wte"]).abs().max()
    moved_warm = (c.params()["wte"] - st_w.params()["wte"]).abs().max()
    assert 0 < moved_warm < moved_plain / 50  # Adam's first step moves ~ lr: 1/100 of it here
