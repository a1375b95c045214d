"""The [model] table `pot model import` prints is the model it imported: pasted into a spec, it
loads back to the same model config, and names only fields the architecture reads."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from commitments.spec import ModelSpec, Spec
from miner.cli import model_app
from oracle import importer

transformers = pytest.importorskip("transformers")


def _gpt2(d, *, gelu: str = "gelu_new", tie: bool = True) -> None:
    cfg = transformers.GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=1,
        n_head=4,
        activation_function=gelu,
        tie_word_embeddings=tie,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(3)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)


def _llama(d, *, kv: int = 2, tie: bool = False) -> None:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=16,
                                   tie_word_embeddings=tie, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(4)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)


CASES = [
    ("hf-gpt2", lambda d: _gpt2(d)),
    ("hf-gpt2", lambda d: _gpt2(d, gelu="gelu", tie=False)),
    ("hf-llama", lambda d: _llama(d)),
    ("hf-llama", lambda d: _llama(d, kv=4, tie=True)),
]


def _import(tmp_path, source, make, *extra):
    make(tmp_path / "hf")
    r = CliRunner().invoke(model_app, ["import", str(tmp_path / "hf"), "--from", source,
                                       "--out", str(tmp_path / "init.safetensors"), *extra])
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.parametrize(
    ("source", "make"), CASES, ids=["gpt2", "gpt2-erf-untied", "llama-gqa", "llama-tied"]
)
def test_the_printed_model_table_loads_back_to_the_imported_model(tmp_path, source, make):
    printed = _import(tmp_path, source, make)
    imported, _ = importer.import_checkpoint(source, tmp_path / "hf")
    table = printed[printed.index("[model]"):printed.index("[init]")]
    keys = [line.split(" = ")[0] for line in table.splitlines()[1:] if line.strip()]
    (tmp_path / "spec.toml").write_text(
        printed[printed.index("[model]") :] + "\n[batch]\nbatch_size = 2\nseq_len = 16\n"
    )
    spec = Spec.from_toml(tmp_path / "spec.toml")
    assert spec.model == imported
    assert spec.model.canonical() == imported.canonical()
    # only the fields the architecture reads: a GPT has no hidden widths, a Llama no biases or GELU
    assert "hidden" not in keys
    if imported.kind == "llama":
        assert {"n_kv_head", "intermediate_size", "rope_theta", "rms_eps"} <= set(keys)
        assert not {"bias", "gelu"} & set(keys)
    else:
        assert not {"n_kv_head", "intermediate_size", "rope_theta", "rms_eps"} & set(keys)
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(("source", "make"), CASES[::2], ids=["gpt2", "llama"])
def test_the_json_model_is_the_printed_table(tmp_path, source, make):
    doc = json.loads(_import(tmp_path, source, make, "--json").strip().splitlines()[-1])
    imported, _ = importer.import_checkpoint(source, tmp_path / "hf")
    assert doc["model"] == imported.table()
    assert ModelSpec.model_validate(doc["model"], strict=False) == imported
    assert "hidden" not in doc["model"]


def test_a_gpt_with_other_hidden_widths_keeps_them_in_its_table():
    """`hidden` is left out only at its default: a table that loads back to the same model."""
    model = ModelSpec(kind="gpt", n_layer=1, n_head=2, n_embd=32, hidden=(64,))
    assert importer.model_toml(model).count("hidden = [64]") == 1
    assert "hidden" not in importer.model_toml(ModelSpec(kind="gpt"))
    assert "hidden = [256]" in importer.model_toml(ModelSpec(kind="mlp"))
