"""`pot verify opening`: exit 0 only when the opening verifies; the verdict and reason in JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from challenges.opening import build_opening
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk
from tests.node.harness import REPO

STEP = 2


@pytest.fixture(scope="module")
def openings(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify")
    spec = tiny_spec(3)
    out = {}
    for name, sub in (("honest", None), ("fraud", STEP)):
        w = walk(spec, corpus(d), substitute_at=sub)
        path = d / f"{name}.opening"
        path.write_bytes(build_opening(spec=w.spec, run_id=RUN_ID, step=STEP, pre_state=w.states[STEP - 1],
                                       dataset=w.dataset, schedule=w.schedule, leaves=w.leaves))
        out[name] = path
    garbage = d / "garbage.opening"
    garbage.write_bytes(b"POTO1\n\x00\x00")
    out["garbage"] = garbage
    return out


def verify(*args: str) -> tuple[int, dict | str]:
    p = subprocess.run([sys.executable, "-m", "pot", "verify", "opening", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    try:
        return p.returncode, json.loads(p.stdout)
    except json.JSONDecodeError:
        return p.returncode, p.stdout + p.stderr


def test_honest_opening_verifies(openings):
    rc, out = verify(str(openings["honest"]), "--json")
    assert rc == 0 and out["ok"] is True and out["verdict"] == "verified" and out["facts"] == "opening"
    assert out["replay"]["step"] == STEP and out["replay"]["matches_leaf"] is True


def test_substituted_batch_is_a_mismatch(openings):
    rc, out = verify(str(openings["fraud"]), "--json")
    assert rc == 1 and out["verdict"] == "mismatch" and "differs" in out["reason"]


def test_refusals_and_bad_arguments(openings):
    rc, out = verify(str(openings["garbage"]), "--json")
    assert rc == 1 and out["verdict"] == "refused" and "truncated" in out["reason"]
    rc, out = verify(str(openings["honest"]), "--json", "--step", "1")
    assert rc == 1 and out["verdict"] == "refused" and "challenge is step 1" in out["reason"]
    rc, text = verify(str(openings["honest"]), "--root", "zz")
    assert rc == 2 and "--root must be hex" in text
    rc, text = verify(str(openings["honest"]), "--chain", "dev:///x.db")
    assert rc == 2 and "go together" in text
