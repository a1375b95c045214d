"""The network's one rulebook: configure_network records as chain state, the check every
participant makes at start, and refusals a third-party client can act on (the field named)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chain import protocol as P
from chain.calls import BondVerifier, ConfigureNetwork, encode_call
from chain.dev import DevTransport
from chain.network import NetworkParamsError, check_pinned, read_network, resolve_params
from chain.protocol import ProtocolParams, ProtocolState
from chain.view import ChainView
from commitments import cbor
from devnet.toml import to_toml
from tests.chain.chopsticks_env import chopsticks  # noqa: F401 - the fixture is used by name
from tests.chain.runs import SyntheticRun

REPO = Path(__file__).resolve().parents[2]
BASE = ProtocolParams(challenge_delay=1, opening_deadline=2, commit_window=2, reveal_window=2)
OTHER = ProtocolParams(challenge_delay=3, opening_deadline=2, commit_window=5, reveal_window=2)


class _Block:
    def __init__(self, number: int) -> None:
        self.number, self.hash = number, bytes([number % 256]) * 32


def _configure(params: ProtocolParams, effective: int) -> ConfigureNetwork:
    return ConfigureNetwork(params=params.to_cbor(), effective_block=effective)


def _step(state: ProtocolState, n: int, *calls: tuple[str, object]) -> list[P.Event]:
    events = P.on_block(state, _Block(n))
    for origin, call in calls:
        events += P.apply_recorded(state, call, origin, n)
    return events


# --- the rules ----------------------------------------------------------------------------------


def test_the_first_record_names_the_authority_and_takes_effect_at_its_block():
    state = P.new_state(BASE)
    (ev,) = _step(state, 1, ("alice", _configure(OTHER, 3)))
    assert isinstance(ev, P.NetworkConfigured) and ev.authority == "alice" and ev.effective_block == 3
    assert ev.params_digest == OTHER.digest() and ev.params == OTHER.to_dict()
    assert state.authority == "alice" and state.params == BASE  # not before its block
    assert _step(state, 2) == [] and state.params == BASE
    (eff,) = _step(state, 3)
    assert isinstance(eff, P.ParamsEffective) and eff.configured_at == 1 and state.params == OTHER
    # The snapshot keeps the record, so a restarted follower goes on under the same rulebook.
    again = ProtocolState.from_cbor(state.to_cbor())
    assert (again.authority, again.configured_at, again.params) == ("alice", 1, OTHER)
    # A snapshot whose record is not what a node writes is refused, not followed.
    bad = cbor.decode(state.to_cbor())
    for field, value in (("authority", 7), ("schedule", [[None, 1, BASE.to_dict()]]),
                         ("schedule", [[9, 1, {"commit_window": 0}]])):
        with pytest.raises(P.SnapshotError):
            ProtocolState.from_cbor(cbor.encode({**bad, field: value}))


def test_records_from_another_account_or_for_a_past_block_are_refused():
    state = P.new_state(BASE)
    _step(state, 1, ("alice", _configure(OTHER, 5)))
    refused = _step(state, 2, ("mallory", _configure(BASE, 9)), ("alice", _configure(BASE, 2)))
    assert [(e.origin, e.refusal) for e in refused] == [
        ("mallory", "NotAuthority"),
        ("alice", "RetroactiveChange"),
    ]
    assert "not 'mallory'" in refused[0].reason and "effective_block is 2" in refused[1].reason
    assert state.schedule == [[5, 1, OTHER.to_dict()]]
    # A follower that pins the authority refuses a first record from anyone else.
    pinned = ProtocolState(params=BASE, authority="alice")
    (ev,) = _step(pinned, 1, ("mallory", _configure(OTHER, 3)))
    assert ev.refusal == "NotAuthority" and pinned.schedule == []


def test_a_record_must_carry_the_canonical_parameters():
    state = P.new_state(BASE)
    loose = cbor.encode({"commit_window": 9})  # a partial record: every participant must read the same set
    (ev,) = _step(state, 1, ("alice", ConfigureNetwork(params=loose, effective_block=4)))
    assert ev.refusal == "InvalidCall" and "lack" in ev.reason and "challenge_delay" in ev.reason
    d = BASE.to_dict()
    d["quorum_share"] = [2, 4]  # the same share, not in lowest terms
    (ev,) = _step(state, 2, ("alice", ConfigureNetwork(params=cbor.encode(d), effective_block=4)))
    assert ev.refusal == "InvalidCall" and "canonical form" in ev.reason
    assert state.authority is None  # nothing accepted: the next record still names the authority


def test_a_change_applies_from_its_block_and_never_to_what_came_before():
    """A challenge issued before the change keeps its deadlines; a run completed after it gets
    the new challenge delay."""
    state = P.new_state(BASE)
    early, late = (
        SyntheticRun(steps=4, seed="early", miner="m1"),
        SyntheticRun(steps=4, seed="late", miner="m2"),
    )
    seats = [
        (f"v{i}", BondVerifier(BASE.verifier_stake)) for i in range(BASE.committee_size)
    ]  # a committee's seats
    _step(state, 1, ("alice", _configure(BASE, 2)), ("m1", early.register()), ("m2", late.register()), *seats)
    _step(state, 2, ("m1", early.submit_full_root()))  # challenges at 2 + 1
    issued = [e for e in _step(state, 3, ("alice", _configure(OTHER, 5))) if isinstance(e, P.ChallengeIssued)]
    assert len(issued) == 1 and issued[0].commit_deadline == 3 + 2 + 2  # under BASE
    _step(state, 4)
    _step(state, 5, ("m2", late.submit_full_root()))
    assert state.params == OTHER and state.runs[late.run_id].challenges_at == 5 + OTHER.challenge_delay
    ch = state.challenges[issued[0].challenge_id]
    assert (ch.opening_deadline, ch.commit_deadline) == (5, 7)  # unchanged by the record


def test_a_non_canonical_spec_is_refused_naming_the_field():
    """Another encoder wrote the float grad_clip = 1.0 as the integer 1: the refusal says so."""
    run = SyntheticRun(miner="m")
    spec = cbor.decode(run.spec.to_cbor())
    spec["optimizer"]["grad_clip"] = 1
    state = P.new_state(BASE)
    (ev,) = _step(state, 1, ("m", run.register(spec=cbor.encode(spec))))
    assert ev.refusal == "InvalidCall"
    assert "optimizer.grad_clip: a float must be encoded as a float (f93c00), got the integer 1" in ev.reason
    # A float in a wider form than its shortest is named the same way.
    wide = run.spec.to_cbor().replace(bytes.fromhex("f93c00"), bytes.fromhex("fb3ff0000000000000"), 1)
    (ev,) = _step(state, 2, ("m", run.register(spec=wide)))
    assert (
        ev.refusal == "InvalidCall"
        and "optimizer.grad_clip: a float must be in its shortest exact width" in ev.reason
    )


# --- reading the record, and the check at start ------------------------------------------------------


def test_read_network_and_the_pin_check(tmp_path):
    t = DevTransport(tmp_path / "c.db", "alice")
    with pytest.raises(NetworkParamsError, match="records no protocol parameters .* none are pinned"):
        resolve_params(t, None, upto=t.finalized_head(), pin_name="--params")
    assert resolve_params(t, BASE, upto=0)[0] == BASE  # a chain with no record follows the pin
    t.submit([_configure(BASE, 3)])  # block 1
    t.seal()
    rec = read_network(t, 1)
    assert rec.current == BASE and rec.authority == "alice" and "block 1 by alice" in rec.source()
    with pytest.raises(NetworkParamsError) as exc:
        check_pinned(rec, OTHER, pin_name="this node's [protocol] section")
    msg = str(exc.value)
    assert msg.startswith(
        "this node's [protocol] section disagrees with the protocol parameters the chain records"
    )
    assert "commit_window: 5 != 2 (pinned != chain)" in msg and "challenge_delay: 3 != 1" in msg
    assert "opening_deadline" not in msg  # only what differs
    # Mallory's record is refused: the network stays alice's.
    DevTransport(tmp_path / "c.db", "mallory").submit([_configure(OTHER, 9)])
    rec = read_network(t, t.finalized_head())
    assert rec.current == BASE and [e.refusal for e in rec.refused] == ["NotAuthority"]


def test_reading_the_record_then_replaying_reads_each_block_once(tmp_path):
    from chain.network import BlockMemo

    t = DevTransport(tmp_path / "c.db", "alice")
    t.submit([_configure(BASE, 3)])
    for _ in range(3):
        t.seal()
    reads: list[int] = []
    real = t.block
    t.block = lambda n: reads.append(n) or real(n)  # type: ignore[method-assign]
    memo = BlockMemo(t)
    rec = read_network(memo, memo.until)
    view = ChainView(memo, rec.initial)
    view.sync()
    assert reads == [1, 2, 3, 4] and view.params == BASE
    t.seal()  # a block after the memo's head passes through, unkept
    view.sync()
    assert reads == [1, 2, 3, 4, 5] and memo._blocks == {}


# --- real processes on the dev chain ------------------------------------------------------------------


def _pot(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pot", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _hostile_payloads(run: SyntheticRun) -> dict[str, bytes]:
    good = encode_call(run.register())
    fields = run.register().to_wire()
    fields["spec"] = cbor.decode(fields["spec"])  # the spec as a nested map, not its bytes
    return {
        "bad_prefix": good[1:],  # "pot1" with its first byte eaten as a SCALE length
        "truncated": b"po",
        "bad_fields": b"pot1" + cbor.encode(["start_training_commitment", fields]),
    }


def test_dev_chain_processes_configure_check_and_show_every_refusal(tmp_path):
    """`pot chain configure` records the network; `pot chain events` follows it with no flags,
    refuses a pin that disagrees (naming the field), and shows each malformed call once with its
    code, and the non-canonical spec's refusal with the field named."""
    db = tmp_path / "c.db"
    url = f"dev://{db}"
    (tmp_path / "base.toml").write_text(to_toml({"protocol": BASE.to_dict()}))
    (tmp_path / "other.toml").write_text(to_toml({"protocol": OTHER.to_dict()}))
    DevTransport(
        db, "authority"
    ).close()  # `pot chain dev --db --authority authority`: its creator configures it
    r = _pot("chain", "configure", "--chain", url, "--account", "authority", "--params",
             str(tmp_path / "base.toml"), "--effective", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["block"] == 1 and json.loads(r.stdout)["authority"] == "authority"

    run = SyntheticRun(seed="third-party", miner="client")
    miner = DevTransport(db, "client")
    hostile = _hostile_payloads(run)
    miner.submit_payloads(list(hostile.values()), wait=True)  # block 2
    spec = cbor.decode(run.spec.to_cbor())
    spec["optimizer"]["grad_clip"] = 1
    miner.submit([run.register(spec=cbor.encode(spec))])  # block 3

    r = _pot("chain", "events", "--chain", url, "--params", str(tmp_path / "other.toml"))
    assert (
        r.returncode == 2 and "--params disagrees with the protocol parameters the chain records" in r.stderr
    )
    assert "commit_window: 5 != 2 (pinned != chain)" in r.stderr and r.stdout == ""

    r = _pot("chain", "events", "--chain", url, "--json")
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in r.stdout.splitlines()]
    assert [e["event"] for e in events if e["block"] <= 2][:2] == ["NetworkConfigured", "ParamsEffective"]
    ignored = [e for e in events if e["event"] == "RemarkIgnored"]
    assert [(e["block"], e["position"], e["reason"]) for e in ignored] == [
        (2, 0, "bad_prefix"), (2, 1, "truncated"), (2, 2, "bad_fields")]
    assert "SCALE length" in ignored[0]["detail"] and "spec must be bytes" in ignored[2]["detail"]
    (refused,) = [e for e in events if e["event"] == "CallRefused"]
    assert refused["block"] == 3 and refused["origin"] == "client" and refused["refusal"] == "InvalidCall"
    assert (
        "optimizer.grad_clip: a float must be encoded as a float (f93c00), got the integer 1"
        in refused["reason"]
    )
    # The same history, derived in this process from the chain alone.
    view = ChainView(DevTransport(db, "observer"), BASE)
    view.sync()
    assert [e.to_dict() for e in view.events] == events


def test_a_node_whose_parameters_disagree_with_the_chain_refuses_to_start(tmp_path):
    """Two nodes of one chain: the one whose [protocol] section differs refuses and says why; the
    one without a section follows the chain's parameters."""
    db = tmp_path / "c.db"
    DevTransport(db, "authority").submit([_configure(BASE, 2)])
    DevTransport(db, "authority").seal()

    def config(name: str, protocol: ProtocolParams | None) -> Path:
        doc = {"node": {"data_dir": str(tmp_path / name)}, "chain": {"url": f"dev://{db}", "account": name}}
        if protocol is not None:
            doc["protocol"] = protocol.to_dict()
        path = tmp_path / f"{name}.toml"
        path.write_text(to_toml(doc))
        return path

    r = _pot("node", "run", "--init", "--config", str(config("v2", OTHER)), timeout=90)
    assert r.returncode == 2, r.stderr[-2000:]
    assert (
        "this node's [protocol] section disagrees with the protocol parameters the chain records" in r.stderr
    )
    assert "configure_network record of block 1 by authority" in r.stderr
    assert "challenge_delay: 3 != 1 (pinned != chain)" in r.stderr

    from node.config import load_config, load_secrets
    from node.daemon import VerifierNode
    from node.db import open_database

    cfg = load_config(config("v1", None), env={})
    engine = open_database(cfg.database_url, init=True)
    node = VerifierNode(cfg, load_secrets(None, env={}), engine)
    try:
        node.start()
        assert node.view is not None and node.view.params == BASE and node.view.cursor == 0
        node.view.sync()  # the record itself, in its block
        assert node.view.state.authority == "authority" and node.view.state.configured_at == 1
    finally:
        if node.transport is not None:
            node.transport.close()
        engine.dispose()


def test_the_miner_sdk_refuses_to_train_under_other_parameters(tmp_path):
    """The trainer reads the chain's record before it registers: a pin that disagrees stops it
    before any call is sent or step trained."""
    from commitments.dataset import Dataset
    from miner.trainer import Trainer, TrainerError
    from tests.miner.helpers import corpus, tiny_spec

    db = tmp_path / "c.db"
    DevTransport(db, "authority").submit([_configure(BASE, 2)])
    spec = tiny_spec(steps=2)
    ds = Dataset.open(corpus(tmp_path), spec.sample_len, vocab_size=spec.model.vocab_size)
    with Trainer(spec, ds, tmp_path / "run", DevTransport(db, "m"), params=OTHER, progress=False) as t:
        with pytest.raises(TrainerError, match=r"the miner's parameters \(--params\) disagrees .* "
                                               r"commit_window: 5 != 2 \(pinned != chain\)"):
            t.run(follow=False)
    assert DevTransport(db, "observer").finalized_head() == 1  # nothing sent after the record
    with Trainer(spec, ds, tmp_path / "run2", DevTransport(db, "m2"), progress=False) as t:
        t.prepare()
        t.register()  # no pin: the chain's parameters
        assert t.view.params == BASE and t.run_id in t.view.state.runs


def test_the_node_api_lists_the_refusals_of_its_runs_and_of_any_account(tmp_path):
    """Remarks from a miner of one of the node's runs, and from a client with no run at all, as the
    node's own daemon recorded them, through its HTTP API."""
    from fastapi.testclient import TestClient

    from node.api import create_app
    from node.config import load_config, load_secrets
    from node.daemon import VerifierNode
    from node.db import open_database

    db = tmp_path / "c.db"
    DevTransport(db, "authority").record_params(BASE)
    run = SyntheticRun(seed="the-node's", miner="m")
    miner = DevTransport(db, "m")
    miner.submit([run.register()])
    miner.submit([run.submit_root(3), run.submit_root(2)])  # the second shrinks the tree: refused
    client = DevTransport(db, "client")
    client.submit_payloads([_hostile_payloads(SyntheticRun(seed="client"))["bad_prefix"]])
    path = tmp_path / "v1.toml"
    path.write_text(
        to_toml(
            {"node": {"data_dir": str(tmp_path / "v1")}, "chain": {"url": f"dev://{db}", "account": "v1"}}
        )
    )
    cfg = load_config(path, env={})
    engine = open_database(cfg.database_url, init=True)
    node = VerifierNode(cfg, load_secrets(None, env={}), engine)
    try:
        node.start()
        node.ingest()
        with TestClient(create_app(engine, cfg, node=node), base_url="http://127.0.0.1:8700") as api:
            mine = api.get("/api/v1/refusals").json()
            theirs = api.get("/api/v1/refusals", params={"origin": "client"}).json()
    finally:
        if node.transport is not None:
            node.transport.close()
        engine.dispose()
    assert mine["accounts"] == ["m", "v1"]
    assert [(e["event"], e["refusal"]) for e in mine["items"]] == [("CallRefused", "RootNotAppendOnly")]
    (ignored,) = theirs["items"]
    assert (ignored["event"], ignored["reason"], ignored["origin"]) == (
        "RemarkIgnored",
        "bad_prefix",
        "client",
    )
    assert "SCALE length" in ignored["detail"]


# --- the same on a real Substrate runtime (chopsticks) ------------------------------------------------


@pytest.mark.chopsticks
@pytest.mark.slow
def test_chopsticks_configure_check_and_show_every_refusal(tmp_path, chopsticks):  # noqa: F811
    """On a Substrate chain: the parameters are recorded by a real `pot chain configure`; `pot
    chain events` follows them with no flags and refuses a disagreeing pin; a node whose
    [protocol] differs refuses to start; the polkadot.js byte-array pitfall, a cut prefix and a
    spec sent as a map show once each with their code; a non-canonical spec is refused naming
    the field."""
    from chain.substrate import connect_substrate
    from node.config import load_config, load_secrets
    from node.daemon import StartupError, VerifierNode
    from node.db import open_database
    from tests.chain.chopsticks_env import fresh_chain, unique_key

    fresh_chain(chopsticks)
    auth_key, client_key = unique_key("authority"), unique_key("client")
    client = connect_substrate(chopsticks.url, client_key, kind="remark")
    auth = connect_substrate(chopsticks.url, auth_key, kind="remark")
    chopsticks.fund([client.account, auth.account])
    (tmp_path / "base.toml").write_text(to_toml({"protocol": BASE.to_dict()}))
    (tmp_path / "other.toml").write_text(to_toml({"protocol": OTHER.to_dict()}))
    try:
        r = _pot("chain", "configure", "--chain", chopsticks.url, "--key", auth_key, "--params",
                 str(tmp_path / "base.toml"), "--json", timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout)
        assert out["authority"] == auth.account and out["block"] < out["effective_block"]
        chopsticks.new_blocks(out["effective_block"] - chopsticks.head()[0])  # Instant mode: blocks on demand

        run = SyntheticRun(seed="third-party-substrate", miner=client.account)
        hostile = _hostile_payloads(run)
        client.submit_remarks(list(hostile.values()))
        spec = cbor.decode(run.spec.to_cbor())
        spec["optimizer"]["grad_clip"] = 1
        client.submit([run.register(spec=cbor.encode(spec))])

        r = _pot("chain", "events", "--chain", chopsticks.url, "--params", str(tmp_path / "other.toml"),
                 timeout=120)
        assert (
            r.returncode == 2
            and "--params disagrees with the protocol parameters the chain records" in r.stderr
        )
        assert f"by {auth.account}" in r.stderr and "commit_window: 5 != 2 (pinned != chain)" in r.stderr

        r = _pot("chain", "events", "--chain", chopsticks.url, "--json", timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        events = [json.loads(x) for x in r.stdout.splitlines()]
        configured = [e for e in events if e["event"] == "NetworkConfigured"]
        assert [e["authority"] for e in configured] == [auth.account]
        assert any(e["event"] == "ParamsEffective" and e["block"] == out["effective_block"] for e in events)
        ignored = [e for e in events if e["event"] == "RemarkIgnored" and e["origin"] == client.account]
        assert [(e["position"], e["reason"]) for e in ignored] == [(0, "bad_prefix"), (1, "truncated"),
                                                                   (2, "bad_fields")]
        assert "SCALE length" in ignored[0]["detail"] and "spec must be bytes" in ignored[2]["detail"]
        (refused,) = [e for e in events if e["event"] == "CallRefused" and e["origin"] == client.account]
        assert "optimizer.grad_clip: a float must be encoded as a float (f93c00), got the integer 1" \
            in refused["reason"]

        # A node pinned to other parameters refuses to start, and says why.
        secrets = tmp_path / "secrets.toml"
        secrets.write_text(to_toml({"key": {"uri": unique_key("v1")}}))
        secrets.chmod(0o600)
        cfg_path = tmp_path / "v1.toml"
        cfg_path.write_text(to_toml({"node": {"data_dir": str(tmp_path / "v1"), "secrets_file": str(secrets)},
                                     "chain": {"url": chopsticks.url, "authority": auth.account},
                                     "protocol": OTHER.to_dict()}))
        cfg = load_config(cfg_path, env={})
        engine = open_database(cfg.database_url, init=True)
        node = VerifierNode(cfg, load_secrets(cfg.node.secrets_file, env={}), engine)
        try:
            with pytest.raises(
                StartupError, match=r"\[protocol\] section disagrees .* challenge_delay: 3 != 1"
            ):
                node.start()
        finally:
            if node.transport is not None:
                node.transport.close()
            engine.dispose()
    finally:
        client.close()
        auth.close()
        fresh_chain(chopsticks)  # leave no network record behind for the session's other tests
