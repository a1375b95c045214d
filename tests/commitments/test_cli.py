"""`pot data`, `pot transcript` and `pot spec` through the real `pot` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from nacl.signing import SigningKey
from typer.testing import CliRunner

from commitments.dataset import Dataset, verify_sample
from commitments.spec import Spec
from commitments.transcript import TranscriptWriter, iter_records
from pot.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def pot(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "corpus.npy"
    result = pot("data", "prepare", "--out", out, "--max-bytes", "300000", "--json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_data_prepare_reports_the_corpus_and_its_hash(corpus):
    out, info = corpus
    assert info["sample_len"] == 65
    ds = Dataset.open(out, 65, vocab_size=256)
    assert info["num_samples"] == ds.num_samples
    assert info["dataset_hash"] == ds.dataset_hash.hex()
    assert info["train_samples"] + info["validation_samples"] == ds.num_samples
    assert 0 < info["validation_samples"] < info["train_samples"]
    assert Path(info["sidecar"]).is_file()


def test_data_prepare_takes_the_sample_length_from_a_spec(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text("[batch]\nseq_len = 32\n")
    result = pot("data", "prepare", "--out", tmp_path / "c.npy", "--spec", spec, "--max-bytes", "100000")
    assert result.exit_code == 0, result.output
    assert "of 33 tokens" in result.stdout
    ds = Dataset.open(tmp_path / "c.npy", 33)
    assert f"dataset hash {ds.dataset_hash.hex()}" in result.stdout


def test_data_prepare_refusals(tmp_path):
    result = pot("data", "prepare", "--out", tmp_path / "c.bin")
    assert result.exit_code == 2 and ".npy" in result.stderr
    spec = tmp_path / "bad.toml"
    spec.write_text("steps = 0\n")
    result = pot("data", "prepare", "--out", tmp_path / "c.npy", "--spec", spec)
    assert result.exit_code == 2 and "steps" in result.stderr
    assert not (tmp_path / "c.npy").exists()


def test_data_hash_matches_the_library(corpus, tmp_path):
    out, info = corpus
    result = pot("data", "hash", out, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dataset_hash"] == info["dataset_hash"]
    result = pot("data", "hash", out, "--sample-len", "10")
    assert result.exit_code == 0
    assert Dataset.open(out, 10).dataset_hash.hex() in result.stdout


def test_data_hash_refuses_bad_corpora_with_the_reason(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(100, dtype=np.float32))
    result = pot("data", "hash", tmp_path / "f.npy", "--sample-len", "5")
    assert result.exit_code == 2 and "dtype float32" in result.stderr
    np.save(tmp_path / "v.npy", np.full(100, 300, dtype=np.uint16))
    result = pot("data", "hash", tmp_path / "v.npy", "--sample-len", "5", "--vocab-size", "256")
    assert result.exit_code == 2 and "outside the vocabulary" in result.stderr
    result = pot("data", "hash", tmp_path / "v.npy", "--sample-len", "0")
    assert result.exit_code == 2 and "--sample-len" in result.stderr
    result = pot("data", "hash", tmp_path / "missing.npy")
    assert result.exit_code == 2 and "no such corpus" in result.stderr
    assert "Traceback" not in result.output


def test_data_prove_gives_a_proof_that_verifies(corpus):
    out, info = corpus
    result = pot("data", "prove", out, "--index", "7", "--json")
    assert result.exit_code == 0, result.output
    p = json.loads(result.stdout)
    tokens = np.array(p["tokens"], dtype=p["dtype"])
    proof = [bytes.fromhex(x) for x in p["proof"]]
    assert verify_sample(tokens, 7, p["num_samples"], proof, bytes.fromhex(info["dataset_hash"]))
    result = pot("data", "prove", out, "--index", str(info["num_samples"]))
    assert result.exit_code == 2 and "out of range" in result.stderr


def _transcript(path: Path) -> bytes:
    with TranscriptWriter.create(path, "cli-run", SigningKey(b"k" * 32)) as w:
        for t in range(1, 4):
            w.append("step", {"t": t})
    return path.read_bytes()


def test_transcript_verify_ok(tmp_path):
    _transcript(tmp_path / "t.cbor")
    result = pot("transcript", "verify", tmp_path / "t.cbor")
    assert result.exit_code == 0, result.output
    assert "4 records verified" in result.stdout and result.stdout.strip().endswith("ok")
    result = pot("transcript", "verify", tmp_path / "t.cbor", "--json")
    report = json.loads(result.stdout)
    assert report["ok"] and report["records"] == 4 and report["run_name"] == "cli-run"


def test_transcript_verify_names_the_first_broken_record(tmp_path):
    data = _transcript(tmp_path / "t.cbor")
    rec = [r for r in iter_records(data)][2]
    bad = bytearray(data)
    bad[rec.offset + rec.raw.index(rec.fields["sig"])] ^= 1
    (tmp_path / "bad.cbor").write_bytes(bytes(bad))
    result = pot("transcript", "verify", tmp_path / "bad.cbor")
    assert result.exit_code == 1
    assert "FAILED at record 2" in result.stdout and "bad-signature" in result.stdout
    result = pot("transcript", "verify", tmp_path / "bad.cbor", "--json")
    assert result.exit_code == 1
    problem = json.loads(result.stdout)["problem"]
    assert problem["index"] == 2 and problem["reason"] == "bad-signature"
    (tmp_path / "cut.cbor").write_bytes(data[:-3])
    result = pot("transcript", "verify", tmp_path / "cut.cbor")
    assert result.exit_code == 1 and "record 3" in result.stdout and "truncated" in result.stdout


def test_transcript_verify_refuses_a_missing_file(tmp_path):
    result = pot("transcript", "verify", tmp_path / "none.cbor")
    assert result.exit_code == 2 and "cannot read transcript" in result.stderr


def test_spec_validate_prints_the_digest(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text("steps = 20\n[model]\nn_layer = 1\n")
    result = pot("spec", "validate", spec)
    assert result.exit_code == 0, result.output
    assert Spec.from_toml(spec).digest().hex() in result.stdout
    result = pot("spec", "validate", spec, "--json")
    assert json.loads(result.stdout)["digest"] == Spec.from_toml(spec).digest().hex()


@pytest.mark.parametrize(
    "example", sorted((ROOT / "examples/specs/validation").glob("*.toml")), ids=lambda p: p.name
)
def test_spec_validate_refuses_bad_examples_with_exit_2(example):
    reason = example.read_text().splitlines()[0].removeprefix("# refused: ").strip()
    result = pot("spec", "validate", example)
    assert result.exit_code == 2
    assert reason in result.stderr and result.stderr.startswith("error: ")


def test_spec_show_prints_every_field(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text("[optimizer]\nkind = 'sgd'\n")
    result = pot("spec", "show", spec)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["spec"]["optimizer"]["kind"] == "sgd"
    assert shown["spec"]["batch"]["seq_len"] == Spec().batch.seq_len
    assert shown["digest"] == Spec.from_toml(spec).digest().hex()


def test_the_installed_command_line_exits_with_the_documented_codes(tmp_path):
    _transcript(tmp_path / "t.cbor")
    (tmp_path / "bad.cbor").write_bytes(b"\x00" + (tmp_path / "t.cbor").read_bytes())
    cmd = [sys.executable, "-m", "pot", "transcript", "verify"]
    ok = subprocess.run(
        [*cmd, str(tmp_path / "t.cbor")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    bad = subprocess.run(
        [*cmd, str(tmp_path / "bad.cbor")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert bad.returncode == 1 and "record 0" in bad.stdout
