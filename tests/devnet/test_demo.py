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
from chain.protocol.events import VerifierPaid, VerifierPenalized
from devnet.demo import DEMO_BOND, SPEC, VERIFIERS, Demo, demo_params, node_escalates
from devnet.render import render
from devnet.toml import to_toml
from node.config import load_config

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
    """Protocol v3 draws a committee's seats without replacement from the seat units of free bond:
    the demo's committee takes few enough units that the other run's challenge is drawn at the same
    time, and enough that every verifier sits on each (all but surely), with the honest pair's seats
    far above the quorum share and above either faulty verifier's."""
    from math import comb, sqrt

    p = demo_params(10, 7)
    assert p.challenges_per_run == 2 and p.forced_challenge_steps == (7,)
    assert [f for _, f in VERIFIERS] == ["none", "none", "noise", "lazy"]
    each = DEMO_BOND // p.verifier_stake  # seat units of one verifier
    units, seats = each * len(VERIFIERS), p.committee_size
    assert 2 * seats <= units, "two first-round challenges (one per run) must be drawable at once"
    # A verifier drawn no seat: every seat among the other verifiers' units.
    assert comb(units - each, seats) / comb(units, seats) < 1e-9
    # The honest pair holds half the units (of the second challenge: half of what the first left,
    # on average), a faulty verifier a quarter; the seats of a draw are multivariate hypergeometric.
    # The honest cluster's seats stay 5 standard deviations above the quorum share, and their lead
    # over either faulty verifier's 4.5 (a tie or a loss below one in 200 000 per pair).
    honest, faulty = 2 * each / units, each / units
    for free in (units, units - seats):  # the first challenge of the two, and the second
        fpc = (free - seats) / (free - 1)
        sd = sqrt(seats * honest * (1 - honest) * fpc)
        assert seats * honest - 5 * sd > p.quorum_share * seats
        lead_sd = sqrt(seats * fpc * (honest * (1 - honest) + faulty * (1 - faulty) + 2 * honest * faulty))
        assert seats * (honest - faulty) - 4.5 * lead_sd > 0
    # A seat's penalties never exceed its collateral, and a faulty verifier keeps a committee's
    # worth of units through four challenges of twice its expected seats.
    assert p.outlier_penalty <= p.verifier_stake and p.no_show_penalty <= p.verifier_stake
    expected = seats // len(VERIFIERS)
    assert DEMO_BOND - 4 * p.outlier_penalty * 2 * expected >= p.verifier_stake * expected


def test_node_configs_bond_and_hold_no_fault(tmp_path):
    d = Demo(tmp_path, chain=None, port=0, steps=10, substitute_at=7, timeout=60, say=lambda m: None)
    d.chain_url = f"dev://{tmp_path / 'chain.db'}"
    for name, fault in VERIFIERS:
        doc = tomllib.loads(d.node_config(name, fault).read_text())
        # only the honest nodes escalate: the faulty ones would stake on disputes they lose
        assert doc["verifier"] == {"bond": DEMO_BOND, "escalate": fault == "none"} and node_escalates(fault) == (
            fault == "none")
        # a fault is the harness's (pot devnet node --fault), never a config key: the file loads as a node's
        assert "fault" not in doc["node"] and doc["chain"]["account"] == name
        load_config(d.workdir / "nodes" / f"{name}.toml", env={})
        assert ProtocolParams.from_dict(doc["protocol"]) == d.params


def _history(tmp_path, *, lazy_penalised: bool, honest_paid: bool = True):
    """A Demo that watched two runs of one challenge each to their verdicts: the honest run honest,
    the substituted step fraud, v3 and v4 outside the winning cluster (v4 penalised or not), v1 and
    v2 (two seats each) paid a seat fee a seat, and of the fraud's slash a share (or not paid)."""
    d = Demo(tmp_path, chain=None, port=0, steps=10, substitute_at=7, timeout=60, say=lambda m: None)
    d.verifier_accounts = {name: name for name, _ in VERIFIERS}
    d.bonds_before = dict.fromkeys(d.verifier_accounts, DEMO_BOND)
    from devnet.demo import RunInfo

    d.runs = [RunInfo("miner-a", True, None), RunInfo("miner-b", False, 7)]
    committee = ("v1", "v2", "v1", "v3", "v2", "v4")  # seats, in draw order
    vbonds = dict.fromkeys(d.verifier_accounts, DEMO_BOND)
    for i, (miner, verdict) in enumerate((("miner-a", "honest"), ("miner-b", "fraud"))):
        rid, cid = bytes([i + 1]) * 32, bytes([i + 9]) * 32
        d.on_event(P.RunRegistered(1, rid, miner, b"s" * 32, "value", 10, "", b"i" * 32, b"h" * 32, b"d" * 32, 1000))
        d.on_event(P.CheckpointRootUpdated(3, rid, b"o" * 32, 11, True, 5))
        d.on_event(P.ChallengeIssued(5 + i, cid, rid, 0, 7, b"o" * 32, 11, "value", "", 65, 185, 245, 1, None,
                                     committee))
        d.on_event(P.ChallengeResolved(250, cid, rid, 7, verdict, "", "value", b"w" * 32, 4, 4,
                                       ((b"w" * 32, 4), (b"x" * 32, 1), (b"y" * 32, 1)), ("v3", "v4")))
        for v in ("v3", "v4") if lazy_penalised else ("v3",):
            d.on_event(VerifierPenalized(250, cid, v, 50, "outlier"))
            vbonds[v] -= 50
        for v in ("v1", "v2") if honest_paid else ():
            fees = [(2 * 12, "seat_fee")] + ([(125, "slash_share")] if verdict == "fraud" else [])
            for amount, why in fees:
                d.on_event(VerifierPaid(250, cid, v, amount, why))
                vbonds[v] += amount
    d.view = SimpleNamespace(state=ProtocolState(params=d.params, vbonds=vbonds))
    return d


def test_the_summary_shows_the_lazy_verifier_penalised_and_every_bond(tmp_path):
    summary = _history(tmp_path, lazy_penalised=True).summary()
    assert summary["ok"] is True and all(summary["checks"].values()), summary["checks"]
    verifiers = {v["name"]: v for v in summary["verifiers"]}
    assert verifiers["v4"]["fault"] == "lazy" and verifiers["v4"]["outlier_count"] == 2
    assert [p["why"] for p in verifiers["v4"]["penalties"]] == ["outlier", "outlier"]
    assert (verifiers["v4"]["bond_before"], verifiers["v4"]["bond_after"]) == (DEMO_BOND, DEMO_BOND - 100)
    assert (verifiers["v4"]["paid"], verifiers["v4"]["payments"], verifiers["v4"]["seats"]) == (0, [], 2)
    # The honest verifiers: unpenalised, paid a seat fee for each of their seats and a share of the slash.
    v1 = verifiers["v1"]
    assert (v1["bond_before"], v1["penalised"], v1["seats"]) == (DEMO_BOND, 0, 4)
    assert v1["paid"] == 2 * 24 + 125 and v1["paid_by_why"] == {"seat_fee": 48, "slash_share": 125}
    assert v1["bond_after"] == DEMO_BOND + v1["paid"]
    assert [(p["amount"], p["why"]) for p in v1["payments"]] == [(24, "seat_fee"), (24, "seat_fee"), (125, "slash_share")]
    (c, *_) = summary["challenges"]
    assert c["committee"] == ["v1", "v2", "v3", "v4"] and c["seats"] == {"v1": 2, "v2": 2, "v3": 1, "v4": 1}
    assert c["outliers"] == ["v3", "v4"]
    assert {p["verifier"] for p in c["penalties"]} == {"v3", "v4"}
    assert {p["verifier"] for p in c["payments"]} == {"v1", "v2"}
    # The summary's verifier table: fees paid and penalties taken, per verifier.
    table = render(summary).split("  verifiers:\n")[1].splitlines()
    assert "fees paid" in table[0] and "penalised" in table[0]
    row = {line.split()[0]: line.split() for line in table[1:5]}
    assert row["v1"][-6:] == ["4", str(v1["paid"]), "0", str(DEMO_BOND), "->", str(DEMO_BOND + v1["paid"])]
    assert row["v4"][-6:] == ["2", "0", "100", str(DEMO_BOND), "->", str(DEMO_BOND - 100)]
    # An unpenalised lazy verifier fails the demo's check; so does an honest verifier left unpaid.
    checks = _history(tmp_path, lazy_penalised=False).summary()["checks"]
    assert checks["lazy_verifier_penalised"] is False and checks["lazy_verifier_outside_cluster"] is True
    checks = _history(tmp_path, lazy_penalised=True, honest_paid=False).summary()["checks"]
    assert checks["honest_verifiers_paid"] is False and checks["bonds_add_up"] is True


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
