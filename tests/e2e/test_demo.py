"""`pot demo` as a person runs it: a subprocess whose last line is the JSON summary. The honest run
must be judged honest, the substituted step fraud, the noisy verifier an outlier and no other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chain.chopsticks_env import chopsticks  # noqa: F401 - the fixture is used by name

REPO = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT = 600


def run_demo(tmp_path: Path, *extra: str, timeout: float = DEMO_TIMEOUT, env: dict | None = None) -> dict:
    cmd = [sys.executable, "-m", "pot", "demo", "--json", "--no-serve", "--port", "0",
           "--workdir", str(tmp_path / "demo"), *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout + 60)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted((tmp_path / "demo" / "logs").glob("*.log")))
    assert out.returncode == 0, f"demo exited {out.returncode}\n{out.stderr[-4000:]}\n{logs}"
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-3000:]
    return json.loads(lines[-1])


def check_summary(summary: dict, substitute_at: int, limit: float = DEMO_TIMEOUT) -> None:
    runs = {r["honest"]: r for r in summary["runs"]}
    assert set(runs) == {True, False}
    honest, substituted = runs[True], runs[False]
    assert honest["verdicts"] and all(v["verdict"] == "honest" for v in honest["verdicts"])
    assert substituted["substituted_step"] == substitute_at
    forced = [v for v in substituted["verdicts"] if v["step"] == substitute_at]
    assert [v["verdict"] for v in forced] == ["fraud"]
    assert substituted["slashed"] > 0 and honest["slashed"] == 0

    # Every challenge is on the list, each with the size of its cluster out of three reveals.
    by_id = {c["id"]: c for c in summary["challenges"]}
    assert {v["challenge_id"] for r in summary["runs"] for v in r["verdicts"]} == set(by_id)
    for c in by_id.values():
        assert c["run_id"] in (honest["run_id"], substituted["run_id"])
        assert c["reveals"] == 3 and c["cluster_size"] == 2, c
        assert c["outliers"] == ["v3"]
    assert by_id[forced[0]["challenge_id"]]["forced"] is True

    verifiers = {v["name"]: v for v in summary["verifiers"]}
    assert set(verifiers) == {"v1", "v2", "v3"}
    assert verifiers["v3"]["faulty"] and verifiers["v3"]["outlier_count"] == len(by_id)
    for name in ("v1", "v2"):
        assert not verifiers[name]["faulty"] and verifiers[name]["outlier_count"] == 0
    assert summary["ok"] is True and all(summary["checks"].values())
    assert 0 < summary["seconds"] < limit


@pytest.mark.e2e
@pytest.mark.slow
def test_demo_on_the_dev_chain(tmp_path):
    # Node settings left in the shell must not reach the demo's nodes: were this one to, every
    # verifier would reveal noise and no verdict would be reached.
    summary = run_demo(tmp_path, "--substitute-at", "6", env={"POT_NODE_FAULT": "noise"})
    check_summary(summary, 6)
    assert summary["chain"].startswith("dev://")
    # The work folder was kept (--workdir) with every child's log; no child outlived the demo.
    logs = {p.name for p in (tmp_path / "demo" / "logs").iterdir()}
    assert {"v1.log", "v2.log", "v3.log", "miner-honest.log", "miner-substituted.log"} <= logs
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "demo") not in ps


@pytest.mark.e2e
@pytest.mark.chopsticks
@pytest.mark.slow
def test_demo_on_chopsticks(tmp_path, chopsticks):  # noqa: F811 - the fixture
    # A chopsticks block is a runtime execution: the same windows take longer to pass.
    summary = run_demo(tmp_path, "--chain", chopsticks.url, "--timeout", "1500", timeout=1500)
    check_summary(summary, 7, limit=1500)
    assert summary["chain"] == chopsticks.url


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
    import tomllib

    from devnet.demo import SPEC

    example = tomllib.loads((REPO / "examples/specs/gpt-demo.toml").read_text())
    assert example == SPEC


def _pacing_demo(tmp_path, head: int, **challenge: object):
    """A Demo whose chain view holds one run and (optionally) one open challenge at `head`."""
    from types import SimpleNamespace

    from chain.protocol import ChallengeState, ProtocolState, RunState
    from devnet.demo import Demo, demo_params

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
    import tomllib

    from chain.protocol import ProtocolParams
    from devnet.demo import demo_params, to_toml

    params = demo_params(10, 7)
    back = tomllib.loads(to_toml({"protocol": params.to_dict()}))["protocol"]
    assert ProtocolParams.from_dict(back) == params
    assert tomllib.loads(to_toml({"key": {"uri": '//Al"ice'}}))["key"]["uri"] == '//Al"ice'
