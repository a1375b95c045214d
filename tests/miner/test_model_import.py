"""`pot model import`: a saved transformers checkpoint becomes a parameters file and the spec
tables that commit to it; the printed tables make a valid fine-tune spec."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from chain.dev import DevTransport
from commitments.spec import Spec
from miner.cli import model_app
from oracle import importer
from oracle.step import init_state

transformers = pytest.importorskip("transformers")


def _save_llama(d, vocab: int = 64):
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)


def test_import_prints_the_tables_of_a_fine_tune_spec(tmp_path):
    _save_llama(tmp_path / "hf")
    out = tmp_path / "init.safetensors"
    runner = CliRunner()
    r = runner.invoke(model_app, ["import", str(tmp_path / "hf"), "--from", "hf-llama", "--out", str(out)])
    assert r.exit_code == 0, r.output
    toml = r.stdout[r.stdout.index("[model]"):]
    (tmp_path / "spec.toml").write_text(toml + '\n[batch]\nbatch_size = 2\nseq_len = 16\n')
    spec = Spec.from_toml(tmp_path / "spec.toml")
    assert spec.model.kind == "llama" and spec.model.n_kv_head == 2 and not spec.model.tie_weights
    assert spec.init is not None
    state = init_state(spec, pretrained=out)
    assert importer.params_digest(state.params()).hex() == spec.init.params_digest
    r = runner.invoke(model_app, ["import", str(tmp_path / "hf"), "--from", "hf-llama", "--out",
                                  str(tmp_path / "again.safetensors"), "--json"])
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["params_digest"] == spec.init.params_digest and doc["parameters"] > 0


def test_import_refusals(tmp_path):
    runner = CliRunner()
    r = runner.invoke(model_app, ["import", str(tmp_path), "--from", "hf-t5", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--from must be one of hf-gpt2, hf-llama" in r.output
    r = runner.invoke(
        model_app, ["import", str(tmp_path / "none"), "--from", "hf-gpt2", "--out", str(tmp_path / "x")]
    )
    assert r.exit_code == 2 and "not a directory" in r.output
    _save_llama(tmp_path / "hf")
    r = runner.invoke(
        model_app, ["import", str(tmp_path / "hf"), "--from", "hf-gpt2", "--out", str(tmp_path / "x")]
    )
    assert r.exit_code == 2 and "model_type is 'llama'" in r.output
    assert not (tmp_path / "x").exists()


def test_train_refuses_a_fine_tune_without_its_parameters_file(tmp_path):
    from miner.cli import miner_app
    from tests.miner.helpers import corpus

    _save_llama(tmp_path / "hf", vocab=256)
    runner = CliRunner()
    r = runner.invoke(model_app, ["import", str(tmp_path / "hf"), "--from", "hf-llama", "--out",
                                  str(tmp_path / "init.safetensors")])
    (tmp_path / "spec.toml").write_text(
        r.stdout[r.stdout.index("[model]") :] + "\n[batch]\nbatch_size = 2\nseq_len = 16\n"
    )
    DevTransport(tmp_path / "chain.db").close()  # the chain exists: `pot miner train` never creates one
    r = runner.invoke(
        miner_app,
        [
            "train",
            "--spec",
            str(tmp_path / "spec.toml"),
            "--data",
            str(corpus(tmp_path)),
            "--out",
            str(tmp_path / "run"),
            "--chain",
            f"dev://{tmp_path / 'chain.db'}",
            "--account",
            "miner",
            "--no-serve",
        ],
    )
    assert r.exit_code == 2 and "give their file (--init)" in r.output, r.output
