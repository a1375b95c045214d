"""`pot oracle walk` and `pot oracle step`: JSON lines, replay from saved states, clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commitments.dataset import prepare_default_corpus
from pot.cli import app

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC_TOML = """
profile = "exact-v1"
steps = 10
[model]
vocab_size = 256
block_size = 16
n_layer = 1
n_head = 2
n_embd = 16
dropout = 0.1
[batch]
batch_size = 2
seq_len = 16
[rng]
seed = 3
schedule_seed = 4
"""

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    spec = d / "spec.toml"
    spec.write_text(SPEC_TOML)
    data = d / "corpus.npy"
    prepare_default_corpus(data, max_bytes=1 << 18)
    return d, spec, data


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_walk_then_replay_each_step(files):
    d, spec, data = files
    saves = d / "states"
    r = runner.invoke(app, ["oracle", "walk", "--spec", str(spec), "--data", str(data), "--steps", "3",
                            "--json", "--save-dir", str(saves)])
    assert r.exit_code == 0, r.output
    lines = _json_lines(r.stdout)
    assert [x["step"] for x in lines] == [1, 2, 3]
    for x in lines:
        assert set(x) == {"step", "loss_bits", "state_digest"}
        assert x["loss_bits"].startswith("0x") and len(x["loss_bits"]) == 10
        assert len(bytes.fromhex(x["state_digest"])) == 32
    assert len({x["state_digest"] for x in lines}) == 3
    for t in (1, 3):
        r = runner.invoke(app, ["oracle", "step", "--state", str(saves / f"state_{t - 1}.safetensors"),
                                "--spec", str(spec), "--data", str(data), "--step", str(t), "--json",
                                "--micro-batches", "2"])
        assert r.exit_code == 0, r.output
        (got,) = _json_lines(r.stdout)
        assert {k: got[k] for k in ("step", "loss_bits", "state_digest")} == lines[t - 1]
        assert isinstance(got["norm_bucket"], int)


def test_walk_is_reproducible_and_human_output(files):
    _, spec, data = files
    a = runner.invoke(
        app, ["oracle", "walk", "--spec", str(spec), "--data", str(data), "--steps", "1", "--json"]
    )
    b = runner.invoke(app, ["oracle", "walk", "--spec", str(spec), "--data", str(data), "--steps", "1",
                            "--threads", "1"])
    assert a.exit_code == 0 and b.exit_code == 0
    assert _json_lines(a.stdout)[0]["state_digest"] in b.stdout


@pytest.mark.parametrize("case,msg", [
    ("missing-spec", "cannot read spec"),
    ("bad-toml", "not valid TOML"),
    ("missing-data", "no such corpus file"),
    ("too-many-steps", "exceeds the spec's declared steps"),
])
def test_walk_errors(files, case, msg):
    d, spec, data = files
    args = {"spec": str(spec), "data": str(data), "steps": "1"}
    if case == "missing-spec":
        args["spec"] = str(d / "absent.toml")
    elif case == "bad-toml":
        bad = d / "bad.toml"
        bad.write_text("[model\n")
        args["spec"] = str(bad)
    elif case == "missing-data":
        args["data"] = str(d / "absent.npy")
    else:
        args["steps"] = "11"
    r = runner.invoke(app, ["oracle", "walk", "--spec", args["spec"], "--data", args["data"],
                            "--steps", args["steps"], "--json"])
    assert r.exit_code == 2
    assert "error:" in r.stderr and msg in r.stderr
    assert "Traceback" not in r.output


def test_step_errors(files):
    d, spec, data = files
    junk = d / "junk.safetensors"
    junk.write_bytes(b"junk")
    r = runner.invoke(app, ["oracle", "step", "--state", str(junk), "--spec", str(spec), "--data", str(data),
                            "--step", "1"])
    assert r.exit_code == 2 and "not a safetensors file" in r.stderr
    saves = d / "s2"
    runner.invoke(app, ["oracle", "walk", "--spec", str(spec), "--data", str(data), "--steps", "1",
                        "--json", "--save-dir", str(saves)])
    r = runner.invoke(
        app,
        [
            "oracle",
            "step",
            "--state",
            str(saves / "state_1.safetensors"),
            "--spec",
            str(spec),
            "--data",
            str(data),
            "--step",
            "1",
        ],
    )
    assert r.exit_code == 2 and "needs the state after step 0" in r.stderr
