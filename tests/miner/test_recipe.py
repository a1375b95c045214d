"""Run documents: write, verify EQUAL, a wrong promise DIFFERENT, tampering refused before compute."""

from __future__ import annotations

import json

import pytest
from nacl.signing import SigningKey
from typer.testing import CliRunner

from commitments import cbor
from commitments.dataset import Dataset
from commitments.hashing import digest
from miner.cli import recipe_app
from miner.recipe import (
    DIFFERENT,
    EQUAL,
    RECIPE_VERSION,
    RecipeRefused,
    load_recipe,
    promise_steps,
    verify_recipe,
    write_recipe,
)
from tests.miner.helpers import corpus, tiny_spec, walk

STEPS = 10
runner = CliRunner()


def spec_toml(path, steps=STEPS):
    path.write_text(f"""
steps = {steps}
[model]
kind = "mlp"
block_size = 16
hidden = [32]
[batch]
batch_size = 4
seq_len = 16
[rng]
seed = 7
schedule_seed = 11
""")
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    base = tmp_path_factory.mktemp("recipe")
    data = corpus(base)
    spec_path = spec_toml(base / "spec.toml")
    doc = base / "run.recipe"
    r = runner.invoke(
        recipe_app,
        [
            "write",
            "--spec",
            str(spec_path),
            "--data",
            str(data),
            "--steps",
            str(STEPS),
            "--out",
            str(doc),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    return base, data, doc, json.loads(r.stdout)


def test_promise_steps():
    assert promise_steps(3) == [1, 2, 3]
    assert promise_steps(10) == [1, 2, 3, 4, 5, 9, 10]
    assert promise_steps(1000) == [1, 2, 3, 4, 5, 9, 19, 49, 99, 199, 499, 999, 1000]
    with pytest.raises(RecipeRefused):
        promise_steps(0)


def test_written_document_promises_the_walk(written):
    base, data, doc, summary = written
    assert summary["promised_steps"] == [1, 2, 3, 4, 5, 9, 10]
    recipe = load_recipe(doc.read_bytes())
    states = walk(tiny_spec(STEPS), data).states
    assert recipe.promises == [(t, states[t].digest()) for t in summary["promised_steps"]]
    assert summary["bytes"] < 2000  # no tensor inside: spec, hashes and digests only


def test_verify_equal(written):
    base, data, doc, _ = written
    r = runner.invoke(recipe_app, ["verify", str(doc), "--data", str(data), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["ok"] is True
    assert [p["result"] for p in report["promises"]] == [EQUAL] * 7


def test_wrong_promise_is_different(written):
    base, data, doc, _ = written
    # Someone who signs their own document with a wrong digest: well-formed, so it is computed.
    body = cbor.decode(cbor.decode(doc.read_bytes())["body"])
    body["promises"][4][1] = bytes(32)
    key = SigningKey.generate()
    d = digest(RECIPE_VERSION, body)
    forged = cbor.encode({"body": cbor.encode(body), "digest": d, "public_key": bytes(key.verify_key),
                          "signature": key.sign(d).signature})
    spec = load_recipe(forged).spec
    report = verify_recipe(forged, Dataset.open(data, spec.sample_len))
    assert not report.ok
    assert [r.result for r in report.results] == [EQUAL] * 4 + [DIFFERENT] + [EQUAL] * 2
    path = base / "forged.recipe"
    path.write_bytes(forged)
    r = runner.invoke(recipe_app, ["verify", str(path), "--data", str(data), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["ok"] is False
    # Pinning the author's key refuses it before any compute.
    original = load_recipe(doc.read_bytes()).public_key.hex()
    r = runner.invoke(
        recipe_app, ["verify", str(path), "--data", str(data), "--expect-key", original, "--json"]
    )
    assert r.exit_code == 2 and "not the expected key" in json.loads(r.stdout)["refused"]


@pytest.mark.parametrize("where", ["promise", "spec", "signature", "truncated"])
def test_tampered_document_refused_before_compute(written, where):
    base, data, doc, _ = written
    raw = doc.read_bytes()
    outer = cbor.decode(raw)
    if where == "promise":
        body = cbor.decode(outer["body"])
        body["promises"][0][1] = bytes(32)
        outer["body"] = cbor.encode(body)
        tampered, reason = cbor.encode(outer), "does not match its digest"
    elif where == "spec":
        body = cbor.decode(outer["body"])
        body["steps"] = 9
        outer["body"] = cbor.encode(body)
        tampered, reason = cbor.encode(outer), "does not match its digest"
    elif where == "signature":
        outer["signature"] = bytes(64)
        tampered, reason = cbor.encode(outer), "signature does not verify"
    else:
        tampered, reason = raw[:-7], "not a run document"
    path = base / f"tampered-{where}.recipe"
    path.write_bytes(tampered)
    # The corpus path does not exist: a refusal here shows nothing was opened or computed.
    r = runner.invoke(recipe_app, ["verify", str(path), "--data", str(base / "absent.npy"), "--json"])
    assert r.exit_code == 2
    assert reason in json.loads(r.stdout)["refused"]


def test_another_corpus_refused(written, tmp_path):
    import numpy as np

    base, data, doc, _ = written
    other = tmp_path / "other.npy"
    tokens = np.load(data)
    np.save(other, tokens[: len(tokens) // 2])
    r = runner.invoke(recipe_app, ["verify", str(doc), "--data", str(other)])
    assert r.exit_code == 2 and "the corpus is not the document's" in r.output


def test_write_refuses_too_many_steps(written):
    base, data, _, _ = written
    spec = tiny_spec(STEPS)
    with pytest.raises(RecipeRefused, match="steps must be in 1..10"):
        write_recipe(spec, Dataset.open(data, spec.sample_len), STEPS + 1)
