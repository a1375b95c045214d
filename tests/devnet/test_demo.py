"""The demo's own parts, without a network: its options, its model, its block pacing and the TOML
it writes for its processes. tests/e2e/test_demo.py runs the whole demo."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

from chain.protocol import ChallengeState, ProtocolParams, ProtocolState, RunState
from devnet.demo import SPEC, Demo, demo_params
from devnet.toml import to_toml

REPO = Path(__file__).resolve().parents[2]


def test_demo_refuses_bad_options(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    base = [sys.executable, "-m", "pot", "demo", "--no-serve", "--workdir", str(tmp_path)]
    out = subprocess.run([*base, "--steps", "5", "--substitute-at", "9"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "--substitute-at 9 is outside steps 1..5" in out.stderr
    out = subprocess.run([*base, "--chain", "http://example"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "ws://host:port" in out.stderr


def test_demo_spec_is_the_example_spec():
    """The README's miner quick start trains examples/specs/gpt-demo.toml: the demo's own model."""
    example = tomllib.loads((REPO / "examples/specs/gpt-demo.toml").read_text())
    assert example == SPEC


def _pacing_demo(tmp_path, head: int, **challenge: object):
    """A Demo whose chain view holds one run and (optionally) one open challenge at `head`."""
    d = Demo(tmp_path, chain=None, port=0, steps=10, substitute_at=7, timeout=60, say=lambda m: None)
    d.verifier_accounts = {"v1": "v1", "v2": "v2", "v3": "v3"}
    st = ProtocolState(params=demo_params(10, 7), head=head)
    st.runs[b"r" * 32] = RunState(b"r" * 32, "miner-a", b"", b"s" * 32, "value", 10, "http://x", 1000,
                                  challenges_at=5)
    if challenge:
        fields = dict(challenge_id=b"c" * 32, run_id=b"r" * 32, index=0, step=7, root=b"o" * 32, size=11,
                      mode="value", issued=5, opening_deadline=65, commit_deadline=185, reveal_deadline=245)
        fields.update(challenge)
        st.challenges[b"c" * 32] = ChallengeState(**fields)
    d.view = SimpleNamespace(state=st)
    return d


def test_blocks_slow_while_someone_must_act_and_fast_otherwise(tmp_path):
    everyone = {"v1": b"x", "v2": b"x", "v3": b"x"}
    opened = {"opening_digest": b"d" * 32}
    # Waiting for the opening, then for commits, then for reveals: blocks at the slow pace.
    assert _pacing_demo(tmp_path, 10, opening=None).someone_must_act()
    assert _pacing_demo(tmp_path, 70, opening=opened, commitments={"v1": b"x"}).someone_must_act()
    assert _pacing_demo(tmp_path, 190, opening=opened, commitments=everyone,
                        reveals={"v1": [b"x", 0]}).someone_must_act()
    # Everyone acted in the window at hand: fast, so nobody waits for idle blocks.
    assert not _pacing_demo(tmp_path, 70, opening=opened, commitments=everyone).someone_must_act()
    assert not _pacing_demo(tmp_path, 190, opening=opened, commitments=everyone,
                            reveals={k: [b"x", 0] for k in everyone}).someone_must_act()
    # A missed opening deadline is not waited for; a resolved challenge neither.
    assert not _pacing_demo(tmp_path, 66, opening=None, commitments=everyone).someone_must_act()
    assert not _pacing_demo(tmp_path, 100, verdict="fraud").someone_must_act()
    # A complete run whose challenges are not issued yet: fast.
    assert not _pacing_demo(tmp_path, 6).someone_must_act()


def test_demo_toml_round_trips():
    params = demo_params(10, 7)
    back = tomllib.loads(to_toml({"protocol": params.to_dict()}))["protocol"]
    assert ProtocolParams.from_dict(back) == params
    assert tomllib.loads(to_toml({"key": {"uri": '//Al"ice'}}))["key"]["uri"] == '//Al"ice'
