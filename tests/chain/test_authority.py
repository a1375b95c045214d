"""Who configures a network: a dev chain names its creator in its file, so a stranger's first
configure_network record never takes the network; a Substrate node refuses to start unpinned."""

from __future__ import annotations

import pytest

import chain.protocol as P
from chain.calls import ConfigureNetwork
from chain.dev import DevTransport
from chain.network import NetworkParamsError, network_authority, read_network, seeded_state, start_params
from chain.protocol.params import ProtocolParams
from chain.transport import TransportError
from chain.view import ChainView

BASE = ProtocolParams(challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2)
STRANGER = ProtocolParams(challenge_delay=9, opening_deadline=9, commit_window=9, reveal_window=9)


def _record(params: ProtocolParams, effective: int) -> ConfigureNetwork:
    return ConfigureNetwork(params=params.to_cbor(), effective_block=effective)


def test_a_dev_chain_records_its_creator_as_the_authority(tmp_path):
    db = tmp_path / "c.db"
    DevTransport(db, "founder").close()
    assert (
        DevTransport(db, "someone-else").network_authority() == "founder"
    )  # opening it later changes nothing
    with pytest.raises(TransportError, match="dev account names"):
        DevTransport(tmp_path / "d.db", "bad name!")


def test_a_strangers_first_record_does_not_take_a_dev_network(tmp_path):
    """mallory sends the chain's first configure_network record: every follower (a fresh view, the
    network record a node reads at start) refuses it as NotAuthority, and the creator's own record
    then configures the network."""
    db = tmp_path / "c.db"
    founder = DevTransport(db, "founder")
    founder.record_params(BASE)
    DevTransport(db, "mallory").submit([_record(STRANGER, 3)])  # block 1
    founder.submit([_record(BASE, 5)])  # block 2
    founder.seal(), founder.seal(), founder.seal()  # blocks 3..5

    view = ChainView(DevTransport(db, "observer"), BASE)
    events = view.sync()
    (refused,) = [e for e in events if isinstance(e, P.CallRefused)]
    assert (refused.block, refused.origin, refused.refusal) == (1, "mallory", "NotAuthority")
    (configured,) = [e for e in events if isinstance(e, P.NetworkConfigured)]
    assert (configured.block, configured.authority) == (2, "founder")
    assert view.state.authority == "founder" and view.state.params == BASE

    rec = read_network(DevTransport(db, "node"), 5)
    assert (
        rec.authority == "founder" and rec.current == BASE and [r.origin for r in rec.refused] == ["mallory"]
    )
    state = seeded_state(rec, start_params(rec, None, pin_name="[protocol]"))
    assert state.authority == "founder"


def test_a_pinned_authority_must_agree_with_the_dev_chains(tmp_path):
    db = tmp_path / "c.db"
    t = DevTransport(db, "founder")
    assert network_authority(t, None) == network_authority(t, "founder") == "founder"
    with pytest.raises(
        NetworkParamsError, match="the pinned authority mallory is not the network's: the chain names founder"
    ):
        read_network(t, 0, authority="mallory")


def test_a_dev_chain_file_without_a_recorded_authority_keeps_the_first_record_rule(tmp_path):
    """A file made before dev chains recorded their creator: no authority is named, so its first
    accepted record names it (as it did when the file was made)."""
    db = tmp_path / "c.db"
    t = DevTransport(db, "founder")
    with t.chain._write() as conn:
        conn.execute("DELETE FROM meta WHERE key = 'authority'")
    assert t.network_authority() is None
    DevTransport(db, "old-authority").submit([_record(BASE, 3)])
    assert read_network(t, 1).authority == "old-authority"


def test_pot_chain_dev_names_the_authority_of_a_new_file_and_checks_an_existing_one(tmp_path):
    from typer.testing import CliRunner

    from chain.cli import app

    db = tmp_path / "c.db"
    r = CliRunner().invoke(app, ["dev", "--db", str(db), "--authority", "ops"])
    assert r.exit_code == 0, r.output
    assert DevTransport(db, "x").network_authority() == "ops"
    r = CliRunner().invoke(app, ["dev", "--db", str(db), "--authority", "mallory"])
    assert r.exit_code == 2 and "the chain's authority is ops, not mallory" in r.output
    r = CliRunner().invoke(app, ["dev", "--db", str(tmp_path / "d.db")])
    assert r.exit_code == 0 and DevTransport(tmp_path / "d.db", "x").network_authority() == "alice"
    r = CliRunner().invoke(app, ["dev", "--db", str(db), "--inspect", "--json"])
    assert r.exit_code == 0 and '"authority": "ops"' in r.stdout


def test_a_substrate_node_refuses_to_start_without_an_authority(tmp_path):
    from node.config import ConfigError, check_authority, load_config, load_secrets
    from node.daemon import StartupError, VerifierNode

    ws = load_config(None, env={"POT_CHAIN_URL": "ws://127.0.0.1:9", "POT_NODE_DATA_DIR": str(tmp_path)})
    with pytest.raises(
        ConfigError,
        match=r"(?s)chain.authority \(POT_CHAIN_AUTHORITY\) is not set: on a Substrate "
        r"chain .*\[chain\]\n  authority = \"5Grw",
    ):
        check_authority(ws)
    check_authority(
        load_config(None, env={"POT_CHAIN_URL": "ws://127.0.0.1:9", "POT_CHAIN_AUTHORITY": "5Grw"})
    )
    check_authority(load_config(None, env={"POT_CHAIN_URL": "dev:///c.db"}))  # the chain names its own
    # the daemon refuses before it connects (nothing listens on port 9)
    node = VerifierNode(ws, load_secrets(None, env={"POT_KEY_URI": "//Alice"}), engine=None)  # type: ignore[arg-type]
    with pytest.raises(StartupError, match="chain.authority"):
        node.start()
