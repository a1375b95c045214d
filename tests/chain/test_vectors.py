"""The protocol's conformance vectors (chain.protocol.vectors, files under vectors/protocol/).

(a) the files equal a fresh generation; (b) a replayer that reads only the JSON reproduces every
block's events and state digest; (c) every refusal code is reached by a case (or listed as
unreachable, with its reason); (d) every transport reproduces them: the hash-independent cases
marked for transports give the vector's events through the `network` fixture (on the dev chain
from the files' own payload bytes), and cases whose draws depend on block hashes give a follower
state equal to the rules applied to the blocks the transport actually produced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chain.calls import Call, decode_call, encode_call
from chain.protocol import (
    REFUSAL_TYPES,
    Event,
    ProtocolParams,
    ProtocolState,
    apply_recorded,
    new_state,
    on_block,
)
from chain.protocol import vectors as V
from chain.transport import Block
from chain.view import ChainView
from commitments.hashing import digest, h
from tests.chain.network import DevNetwork, Network

DIR = V.DEFAULT_DIR


def _load(name: str) -> dict[str, Any]:
    return json.loads((DIR / name).read_text("ascii"))


def _manifest() -> dict[str, Any]:
    return _load("manifest.json")


def _json(events: list[Event]) -> list[dict[str, Any]]:
    """Events as the files hold them (tuples become lists through JSON)."""
    return json.loads(json.dumps([e.to_dict() for e in events]))


# --- (a) drift ---------------------------------------------------------------------------------


def test_files_equal_a_fresh_generation():
    assert V.check(DIR) == [], "regenerate with `python -m chain.protocol.vectors write`"


def test_generation_is_byte_identical_and_the_folder_follows_the_protocol_version():
    assert V.generate_all() == V.generate_all()
    assert (
        DIR
        == Path(V.__file__).resolve().parents[2] / "vectors" / "protocol" / V.SNAPSHOT_VERSION.split("/")[-1]
    )


def test_check_reports_a_changed_a_missing_and_a_stray_file(tmp_path):
    V.write(tmp_path)
    assert V.check(tmp_path) == []
    first = sorted(tmp_path.glob("*.json"))[0]
    first.write_bytes(first.read_bytes() + b" ")
    (tmp_path / "manifest.json").unlink()
    (tmp_path / "stray.json").write_text("{}")
    problems = V.check(tmp_path)
    assert problems == [f"{first}: differs from a fresh generation", f"{tmp_path / 'manifest.json'}: missing",
                        f"{tmp_path / 'stray.json'}: no case generates it"]
    assert V.main(["check", str(tmp_path)]) == 1
    assert V.main(["write", str(tmp_path)]) == 0 and not (tmp_path / "stray.json").exists()
    assert V.main(["check", str(tmp_path)]) == 0
    assert V.main(["verify"]) == 2


# --- (b) a replayer that reads only the JSON ----------------------------------------------------


def _replay(vector: dict[str, Any]) -> None:
    """Replay one vector from its JSON alone: decode each call, run the rules, compare."""
    params = ProtocolParams.from_cbor(bytes.fromhex(vector["params_cbor"]))
    assert params.to_dict() == ProtocolParams.from_dict(vector["params"]).to_dict()
    state = new_state(params)
    for b in vector["blocks"]:
        calls = tuple((origin, decode_call(bytes.fromhex(wire))) for origin, wire in b["calls"])
        assert [bytes.fromhex(w) for _, w in b["calls"]] == [encode_call(c) for _, c in calls]
        block = Block(b["number"], bytes.fromhex(b["hash"]), calls)
        events = on_block(state, block)
        for origin, call in calls:
            events += apply_recorded(state, call, origin, block)
        where = f"{vector['case']} block {b['number']}"
        assert _json(events) == b["events"], where
        assert digest(vector["state_digest_domain"], state.to_cbor()).hex() == b["state_digest"], where
    assert state.to_cbor().hex() == vector["final_state"]
    assert ProtocolState.from_cbor(bytes.fromhex(vector["final_state"])).to_cbor() == state.to_cbor()


@pytest.mark.parametrize("name", sorted(V.CASES))
def test_a_replayer_of_the_json_reproduces_every_block(name):
    _replay(_load(f"{name}.json"))


def test_manifest_names_every_file_with_its_digest():
    manifest = _manifest()
    assert (
        manifest["protocol"] == V.SNAPSHOT_VERSION
        and manifest["state_digest_domain"] == V.STATE_DIGEST_DOMAIN
    )
    files = {p.name for p in DIR.glob("*.json")} - {"manifest.json"}
    assert {c["file"] for c in manifest["cases"].values()} == files
    for name, entry in manifest["cases"].items():
        data = (DIR / entry["file"]).read_bytes()
        assert h(data).hex() == entry["digest"], name
        vector = json.loads(data)
        assert vector["case"] == name and entry["final_state_digest"] == vector["blocks"][-1]["state_digest"]
        assert entry["hash_independent"] == vector["hash_independent"]


# --- (c) every refusal code is reached ------------------------------------------------------------


def test_every_refusal_code_is_reached_by_a_case_or_is_unreachable():
    reached: dict[str, set[str]] = {}
    for p in sorted(DIR.glob("*.json")):
        if p.name == "manifest.json":
            continue
        vector = json.loads(p.read_text("ascii"))
        codes = {e["refusal"] for b in vector["blocks"] for e in b["events"] if e["event"] == "CallRefused"}
        assert sorted(codes) == vector["refusals"], p.name
        for code in codes:
            reached.setdefault(code, set()).add(vector["case"])
    assert set(reached) <= set(REFUSAL_TYPES)
    unreached = set(REFUSAL_TYPES) - set(reached)
    assert unreached == set(V.UNREACHABLE), f"no case reaches {sorted(unreached - set(V.UNREACHABLE))}"
    assert {k: sorted(v) for k, v in reached.items()} == {
        k: v for k, v in _manifest()["refusals"].items() if v
    }


def test_generation_fails_when_a_refusal_code_has_no_case(monkeypatch):
    vectors = {name: V.generate(name) for name in ("roots", "registration")}
    missing = V.missing_refusals(vectors)
    assert "CommitmentMismatch" in missing and "UnknownRun" not in missing and "UnknownCall" not in missing
    monkeypatch.setitem(V.UNREACHABLE, "NoSuchCode", "a code refusals.py does not have")
    with pytest.raises(V.VectorError, match="NoSuchCode"):
        V.missing_refusals(vectors)


def test_hash_independence_is_measured_not_declared():
    # A case whose blocks draw a challenge has other events under other block hashes.
    assert not V.generate("fraud_slashes_the_miner")["hash_independent"]
    for name, c in V.CASES.items():
        if c.transport:
            assert _manifest()["cases"][name]["hash_independent"], f"{name} is marked for transports"


# --- (d) transports --------------------------------------------------------------------------------


class TransportBackend:
    """A scenario's blocks made on a network: one submission (or empty block) per block, the
    state derived by a ChainView from the finalized blocks, from an empty state."""

    def __init__(self, network: Network, params: ProtocolParams) -> None:
        self.net = network
        self.names = {network.account(n): n for n in V.ACCOUNTS}
        start = network.transport("miner").finalized_head()
        self.view = ChainView(network.transport("miner"), state=new_state(params), cursor=start)
        self.first = start + 1
        self.submitted: dict[int, list[tuple[str, bytes]]] = {}
        self.by_block: dict[int, list[Event]] = {}

    @property
    def state(self) -> ProtocolState:
        return self.view.state

    @property
    def head(self) -> int:
        return self.view.cursor

    @property
    def events(self) -> list[Event]:
        return self.view.events

    def block(self, calls: list[tuple[str, Call]]) -> list[Event]:
        origins = {o for o, _ in calls}
        if len(origins) > 1:
            raise V.VectorError("a transport makes one block per submission: a block of calls by several "
                                "accounts cannot be reproduced on it")
        before = self.head
        if calls:
            (origin,) = origins
            self.net.submit(self.names[origin], *(c for _, c in calls))
        else:
            self.net.advance(1)
        events = self.view.sync()
        assert self.head == before + 1, (
            f"the transport made blocks {before + 1}..{self.head} for one submission"
        )
        self.submitted[self.head] = [(o, encode_call(c)) for o, c in calls]
        self.by_block[self.head] = events
        return events


def _is_dev(network: Network) -> bool:
    return isinstance(network, DevNetwork)


def _shape(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e.get("refusal", "")) for e in events]


# The `network` fixture's transports, each chopsticks run marked slow as well (2-7 s a case there).
NETWORKS = pytest.mark.parametrize(
    "network",
    ["dev", pytest.param("chopsticks", marks=(pytest.mark.chopsticks, pytest.mark.slow))],
    indirect=True,
)
TRANSPORT_CASES = sorted(n for n, c in V.CASES.items() if c.transport)
# Cases whose challenges draw from block hashes, replayed live on each transport.
LIVE_CASES = ["fraud_slashes_the_miner", "missing_opening"]


@NETWORKS
@pytest.mark.parametrize("name", TRANSPORT_CASES)
def test_transport_reproduces_the_vector(network, name):
    vector = _load(f"{name}.json")
    params = ProtocolParams.from_cbor(bytes.fromhex(vector["params_cbor"]))
    if _is_dev(network):
        # The file's own bytes, sent by the accounts it names: block numbers are the chain's.
        view = ChainView(network.transport("miner"), state=new_state(params), cursor=network.start_block)
        assert network.transport("miner").finalized_head() == vector["blocks"][0]["number"] - 1
        for b in vector["blocks"]:
            origins = {o for o, _ in b["calls"]}
            assert len(origins) <= 1, f"{name} block {b['number']}: one account per block on a transport"
            if origins:
                network.transport(origins.pop()).submit_payloads([bytes.fromhex(w) for _, w in b["calls"]])
            else:
                network.advance(1)
            events = view.sync()
            assert view.cursor == b["number"]
            assert _json(events) == b["events"], f"{name} block {b['number']}"
            assert V.state_digest(view.state).hex() == b["state_digest"]
        assert view.state.to_cbor().hex() == vector["final_state"]
        return
    # Another chain's origins are its account ids, which run ids and commitments bind: the case is
    # built again with them, and its vector for those origins and block numbers made in memory.
    live = TransportBackend(network, params)
    accounts = {n: network.account(n) for n in V.ACCOUNTS}
    V.build(name, live, accounts)
    expected = V.PureBackend(params, name, start=live.first)
    V.build(name, expected, accounts)
    assert [b["number"] for b in expected.blocks] == sorted(live.by_block)
    for b in expected.blocks:
        assert _json(live.by_block[b["number"]]) == b["events"], f"{name} block {b['number']}"
        assert [[o, w.hex()] for o, w in live.submitted[b["number"]]] == b["calls"]
    assert V.state_digest(live.state).hex() == expected.blocks[-1]["state_digest"]
    # ...and it is the stored vector but for the origins and block numbers.
    assert [_shape(b["events"]) for b in expected.blocks] == [_shape(b["events"]) for b in vector["blocks"]]


@NETWORKS
@pytest.mark.parametrize("name", LIVE_CASES)
def test_transport_follower_equals_the_rules_on_its_blocks(network, name):
    assert not _manifest()["cases"][name]["hash_independent"]
    params = V.CASES[name].params
    live = TransportBackend(network, params)
    V.build(name, live, {n: network.account(n) for n in V.ACCOUNTS})
    transport = network.transport("miner")
    state = new_state(params)
    for n in range(live.first, live.head + 1):
        block = transport.block(n)
        events = on_block(state, block)
        block = transport.settle(
            block, state
        )  # paid calls count under the parameters in force, as a view does
        # The transport reproduces the calls, their origins and their order.
        assert [(o, encode_call(c)) for o, c in block.calls] == live.submitted[n], f"block {n}"
        assert block.ignored == ()
        for origin, call in block.calls:
            events += apply_recorded(state, call, origin, block)
        assert _json(events) == _json(live.by_block[n]), f"{name} block {n}"
    assert state.to_cbor() == live.state.to_cbor()
    vector = _load(f"{name}.json")
    assert _shape([e for b in vector["blocks"] for e in b["events"]]) == _shape(_json(live.events))
