"""`pot node unbond` reports what the chain made of its call (the release block, or the refusal in
words with a non-zero exit), and the node's commands never create a dev chain of their own."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from chain.calls import BondVerifier
from chain.dev import DevTransport
from chain.protocol import ProtocolParams
from node.commands import node_app

PARAMS = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=4, challenge_delay=2,
                        challenges_per_run=1, unbonding_delay=10)


def _config(tmp_path, chain_db) -> str:
    d = tmp_path / "n"
    d.mkdir(exist_ok=True)
    cfg = d / "n.toml"
    cfg.write_text(f'[node]\ndata_dir = "{d}/data"\n[chain]\nurl = "dev://{chain_db}"\naccount = "v1"\n')
    return str(cfg)


@pytest.fixture
def bonded(tmp_path):
    """An instant dev chain with parameters recorded, on which v1 bonded 140 (an unbond must leave
    0 or at least verifier_stake, 100)."""
    path = tmp_path / "c.db"
    t = DevTransport(path, "v1", sealing="instant")
    t.record_params(PARAMS)
    t.submit([BondVerifier(140)])
    t.close()
    return path


def test_unbond_over_the_bond_is_reported_as_refused_and_exits_1(tmp_path, bonded):
    cfg = _config(tmp_path, bonded)
    r = CliRunner().invoke(node_app, ["unbond", "--config", cfg, "--amount", "1000", "--timeout", "20"])
    assert r.exit_code == 1, r.output
    got = json.loads(r.stdout)
    assert (got["ok"], got["refusal"], got["block"]) == (False, "AmountOverBond", 2)
    assert "active bond of 140; it cannot unbond 1000" in got["reason"]
    assert "error: unbond_verifier refused in block 2: AmountOverBond" in r.stderr

    r = CliRunner().invoke(node_app, ["unbond", "--config", cfg, "--amount", "40", "--timeout", "20"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert (got["ok"], got["block"], got["release_block"], got["bond"]) == (True, 3, 3 + 10, 100)
    assert got["outcome"] == ("unbond_verifier accepted in block 3: 40 unbonding, released at block 13; "
                              "the active bond of v1 is now 100")


def test_unbond_with_no_bond_at_all_is_not_bonded(tmp_path):
    path = tmp_path / "c.db"
    DevTransport(path, "miner", sealing="instant").record_params(PARAMS)
    r = CliRunner().invoke(node_app, ["unbond", "--config", _config(tmp_path, path), "--amount", "1"])
    assert r.exit_code == 1 and json.loads(r.stdout)["refusal"] == "NotBonded", r.output
    assert "'v1' has no active bond" in r.stderr


@pytest.mark.parametrize("command", [["run"], ["unbond", "--amount", "1"]])
def test_node_commands_refuse_a_missing_dev_chain_and_create_none(tmp_path, command):
    chain_db = tmp_path / "nowhere" / "chain.db"
    cfg = _config(tmp_path, chain_db)
    r = CliRunner().invoke(node_app, [*command, "--config", cfg])
    assert r.exit_code == 2, r.output
    assert (
        f"no dev chain at {chain_db}" in r.stderr
        and f"`pot chain dev --db {chain_db} --interval 1`" in r.stderr
    )
    assert not chain_db.exists() and not chain_db.parent.exists()
