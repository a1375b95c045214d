"""bench/incentives.py with a few draws: every strategy measured at every share on the real state
machine, honest verification paid, a lazy verifier out of pocket, an honest miner's stake back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_incentives_bench_json_has_every_strategy_and_the_signs():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "incentives.py"), "--draws", "6", "--seed", "3", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    results = out["results"]
    expected = {"honest", "lazy", "noisy", "sybil", "withholder", "griefer",
                "miner fakes 0", "miner fakes 1/4", "miner fakes 1/2", "miner fakes 1"}
    assert set(results) == expected
    shares = {"alone", "s=0.05", "s=0.2", "s=0.34", "s=0.5"}
    assert all(set(rows) == shares for rows in results.values())
    assert all(cell["draws"] == 6 for rows in results.values() for cell in rows.values())
    assert out["replay_cost_units"] == out["seat_fee"] / 2  # the default: half the seat fee
    # A coalition of 20% of the stake holds seats in every run even with few draws (one account
    # alone may sit on none in six runs): honest play is paid, lazy play loses.
    assert results["honest"]["s=0.2"]["profit_bp"] > 0 and results["honest"]["alone"]["profit_bp"] >= 0
    assert results["lazy"]["s=0.2"]["profit_bp"] < 0 and results["lazy"]["alone"]["profit_bp"] <= 0
    # An honest miner facing honest verifiers gets its whole stake back in every run.
    assert results["miner fakes 0"]["alone"]["stake_released_in_full"] == 1
    # A miner that faked every step is slashed in every run.
    assert results["miner fakes 1"]["alone"]["slashed"] == 1
    rules = [v["rule"] for v in out["verdicts"]]
    assert rules[0].startswith("honest verification has positive expected profit")
    assert any(rule.startswith("an honest miner's expected loss is zero") for rule in rules)


def test_incentives_bench_refuses_one_draw():
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "incentives.py"), "--draws", "1"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--draws must be at least 2" in r.stderr
