"""`pot demo` as a person runs it: a subprocess whose last line is the JSON summary. Every verifier
bonds before the runs; the honest run must be judged honest, the substituted step fraud, the noisy
and the lazy verifier outliers of every challenge, penalised from their bonds, and no other; the
honest verifiers' winning seats are paid their fees (and a share of the slash), the others nothing."""

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

    # Every challenge is on the list, decided in its first round (nobody escalates), each with the
    # size of its cluster out of four reveals: every verifier holds seats on every committee.
    by_id = {c["id"]: c for c in summary["challenges"]}
    assert {v["challenge_id"] for r in summary["runs"] for v in r["verdicts"]} == set(by_id)
    assert len(by_id) == 2 * summary["params"]["challenges_per_run"]
    for c in by_id.values():
        assert c["run_id"] in (honest["run_id"], substituted["run_id"])
        assert c["round"] == 1 and c["rechallenge"] is None and c["escalated_by"] == [], c
        assert sorted(c["committee"]) == ["v1", "v2", "v3", "v4"], c  # in account order: SS58 on chopsticks
        # a seat per verifier_stake of bond: the cluster counts the honest verifiers' seats
        assert c["reveals"] == 4 and c["cluster_size"] == c["seats"]["v1"] + c["seats"]["v2"], c
        assert sorted(c["outliers"]) == ["v3", "v4"]
        # The noisy and the lazy verifier pay the outlier penalty; nobody pays for a no-show.
        assert sorted((p["verifier"], p["why"]) for p in c["penalties"]) == [("v3", "outlier"), ("v4", "outlier")]
        # Only the winning seats are paid: the same seat fee a seat, and of a fraud a share of the slash.
        fees = {p["verifier"]: p["amount"] for p in c["payments"] if p["why"] == "seat_fee"}
        assert set(fees) == {"v1", "v2"} and fees["v1"] * c["seats"]["v2"] == fees["v2"] * c["seats"]["v1"], c
        shares = {p["verifier"] for p in c["payments"] if p["why"] == "slash_share"}
        assert shares == ({"v1", "v2"} if c["verdict"] == "fraud" else set()), c
    assert by_id[forced[0]["challenge_id"]]["forced"] is True

    verifiers = {v["name"]: v for v in summary["verifiers"]}
    assert set(verifiers) == {"v1", "v2", "v3", "v4"}
    penalty = summary["params"]["outlier_penalty"]
    for name, fault in (("v3", "noise"), ("v4", "lazy")):
        v = verifiers[name]
        assert v["faulty"] and v["fault"] == fault and v["outlier_count"] == len(by_id)
        assert v["bond_before"] >= summary["params"]["verifier_stake"]
        owed = sum(penalty * c["seats"][name] for c in by_id.values())  # a penalty per seat held
        assert v["bond_after"] == v["bond_before"] - owed and v["penalised"] == owed
        assert v["paid"] == 0 and v["payments"] == [] and v["escalations"] == 0 and v["forfeited"] == 0
    for name in ("v1", "v2"):
        v = verifiers[name]
        assert not v["faulty"] and v["outlier_count"] == 0
        assert v["penalties"] == [] and v["paid"] > 0 and v["escalations"] == 0
        assert v["bond_after"] == v["bond_before"] + v["paid"] and v["bond_before"] >= summary["params"]["verifier_stake"]
    assert summary["checks"]["lazy_verifier_penalised"] and summary["checks"]["lazy_verifier_outside_cluster"]
    assert summary["checks"]["honest_verifiers_paid"] and summary["checks"]["bonds_add_up"]
    assert summary["ok"] is True and all(summary["checks"].values())
    assert 0 < summary["seconds"] < limit


def check_events_agree(summary: dict, chain: str) -> None:
    """`pot chain events` on the demo's chain, with no flags, derives the demo's own history: the
    same challenges of its runs, the same verdicts, and no call of theirs refused."""
    out = subprocess.run([sys.executable, "-m", "pot", "chain", "events", "--chain", chain, "--json"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for line in out.stdout.splitlines()]
    run_ids = {r["run_id"] for r in summary["runs"]}
    issued = {e["challenge_id"] for e in events if e["event"] == "ChallengeIssued" and e["run_id"] in run_ids}
    assert issued == {c["id"] for c in summary["challenges"]}
    resolved = {e["challenge_id"]: e["verdict"] for e in events if e["event"] == "ChallengeResolved"
                and e["challenge_id"] in issued}
    assert resolved == {v["challenge_id"]: v["verdict"] for r in summary["runs"] for v in r["verdicts"]}
    miners = {r["miner"] for r in summary["runs"]}
    assert [e for e in events if e["event"] == "CallRefused" and e["origin"] in miners] == []
    # Every verifier bonded before either run was registered: the demo waits for the bonds.
    registered = min(e["block"] for e in events if e["event"] == "RunRegistered" and e["run_id"] in run_ids)
    bonded = {e["verifier"] for e in events if e["event"] == "VerifierBonded" and e["block"] < registered}
    assert {v["account"] for v in summary["verifiers"]} <= bonded


@pytest.mark.e2e
@pytest.mark.slow
def test_demo_on_the_dev_chain(tmp_path):
    # Node settings left in the shell must not reach the demo's nodes: were this one to, every
    # verifier would follow another chain, none would bond and no verdict would be reached.
    summary = run_demo(tmp_path, "--substitute-at", "6",
                       env={"POT_CHAIN_URL": f"dev:///{tmp_path / 'another-chain.db'}"})
    check_summary(summary, 6)
    assert summary["chain"].startswith("dev://")
    check_events_agree(summary, summary["chain"])
    # The work folder was kept (--workdir) with every child's log; no child outlived the demo.
    logs = {p.name for p in (tmp_path / "demo" / "logs").iterdir()}
    assert {"v1.log", "v2.log", "v3.log", "v4.log", "miner-honest.log", "miner-substituted.log"} <= logs
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
    check_events_agree(summary, chopsticks.url)
