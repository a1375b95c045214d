"""The demo's own parts, without a network: its options, its model, its block pacing and the TOML
it writes for its processes. tests/e2e/test_demo.py runs the whole demo."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from chain import protocol as P
from chain.protocol import ChallengeState, ProtocolParams, ProtocolState, RunState
from chain.protocol.events import VerifierPenalized
from devnet.demo import DEMO_BOND, SPEC, VERIFIERS, Demo, demo_params
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
    d.verifier_accounts = {name: name for name, _ in VERIFIERS}
    st = ProtocolState(params=demo_params(10, 7), head=head)
    st.runs[b"r" * 32] = RunState(b"r" * 32, "miner-a", b"", b"s" * 32, "value", 10, "http://x", 1000,
                                  challenges_at=5)
    if challenge:
        fields = dict(challenge_id=b"c" * 32, run_id=b"r" * 32, index=0, step=7, root=b"o" * 32, size=11,
                      mode="value", issued=5, opening_deadline=65, commit_deadline=185, reveal_deadline=245,
                      committee=["v1", "v2", "v3", "v4"])
        fields.update(challenge)
        st.challenges[b"c" * 32] = ChallengeState(**fields)
    d.view = SimpleNamespace(state=st)
    return d


def test_blocks_slow_while_someone_must_act_and_fast_otherwise(tmp_path):
    everyone = {"v1": b"x", "v2": b"x", "v3": b"x", "v4": b"x"}
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
    # Only the committee is waited for: a verifier without a seat holds no block.
    seated = {"v1": b"x", "v2": b"x"}
    assert not _pacing_demo(tmp_path, 70, opening=opened, committee=["v1", "v2"],
                            commitments=seated).someone_must_act()
    assert _pacing_demo(tmp_path, 70, opening=opened, committee=["v1", "v2", "v4"],
                        commitments=seated).someone_must_act()


def test_demo_params_seat_every_verifier():
    p = demo_params(10, 7)
    assert p.committee_size >= len(VERIFIERS) and p.challenges_per_run == 2
    assert p.forced_challenge_steps == (7,) and DEMO_BOND >= p.verifier_stake + 4 * p.outlier_penalty * (DEMO_BOND // p.verifier_stake)
    assert [f for _, f in VERIFIERS] == ["none", "none", "noise", "lazy"]


def test_node_configs_bond_and_name_their_fault(tmp_path):
    d = Demo(tmp_path, chain=None, port=0, steps=10, substitute_at=7, timeout=60, say=lambda m: None)
    d.chain_url = f"dev://{tmp_path / 'chain.db'}"
    for name, fault in VERIFIERS:
        doc = tomllib.loads(d.node_config(name, fault).read_text())
        assert doc["verifier"] == {"bond": DEMO_BOND}
        assert doc["node"]["fault"] == fault and doc["chain"]["account"] == name
        assert ProtocolParams.from_dict(doc["protocol"]) == d.params


def _history(tmp_path, *, lazy_penalised: bool):
    """A Demo that watched two runs of one challenge each to their verdicts: the honest run honest,
    the substituted step fraud, v3 and v4 outside the winning cluster (v4 penalised or not)."""
    d = Demo(tmp_path, chain=None, port=0, steps=10, substitute_at=7, timeout=60, say=lambda m: None)
    d.verifier_accounts = {name: name for name, _ in VERIFIERS}
    d.bonds_before = dict.fromkeys(d.verifier_accounts, DEMO_BOND)
    from devnet.demo import RunInfo

    d.runs = [RunInfo("miner-a", True, None), RunInfo("miner-b", False, 7)]
    committee = tuple(name for name, _ in VERIFIERS)
    vbonds = dict.fromkeys(committee, DEMO_BOND)
    for i, (miner, verdict) in enumerate((("miner-a", "honest"), ("miner-b", "fraud"))):
        rid, cid = bytes([i + 1]) * 32, bytes([i + 9]) * 32
        d.on_event(P.RunRegistered(1, rid, miner, b"s" * 32, "value", 10, "", b"i" * 32, b"h" * 32, b"d" * 32, 1000))
        d.on_event(P.CheckpointRootUpdated(3, rid, b"o" * 32, 11, True, 5))
        d.on_event(P.ChallengeIssued(5 + i, cid, rid, 0, 7, b"o" * 32, 11, "value", "", 65, 185, 245, 1, None,
                                     committee))
        d.on_event(P.ChallengeResolved(250, cid, rid, 7, verdict, "", "value", b"w" * 32, 2, 4,
                                       ((b"w" * 32, 2), (b"x" * 32, 1), (b"y" * 32, 1)), ("v3", "v4")))
        for v in ("v3", "v4") if lazy_penalised else ("v3",):
            d.on_event(VerifierPenalized(250, cid, v, 50, "outlier"))
            vbonds[v] -= 50
    d.view = SimpleNamespace(state=ProtocolState(params=d.params, vbonds=vbonds))
    return d


def test_the_summary_shows_the_lazy_verifier_penalised_and_every_bond(tmp_path):
    summary = _history(tmp_path, lazy_penalised=True).summary()
    assert summary["ok"] is True and all(summary["checks"].values()), summary["checks"]
    verifiers = {v["name"]: v for v in summary["verifiers"]}
    assert verifiers["v4"]["fault"] == "lazy" and verifiers["v4"]["outlier_count"] == 2
    assert [p["why"] for p in verifiers["v4"]["penalties"]] == ["outlier", "outlier"]
    assert (verifiers["v4"]["bond_before"], verifiers["v4"]["bond_after"]) == (DEMO_BOND, DEMO_BOND - 100)
    assert (verifiers["v1"]["bond_before"], verifiers["v1"]["bond_after"], verifiers["v1"]["penalised"]) == (
        DEMO_BOND, DEMO_BOND, 0)
    (c, *_) = summary["challenges"]
    assert c["committee"] == ["v1", "v2", "v3", "v4"] and c["outliers"] == ["v3", "v4"]
    assert {p["verifier"] for p in c["penalties"]} == {"v3", "v4"}
    # An unpenalised lazy verifier fails the demo's check.
    checks = _history(tmp_path, lazy_penalised=False).summary()["checks"]
    assert checks["lazy_verifier_penalised"] is False and checks["lazy_verifier_outside_cluster"] is True


def test_demo_toml_round_trips():
    params = demo_params(10, 7)
    back = tomllib.loads(to_toml({"protocol": params.to_dict()}))["protocol"]
    assert ProtocolParams.from_dict(back) == params
    assert tomllib.loads(to_toml({"key": {"uri": '//Al"ice'}}))["key"]["uri"] == '//Al"ice'


def test_the_demo_waits_for_every_bond_on_chain(tmp_path):
    """wait_bonds reads the chain's state: it returns once each verifier's bond is on chain (here
    sent by the test in each verifier's name, as each node does on start) and records it."""
    from chain.calls import BondVerifier
    from chain.dev import DevTransport
    from devnet.demo import DemoError

    said: list[str] = []
    d = Demo(tmp_path, chain=None, port=0, steps=10, substitute_at=7, timeout=60, say=said.append)
    d.open_chain()
    try:
        d.verifier_accounts = {name: name for name, _ in VERIFIERS}
        with pytest.raises(DemoError, match="v1, v2, v3, v4 had no bond"):
            d.wait_bonds(timeout=1.0)
        for name, _ in VERIFIERS:
            DevTransport(tmp_path / "chain.db", name).submit([BondVerifier(amount=DEMO_BOND)], timeout=30)
        d.wait_bonds(timeout=30.0)
        assert d.bonds_before == dict.fromkeys(d.verifier_accounts, DEMO_BOND)
        assert any(line.startswith("every verifier is bonded") for line in said)
    finally:
        d.close()
