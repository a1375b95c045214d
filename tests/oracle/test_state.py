"""TrainState: canonical order, digests, the safetensors round trip and refusal of bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from commitments.spec import Spec
from commitments.tensors import state_digest
from oracle.state import StateError, TrainState, layout
from oracle.step import init_state

SPEC = Spec.from_dict({
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 8, "vocab_size": 32},
    "batch": {"batch_size": 2, "seq_len": 8},
    "rng": {"seed": 2**40 + 5},
})


def test_layout_order():
    names = [s.name for s in layout(SPEC)]
    assert names[:3] == ["param/wte", "param/wpe", "param/h.0.ln_1.weight"]
    n_param = sum(1 for n in names if n.startswith("param/"))
    assert names[n_param].startswith("opt/exp_avg/")
    assert names[2 * n_param].startswith("opt/exp_avg_sq/")
    assert names[-2:] == ["step", "rng/seed"]
    assert "param/lm_head.weight" not in names  # tied head
    untied = Spec.from_dict(SPEC.canonical() | {"model": SPEC.model.model_dump() | {"tie_weights": False}})
    assert "param/lm_head.weight" in [s.name for s in layout(untied)]
    sgd = Spec.from_dict(SPEC.canonical() | {"optimizer": {"kind": "sgd"}})
    assert any(n.startswith("opt/momentum/") for n in (s.name for s in layout(sgd)))


def test_init_state_is_deterministic_and_digested_in_order():
    a, b = init_state(SPEC), init_state(SPEC)
    assert a.digest() == b.digest() == state_digest(a.items())
    assert a.step == 0 and a.seed == 2**40 + 5
    assert a.tensors["param/h.0.ln_1.weight"].eq(1).all()
    assert a.tensors["param/h.0.attn.c_attn.bias"].eq(0).all()
    other = Spec.from_dict(SPEC.canonical() | {"rng": {"seed": 6}})
    assert init_state(other).digest() != a.digest()


# The initial states of the example specs, pinned: the compiled RNG pass, the eager definition
# and every version since must give these bytes (GPT-2 small, a6ae972b..., is checked by bench/init.py).
EXAMPLE_INIT_DIGESTS = {
    "gpt-tiny.toml": "8c478d11ea4b212093561baf849fc4496f126a9cb5652ca205dbd9972c6f95fb",
    "gpt-tiny-bf16.toml": "8c478d11ea4b212093561baf849fc4496f126a9cb5652ca205dbd9972c6f95fb",  # fp32 masters
    "gpt-demo.toml": "e61a7825517b88be51cbdcd9dcae796b0af8602f7edae2ee637efe3934988120",
    "llama-tiny.toml": "f1f279fdaea829f853f8044a9a7f595414d75fa65c7e19b1ddee921c99da7102",
}
EXAMPLES = Path(__file__).parents[2] / "examples" / "specs"


def test_every_small_example_spec_drawn_from_its_seed_is_pinned():
    # a spec with [init] starts from imported parameters: nothing of it is drawn from the seed
    drawn = [p.name for p in EXAMPLES.glob("*.toml") if Spec.from_toml(p).init is None]
    assert sorted(n for n in drawn if n != "gpt2-small.toml") == sorted(EXAMPLE_INIT_DIGESTS)


@pytest.mark.parametrize("name", sorted(EXAMPLE_INIT_DIGESTS))
def test_example_initial_states_are_pinned(name):
    from oracle.exact import kernels

    spec = Spec.from_toml(EXAMPLES / name)
    assert init_state(spec).digest().hex() == EXAMPLE_INIT_DIGESTS[name]
    with kernels.disabled():  # the eager definition, everywhere
        assert init_state(spec).digest().hex() == EXAMPLE_INIT_DIGESTS[name]


def test_zero_moments_are_writable_float32_zeros():
    st = init_state(SPEC)
    m = st.tensors["opt/exp_avg/wte"]
    assert m.dtype == torch.float32 and m.is_contiguous() and not m.any()
    m.add_(1.0)  # the calloc'd buffer is ordinary writable memory
    assert init_state(SPEC).digest() != st.digest()


def test_init_scales():
    big = Spec.from_dict(
        {
            "model": {"n_layer": 8, "n_embd": 64, "n_head": 2, "block_size": 8, "vocab_size": 256},
            "batch": {"batch_size": 2, "seq_len": 8},
        }
    )
    p = init_state(big).params()
    assert abs(float(p["wte"].std()) - 0.02) < 0.002
    assert abs(float(p["h.0.attn.c_proj.weight"].std()) - 0.02 / 4) < 0.0005  # 0.02 / sqrt(2 * 8)
    assert not torch.equal(p["h.0.attn.c_attn.weight"], p["h.1.attn.c_attn.weight"])


def test_round_trip(tmp_path):
    st = init_state(SPEC)
    path = tmp_path / "s.safetensors"
    st.to_safetensors(path)
    back = TrainState.from_safetensors(path, SPEC)
    assert list(back.tensors) == list(st.tensors)
    assert back.digest() == st.digest()
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]  # no temp file left


def _rewrite(src, dst, fn):
    t = load_file(src)
    fn(t)
    save_file(t, dst)


@pytest.mark.parametrize("edit,msg", [
    (lambda t: t.pop("param/wte"), "missing param/wte"),
    (lambda t: t.__setitem__("param/extra", torch.zeros(1)), "unexpected param/extra"),
    (lambda t: t.__setitem__("param/wpe", torch.zeros(3, 16)), r"param/wpe has shape \(3, 16\)"),
    (lambda t: t.__setitem__("param/wpe", torch.zeros(8, 16, dtype=torch.float64)), "dtype torch.float64"),
    (lambda t: t.__setitem__("step", torch.tensor(-1)), "cannot be negative"),
    (lambda t: t.__setitem__("rng/seed", torch.tensor(9, dtype=torch.uint64)), "rng/seed is 9"),
])
def test_bad_state_files_are_refused(tmp_path, edit, msg):
    good = tmp_path / "good.safetensors"
    init_state(SPEC).to_safetensors(good)
    bad = tmp_path / "bad.safetensors"
    _rewrite(good, bad, edit)
    with pytest.raises(StateError, match=msg):
        TrainState.from_safetensors(bad, SPEC)


def test_garbage_and_missing_files(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(StateError, match="not a safetensors file"):
        TrainState.from_safetensors(junk, SPEC)
    with pytest.raises(StateError, match="cannot read"):
        TrainState.from_safetensors(tmp_path / "absent.safetensors", SPEC)


def test_state_for_another_spec_is_refused(tmp_path):
    path = tmp_path / "s.safetensors"
    init_state(SPEC).to_safetensors(path)
    wider = Spec.from_dict(SPEC.canonical() | {"model": SPEC.model.model_dump() | {"n_embd": 32}})
    with pytest.raises(StateError, match="has shape"):
        TrainState.from_safetensors(path, wider)
