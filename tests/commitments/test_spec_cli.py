"""`pot spec digest`, `pot spec show --canonical` and `pot spec validate --json`: what a spec file
commits to, as the chain holds it; and the docs' spec snippet and defaults list against the code."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commitments.spec import BatchSpec, HardwareClass, InitSpec, ModelSpec, OptimizerSpec, Spec, toml_value
from pot.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# A file that leaves most fields to their defaults.
MINIMAL = (
    'steps = 3\n[model]\nkind = "mlp"\nhidden = [16]\nblock_size = 16\n'
    '[batch]\nbatch_size = 2\nseq_len = 16\n'
)
SPECS = ["gpt-tiny.toml", "gpt-tiny-bf16.toml", "gpt2-finetune.toml", "llama-tiny.toml", "gpt-demo.toml"]


def pot(*args):
    return runner.invoke(app, [str(a) for a in args])


def _without_nulls(d):
    return {k: _without_nulls(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


@pytest.mark.parametrize("name", SPECS)
def test_digest_prints_the_spec_digest(name):
    path = ROOT / "examples" / "specs" / name
    result = pot("spec", "digest", path)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == Spec.from_toml(path).digest().hex()
    doc = json.loads(pot("spec", "digest", path, "--json").stdout)
    assert doc["digest"] == Spec.from_toml(path).digest().hex() and doc["path"] == str(path)
    assert doc["cbor_bytes"] == len(Spec.from_toml(path).to_cbor())


def test_digest_is_what_the_miner_registers_on_chain(tmp_path):
    """The digest `pot spec digest` prints is the spec_digest of the RunRegistered event of a run
    that the miner SDK registers from the same file."""
    from chain.dev import DevTransport
    from chain.protocol import ProtocolParams, RunRegistered
    from chain.view import ChainView
    from commitments.dataset import Dataset
    from miner.trainer import Trainer
    from tests.miner.helpers import corpus

    path = tmp_path / "spec.toml"
    path.write_text(MINIMAL)
    printed = pot("spec", "digest", path).stdout.strip()
    spec = Spec.from_toml(path)
    miner = DevTransport(tmp_path / "chain.db", "miner", sealing="instant")
    params = ProtocolParams()
    miner.record_params(params)
    ds = Dataset.open(corpus(tmp_path), spec.sample_len)
    with Trainer(spec, ds, tmp_path / "run", miner, progress=False, log=lambda _: None) as tr:
        tr.prepare()
        tr.register()
        view = ChainView(miner, params)
        view.sync()
        (reg,) = [e for e in view.of(RunRegistered) if e.run_id == tr.run_id]
    assert reg.spec_digest.hex() == printed == spec.digest().hex()
    assert view.state.runs[tr.run_id].spec_digest.hex() == printed


def test_digest_refuses_a_bad_spec_with_its_reason(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[optimizer]\nbeta3 = 0.5\n")
    result = pot("spec", "digest", path)
    assert result.exit_code == 2 and "optimizer.beta3: unknown field" in result.stderr
    result = pot("spec", "digest", tmp_path / "missing.toml")
    assert result.exit_code == 2 and "cannot read spec" in result.stderr


@pytest.mark.parametrize("name", [*SPECS, None])
def test_show_canonical_loads_back_to_the_same_spec_and_digest(tmp_path, name):
    if name is None:
        path = tmp_path / "minimal.toml"
        path.write_text(MINIMAL)
    else:
        path = ROOT / "examples" / "specs" / name
    spec = Spec.from_toml(path)
    result = pot("spec", "show", path, "--canonical")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert spec.digest().hex() in text.splitlines()[0]
    parsed = tomllib.loads(text)
    assert parsed == _without_nulls(spec.canonical())  # every field the digest covers, nothing more
    assert Spec.from_dict(parsed).digest() == spec.digest()
    (tmp_path / "again.toml").write_text(text)
    again = pot("spec", "show", tmp_path / "again.toml", "--canonical").stdout
    assert again.splitlines()[1:] == text.splitlines()[1:]  # the first line names the file
    # the nulls and the fields left out at their default are there as comment lines
    for key, value in spec.canonical().items():
        if value is None:
            assert f"# {key} = null" in text
    for section in ("optimizer", "batch"):
        sub = getattr(spec, section)
        for field in type(sub).OMIT_AT_DEFAULT:
            if field not in spec.canonical()[section]:
                assert f"# {field} = {toml_value(getattr(sub, field))}" in text
    if spec.init is None:
        assert "# [init] absent" in text


def test_show_canonical_uncommented_keeps_the_digest(tmp_path):
    """Writing out a commented field at its default changes nothing."""
    path = tmp_path / "minimal.toml"
    path.write_text(MINIMAL)
    text = pot("spec", "show", path, "--canonical").stdout
    lines = [
        line[2:] if re.match(r"# (schedule|warmup_steps|decay_steps|min_lr|micro_batches) = ", line) else line
        for line in text.splitlines()
    ]
    assert lines != text.splitlines()
    assert Spec.from_dict(tomllib.loads("\n".join(lines))).digest() == Spec.from_toml(path).digest()


def test_validate_json_shows_the_defaults_it_filled_in(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("steps = 20\n[model]\nn_layer = 1\n[optimizer]\nlr = 0.01\n")
    spec = Spec.from_toml(path)
    doc = json.loads(pot("spec", "validate", path, "--json").stdout)
    assert doc["spec"] == json.loads(json.dumps(spec.canonical()))
    defaults = doc["defaults"]
    assert defaults["model.hidden"] == [256] and defaults["optimizer.momentum"] == 0.9
    assert defaults["hardware"] is None and defaults["profile"] == "exact-v1"
    assert defaults["optimizer.beta2"] == 0.95 and defaults["optimizer.grad_clip"] == 1.0
    assert "steps" not in defaults and "model.n_layer" not in defaults and "optimizer.lr" not in defaults
    # every canonical field is given or a default, never both
    flat = _flatten(spec.canonical())
    given = {"steps", "model.n_layer", "optimizer.lr"}
    assert set(defaults) == set(flat) - given
    text = pot("spec", "validate", path).stdout
    assert "model.hidden = [256]" in text and "hardware = null" in text and "steps = " not in text


def test_validate_of_a_file_that_gives_everything_lists_only_the_implicit_defaults():
    path = ROOT / "examples" / "specs" / "gpt-tiny.toml"
    doc = json.loads(pot("spec", "validate", path, "--json").stdout)
    assert doc["defaults"] == {"model.hidden": [256], "optimizer.momentum": 0.9, "hardware": None}


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


# --- the docs ---------------------------------------------------------------------------------


def _docs_snippet() -> tuple[str, str]:
    """(spec file, the TOML block docs/miner.md shows as its `pot spec show --canonical` output)."""
    doc = (ROOT / "docs" / "miner.md").read_text()
    m = re.search(r"```sh\npot spec show --canonical (\S+)\n```\n\n```toml\n(.*?)```", doc, re.S)
    assert m, "docs/miner.md shows no `pot spec show --canonical FILE` output"
    return m.group(1), m.group(2)


def test_the_miner_guide_snippet_is_the_canonical_form_of_its_file():
    name, snippet = _docs_snippet()
    path = ROOT / name
    spec = Spec.from_toml(path)
    shown = runner.invoke(app, ["spec", "show", "--canonical", name]).stdout
    assert tomllib.loads(snippet) == tomllib.loads(shown) == _without_nulls(spec.canonical())
    assert snippet == shown, "docs/miner.md's snippet is not `pot spec show --canonical` of its file"
    for field in ("beta2", "grad_clip", "profile", "momentum", "hidden", "hardware"):
        assert re.search(rf"^#? ?{field} = ", snippet, re.M), field


def _defaults_table() -> dict[str, tuple[str, str]]:
    doc = (ROOT / "docs" / "protocol.md").read_text()
    section = doc[doc.index("#### 3.4.1"):doc.index("### 3.5")]
    rows = re.findall(r"^\| `([a-z_.0-9]+)` \| (.+?) \| (.+?) \|$", section, re.M)
    assert rows, "no defaults table in docs/protocol.md §3.4.1"
    table = {f: (d, where) for f, d, where in rows}
    assert len(table) == len(rows), "a field is listed twice"
    return table


def _default_text(v) -> str:
    return "`null`" if v is None else f"`{toml_value(v)}`"


def test_the_protocol_lists_every_default_of_the_canonical_map():
    table = _defaults_table()
    gpt = _flatten(Spec().canonical())
    for field, value in gpt.items():  # every field of the default (GPT) map, at its default
        assert field in table, f"docs/protocol.md §3.4.1 does not list {field}"
        assert table[field][0] == _default_text(value), field
    llama = _flatten(Spec.from_dict({"model": {"kind": "llama", "intermediate_size": 64}}).canonical())
    for field in set(llama) - set(gpt):
        assert field in table and "llama" in table[field][1], field
    assert (
        table["model.n_kv_head"][0] == "`model.n_head`" and "required" in table["model.intermediate_size"][0]
    )
    for field in ("model.rope_theta", "model.rms_eps"):
        assert table[field][0] == _default_text(llama[field])
    for section, cls in (("optimizer", OptimizerSpec), ("batch", BatchSpec)):
        for field in cls.OMIT_AT_DEFAULT:  # the later fields, left out at their default
            row = table[f"{section}.{field}"]
            assert row == (_default_text(cls.model_fields[field].default), "unless default")
    for prefix, cls in (("model", ModelSpec), ("optimizer", OptimizerSpec), ("batch", BatchSpec),
                        ("hardware", HardwareClass), ("init", InitSpec)):
        for field, info in cls.model_fields.items():
            key = f"{prefix}.{field}"
            assert key in table, f"docs/protocol.md §3.4.1 does not list {key}"
            if info.is_required():
                assert "required" in table[key][0], key
            elif prefix in ("hardware", "init"):
                assert table[key][0] == _default_text(info.default), key
    listed = {f.split(".")[0] for f in table}
    assert listed == set(Spec.model_fields), listed ^ set(Spec.model_fields)
    assert table["init"][0] == "absent" and table["hardware"][0] == "`null`"


@pytest.mark.parametrize(
    ("section", "field"), [(None, "hardware"), ("model", "hidden"), ("optimizer", "momentum")]
)
def test_a_spec_encoded_without_a_default_names_the_field(section, field):
    """Another encoder that leaves out a field at its default gets the field named, and told that
    the canonical form holds defaults too."""
    from commitments import cbor
    from commitments.canonical import first_difference

    spec = Spec()
    short = spec.canonical()
    del (short[section] if section else short)[field]
    why = first_difference(cbor.encode(short), spec.to_cbor())
    path = f"{section}.{field}" if section else field
    assert why.startswith(f"{path}: missing; the canonical form holds every field, defaults included"), why
    assert (
        cbor.encode(getattr(spec, field) if section is None else spec.canonical()[section][field]).hex()
        in why
    )
