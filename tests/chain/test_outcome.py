"""chain.outcome: a submission's outcome read from the chain's derived state (each call accepted
with its effect, or refused with the recorded code and reason); `pot chain configure` reports it,
and `pot chain events`/`configure` never create a dev chain."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from chain.calls import BondVerifier, ConfigureNetwork, UnbondVerifier
from chain.cli import app
from chain.dev import DevTransport
from chain.outcome import OutcomeError, follower_view, submit_and_read
from chain.protocol import ProtocolParams, ProtocolState
from chain.protocol.params import MAX_SCHEDULED_CHANGES
from chain.transport import Receipt
from chain.view import ChainView
from devnet.toml import to_toml

PARAMS = ProtocolParams(unbonding_delay=10)


@pytest.fixture
def chain(tmp_path):
    t = DevTransport(tmp_path / "c.db", "v1", sealing="instant")
    t.record_params(PARAMS)
    yield t
    t.close()


def test_each_call_of_a_transaction_gets_its_own_outcome(chain):
    view = follower_view(chain)
    out = submit_and_read(
        chain,
        [BondVerifier(130), UnbondVerifier(30), UnbondVerifier(500), UnbondVerifier(50)],
        view,
        timeout=10,
    )
    assert out.block == 1 and not out.ok
    bond, unbond, over, dust = out.calls
    assert bond.ok and bond.events[0].code == "VerifierBonded" and bond.events[0].bond == 130
    assert unbond.ok and (unbond.events[0].amount, unbond.events[0].release_block) == (30, 11)
    assert not over.ok and over.refusal.refusal == "AmountOverBond" and over.refusal.block == 1
    assert not dust.ok and dust.refusal.refusal == "BondBelowMinimum"  # 50 would be left: less than one seat
    assert [r.refusal for r in out.refusals] == ["AmountOverBond", "BondBelowMinimum"]
    assert out.words().splitlines() == [
        "bond_verifier accepted in block 1: v1 bonded 130; its active bond is now 130",
        "unbond_verifier accepted in block 1: 30 unbonding, released at block 11; the active bond of v1 is "
        "now 100",
        "unbond_verifier refused in block 1: AmountOverBond: 'v1' has an active bond of 100; it cannot "
        "unbond 500",
        "unbond_verifier refused in block 1: BondBelowMinimum: unbonding 50 would leave 50, below "
        "verifier_stake "
        "(100): unbond all of it, or at most 0",
    ]
    assert view.cursor == 1 and {e.code for e in out.synced} >= {"VerifierBonded", "CallRefused"}


def test_another_accounts_refusal_in_the_same_block_is_not_ours(tmp_path):
    path = tmp_path / "c.db"
    sealer = DevTransport(path, "v2", sealing="interval")
    sealer.record_params(PARAMS)
    ours = DevTransport(path, "v1")
    ours.submit([BondVerifier(110)], wait=False)
    sealer.seal()  # block 1

    def submit(calls, timeout):
        sealer.submit([UnbondVerifier(5)], wait=False)  # v2 has no bond: refused, in the same block
        receipt = ours.submit(calls, wait=False)
        sealer.seal()
        n, h = ours.chain.tx_block(receipt.tx_hash)
        return Receipt(receipt.tx_hash, n, h)

    out = submit_and_read(ours, [UnbondVerifier(4)], ChainView(ours, PARAMS), timeout=10, submit=submit)
    assert out.ok and out.block == 2 and out.calls[0].events[0].bond == 106
    assert [(e.origin, e.refusal) for e in out.synced if e.code == "CallRefused"] == [("v2", "NotBonded")]


@pytest.mark.parametrize("keep_events", [False, True])
def test_a_view_moved_past_the_block_reads_it_only_from_kept_events(chain, keep_events):
    view = ChainView(chain, PARAMS, keep_events=keep_events)

    def submit(calls, timeout):
        receipt = chain.submit(calls)
        view.sync()  # another reader of the same view applied the block first
        return receipt

    if not keep_events:
        with pytest.raises(OutcomeError, match="has applied block 1 of the transaction already"):
            submit_and_read(chain, [UnbondVerifier(1)], view, timeout=5, submit=submit)
        return
    out = submit_and_read(chain, [UnbondVerifier(1)], view, timeout=5, submit=submit)
    assert out.calls[0].refusal.refusal == "NotBonded" and out.synced == ()


def test_submit_and_read_refuses_bad_arguments(chain):
    view = follower_view(chain)
    with pytest.raises(ValueError, match="at least one call"):
        submit_and_read(chain, [], view)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        submit_and_read(chain, [BondVerifier(1)], view, timeout=0)


def test_configure_reports_a_refused_record_and_exits_1(tmp_path, chain):
    auth = DevTransport(chain.chain.path, "v1")  # the chain's creator, its authority
    for i in range(MAX_SCHEDULED_CHANGES):
        auth.submit([ConfigureNetwork(params=PARAMS.to_cbor(), effective_block=100 + i)])
    (tmp_path / "p.toml").write_text(to_toml({"protocol": PARAMS.to_dict()}))
    r = CliRunner().invoke(app, ["configure", "--chain", f"dev://{chain.chain.path}", "--account", "v1",
                                 "--params", str(tmp_path / "p.toml"), "--effective", "500", "--json"])
    assert r.exit_code == 1, r.output
    got = json.loads(r.stdout)
    assert (got["ok"], got["refusal"], got["block"]) == (False, "TooMany", MAX_SCHEDULED_CHANGES + 1)
    assert f"error: configure_network refused in block {MAX_SCHEDULED_CHANGES + 1}: TooMany" in r.stderr

    fresh = tmp_path / "fresh.db"
    DevTransport(fresh, "authority").close()
    r = CliRunner().invoke(app, ["configure", "--chain", f"dev://{fresh}", "--account", "authority",
                                 "--params", str(tmp_path / "p.toml"), "--effective", "5"])
    assert r.exit_code == 0, r.output
    assert (
        "configure_network by authority in block 1: parameters" in r.stdout
        and "effect at block 5" in r.stdout
    )


@pytest.mark.parametrize("command", [["events"], ["configure", "--params", "p.toml"]])
def test_chain_commands_refuse_a_missing_dev_chain(tmp_path, command):
    (tmp_path / "p.toml").write_text(to_toml({"protocol": PARAMS.to_dict()}))
    missing = tmp_path / "none" / "c.db"
    args = [a if a != "p.toml" else str(tmp_path / a) for a in command]
    r = CliRunner().invoke(app, [*args, "--chain", f"dev://{missing}"])
    assert r.exit_code == 2 and f"no dev chain at {missing}" in r.stderr, r.output
    assert f"`pot chain dev --db {missing} --interval 1`" in r.stderr
    assert not missing.parent.exists()


def test_state_seeded_views_read_outcomes_too(chain):
    chain.submit([BondVerifier(100)])  # block 1: before the view's start, so not in its state
    view = ChainView(chain, PARAMS, cursor=1, state=ProtocolState(params=PARAMS), keep_events=False)
    out = submit_and_read(chain, [UnbondVerifier(10)], view, timeout=5)
    assert out.calls[0].refusal.refusal == "NotBonded"
