"""Spec validation: refusals name the field and the reason; the digest is canonical."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from commitments import cbor
from commitments.errors import NonCanonicalCBOR
from commitments.hashing import digest
from commitments.spec import Spec, SpecError

VALIDATION_EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "specs" / "validation"


def _toml(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _refused(data):
    with pytest.raises(SpecError) as info:
        Spec.from_dict(data)
    return str(info.value)


def test_defaults_are_a_valid_spec():
    s = Spec()
    assert s.profile == "exact-v1" and s.sample_len == s.batch.seq_len + 1


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"colour": "blue"}, "colour: unknown field"),
        ({"model": {"dropuot": 0.1}}, "model.dropuot: unknown field"),
        ({"batch": {"grad_accum": 2}}, "batch.grad_accum: unknown field"),
        (
            {"hardware": {"device": "cpu", "vendor": "x"}, "profile": "torch-native"},
            "hardware.vendor: unknown field",
        ),
    ],
)
def test_unknown_fields_are_refused_by_name(data, field):
    assert field in _refused(data)


def test_dropout_needs_a_seed_policy():
    reason = _refused({"model": {"dropout": 0.1}, "rng": {"policy": "none"}})
    assert "dropout" in reason and "rng.policy" in reason
    assert Spec.from_dict({"model": {"dropout": 0.1}}).rng.policy == "philox-v1"
    assert Spec.from_dict({"model": {"dropout": 0.0}, "rng": {"policy": "none"}}).model.dropout == 0.0


def test_torch_native_needs_a_hardware_class():
    reason = _refused({"profile": "torch-native"})
    assert "torch-native" in reason and "[hardware]" in reason
    s = Spec.from_dict(
        {"profile": "torch-native", "hardware": {"device": "cpu", "isa": "avx2", "threads": 4}}
    )
    assert s.hardware.threads == 4
    assert "hardware.device" in _refused({"profile": "torch-native", "hardware": {"device": ""}})


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": -5}, "steps"),
        ({"batch": {"batch_size": 0}}, "batch.batch_size"),
        ({"batch": {"batch_size": -1}}, "batch.batch_size"),
        ({"batch": {"seq_len": 0}}, "batch.seq_len"),
        ({"model": {"hidden": [64, 0]}}, "model.hidden.1"),
        ({"optimizer": {"lr": 0.0}}, "optimizer.lr"),
        ({"rng": {"seed": -1}}, "rng.seed"),
        ({"rng": {"seed": 2**64}}, "rng.seed"),
        ({"threads": 1}, "threads"),
    ],
)
def test_non_positive_sizes_and_out_of_range_values_name_the_field(data, field):
    reason = _refused(data)
    assert f"{field}:" in reason


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"steps": True}, "steps"),
        ({"steps": "10"}, "steps"),
        ({"steps": 10.5}, "steps"),
        ({"model": {"bias": "yes"}}, "model.bias"),
        ({"profile": "fast"}, "profile"),
        ({"model": "gpt"}, "model"),
    ],
)
def test_wrong_types_are_refused_not_coerced(data, field):
    assert f"{field}:" in _refused(data)


def test_seq_len_beyond_block_size_is_refused():
    reason = _refused({"batch": {"seq_len": 65}, "model": {"block_size": 64}})
    assert "batch.seq_len (65)" in reason and "model.block_size (64)" in reason
    assert Spec.from_dict({"batch": {"seq_len": 64}, "model": {"block_size": 64}}).sample_len == 65
    # The MLP has no positions, so the limit does not apply to it.
    assert Spec.from_dict({"batch": {"seq_len": 65}, "model": {"kind": "mlp", "block_size": 64}})


def test_heads_must_divide_the_embedding():
    assert "n_head" in _refused({"model": {"n_embd": 100, "n_head": 3}})


def test_digest_is_stable_across_toml_key_order_and_explicit_defaults(tmp_path):
    a = _toml(tmp_path, """
        steps = 50
        profile = "exact-v1"
        [model]
        n_layer = 3
        n_embd = 64
        [optimizer]
        lr = 0.002
        kind = "adamw"
    """, "a.toml")
    b = _toml(tmp_path, """
        [optimizer]
        kind = "adamw"
        lr = 0.002
        [model]
        n_embd = 64
        n_layer = 3
        dropout = 0.0
        [rng]
        policy = "philox-v1"
        [batch]
        batch_size = 8
    """, "b.toml")
    c = _toml(tmp_path, "profile = 'exact-v1'\n" + b.read_text() + "\n", "c.toml")
    assert Spec.from_toml(a).steps == 50
    sb = Spec.from_toml(b)
    assert sb.steps == 100
    assert Spec.from_toml(a).digest() != sb.digest()  # steps differ
    a2 = _toml(tmp_path, a.read_text().replace("steps = 50", "steps = 100"), "a2.toml")
    assert Spec.from_toml(a2).digest() == sb.digest() == Spec.from_toml(c).digest()


def test_digest_is_the_domain_separated_canonical_cbor():
    s = Spec.from_dict({"model": {"hidden": [32, 16], "kind": "mlp"}})
    assert s.digest() == digest("pot/spec/v1", s.canonical())
    assert s.to_cbor() == cbor.encode(s.canonical())
    assert s.canonical()["model"]["hidden"] == [32, 16]


def test_every_field_changes_the_digest():
    base = Spec()
    changes = [{"steps": 101}, {"model": {"n_layer": 3}}, {"optimizer": {"beta2": 0.99}},
               {"batch": {"batch_size": 4}}, {"rng": {"schedule_seed": 1}}, {"exact": {"matmul": "hilo"}},
               {"optimizer": {"grad_clip": 0.0}}, {"model": {"gelu": "erf"}}]
    digests = {Spec.from_dict(c).digest() for c in changes}
    assert len(digests) == len(changes) and base.digest() not in digests


def test_cbor_round_trip():
    s = Spec.from_dict({"profile": "torch-native", "hardware": {"device": "cuda", "isa": "sm90"},
                        "model": {"kind": "mlp", "hidden": [8, 8, 8]}, "optimizer": {"kind": "sgd"}})
    again = Spec.from_cbor(s.to_cbor())
    assert again == s and again.digest() == s.digest()
    assert cbor.encode(cbor.decode(s.to_cbor())) == s.to_cbor()


def test_bad_cbor_is_refused():
    with pytest.raises(SpecError, match="not a map"):
        Spec.from_cbor(cbor.encode([1, 2]))
    with pytest.raises(NonCanonicalCBOR, match="deterministic encoding"):
        Spec.from_cbor(b"\xa1\x65steps\x18\x05")  # 5 in the one-byte form: not canonical
    with pytest.raises(SpecError, match="steps"):
        Spec.from_cbor(cbor.encode({"steps": 0}))


def test_unreadable_and_invalid_toml_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read spec"):
        Spec.from_toml(tmp_path / "missing.toml")
    with pytest.raises(SpecError, match="not valid TOML"):
        Spec.from_toml(_toml(tmp_path, "steps = = 3"))
    with pytest.raises(SpecError, match=r"spec\.toml: invalid spec: steps"):
        Spec.from_toml(_toml(tmp_path, "steps = 0"))


@pytest.mark.parametrize("path", sorted(VALIDATION_EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_bad_examples_are_refused_with_their_documented_reason(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# refused: "), f"{path.name} must state its expected reason on line 1"
    expected = first.removeprefix("# refused: ").strip()
    with pytest.raises(SpecError) as info:
        Spec.from_toml(path)
    assert expected in str(info.value)


# --- the Llama family ---------------------------------------------------------------------------

LLAMA = {"kind": "llama", "vocab_size": 64, "block_size": 32, "n_layer": 2, "n_head": 4, "n_kv_head": 2,
         "n_embd": 32, "intermediate_size": 48}


def test_existing_spec_encodings_are_unchanged():
    """The Llama fields are absent from a GPT's or MLP's canonical form: digests pinned from
    before they existed."""
    assert Spec().digest().hex() == "5429195e80d2dd7449b19ce427c289f091c68a9125abd53b19349e128ba73f40"
    assert Spec.from_dict({"model": {"kind": "mlp"}}).digest().hex() == \
        "4a24bf66043439739301f809205fa1a3e31d52758c48a0573f8fb50a8d20894d"
    assert not set(Spec().canonical()["model"]) & {"n_kv_head", "intermediate_size", "rope_theta", "rms_eps"}


def test_llama_spec_defaults_round_trip_and_digest():
    s = Spec.from_dict({"model": LLAMA, "batch": {"seq_len": 16}})
    m = s.canonical()["model"]
    assert m["rope_theta"] == 10000.0 and m["rms_eps"] == 1e-6 and m["n_kv_head"] == 2
    assert not {"bias", "gelu", "hidden"} & set(m)
    assert Spec.from_cbor(s.to_cbor()) == s
    # n_kv_head defaults to n_head, and stating the default gives the same digest
    a = Spec.from_dict({"model": {**LLAMA, "n_kv_head": 4}, "batch": {"seq_len": 16}})
    b = Spec.from_dict(
        {"model": {k: v for k, v in LLAMA.items() if k != "n_kv_head"}, "batch": {"seq_len": 16}}
    )
    assert a.digest() == b.digest() != s.digest()
    for field, value in (("rope_theta", 500000.0), ("rms_eps", 1e-5), ("intermediate_size", 64),
                         ("tie_weights", False)):
        assert (
            Spec.from_dict({"model": {**LLAMA, field: value}, "batch": {"seq_len": 16}}).digest()
            != s.digest()
        )


@pytest.mark.parametrize("model, reason", [
    ({"kind": "gpt", "n_kv_head": 2}, "n_kv_head: only for kind 'llama'"),
    ({"kind": "mlp", "rope_theta": 1e4}, "rope_theta: only for kind 'llama'"),
    ({**LLAMA, "intermediate_size": None}, "intermediate_size: required"),
    ({**LLAMA, "n_kv_head": 3}, "n_kv_head (3) must divide n_head (4)"),
    ({**LLAMA, "gelu": "erf"}, "gelu: not a field of kind 'llama'"),
    ({**LLAMA, "bias": True}, "bias: not a field of kind 'llama'"),
    ({**LLAMA, "n_embd": 36, "n_head": 4, "n_kv_head": 4}, "must be even"),
    ({**LLAMA, "block_size": 2**21}, "exceeds 1048576 positions"),
])
def test_llama_refusals_name_the_field(model, reason):
    with pytest.raises(SpecError, match=re.escape(reason)):
        Spec.from_dict({"model": model, "batch": {"seq_len": 16}})


def test_llama_seq_len_beyond_block_size_is_refused():
    with pytest.raises(SpecError, match="exceeds model.block_size"):
        Spec.from_dict({"model": LLAMA, "batch": {"seq_len": 33}})


def test_llama_and_finetune_examples_parse():
    root = Path(__file__).resolve().parents[2] / "examples" / "specs"
    llama = Spec.from_toml(root / "llama-tiny.toml")
    assert llama.model.kind == "llama" and llama.model.n_kv_head == 2 and llama.init is None
    ft = Spec.from_toml(root / "gpt2-finetune.toml")
    assert ft.init is not None and ft.model.vocab_size == 50257 and ft.batch.micro_batches == 4
    assert "init" in ft.canonical() and "init" not in llama.canonical()
