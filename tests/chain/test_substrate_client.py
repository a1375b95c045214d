"""The Substrate client without a node: SCALE compact helpers, backoff, retries on a dead port,
and refusals of bad URLs and options."""

from __future__ import annotations

import logging
import re
import socket
import time

import pytest

from chain.calls import CALL_TYPES
from chain.substrate.client import SubstrateClient
from chain.substrate.connect import connect_substrate
from chain.substrate.pallet import PalletConfig, _field_readings, _walk_pallet
from chain.substrate.remark import _walk_remarks
from chain.substrate.scale import compact, pubkey, read_compact
from chain.transport import TransportError


@pytest.mark.parametrize("n", [0, 1, 63, 64, 16383, 16384, 2**30 - 1, 2**30, 2**32, 2**64 - 1, 2**128 - 1])
def test_compact_round_trip(n):
    data = b"\xaa" + compact(n) + b"\xbb"
    value, end = read_compact(data, 1)
    assert value == n and data[end:] == b"\xbb"


def test_compact_known_vectors():
    # From the SCALE specification's examples.
    assert compact(1) == bytes.fromhex("04")
    assert compact(42) == bytes.fromhex("a8")
    assert compact(69) == bytes.fromhex("1501")
    assert compact(65535) == bytes.fromhex("feff0300")
    assert compact(100000000000000) == bytes.fromhex("0b00407a10f35a")


def test_backoff_grows_is_capped_and_jittered():
    c = SubstrateClient("ws://127.0.0.1:9", backoff_base=0.5, backoff_max=4.0)
    for attempt, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)]:
        assert c.backoff_window(attempt) == cap
        samples = {c.backoff(attempt) for _ in range(50)}
        assert all(0 <= s <= cap for s in samples)  # full jitter: anywhere in the window
        assert len(samples) > 1  # jittered
        assert min(samples) < cap / 2  # not the old half jitter, which never went below cap / 2


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dead_node_is_retried_with_backoff_then_refused(caplog):
    c = SubstrateClient(f"ws://127.0.0.1:{_dead_port()}", rpc_timeout=2, max_attempts=3, backoff_base=0.2)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="chain.substrate"):
        with pytest.raises(
            TransportError, match=r"chain_getFinalizedHead: .* unreachable after 3 attempt\(s\)"
        ):
            c.rpc("chain_getFinalizedHead", [])
    waits = [float(w) for w in re.findall(r"retry \d/\d in ([0-9.]+) s", caplog.text)]
    assert len(waits) == 2 and waits[0] <= 0.2 and waits[1] <= 0.4  # within the doubling windows
    assert time.monotonic() - t0 >= sum(waits) - 0.02
    assert caplog.text.count("retry ") == 2
    assert c.reconnects == 3


def test_single_attempt_when_retry_is_off():
    c = SubstrateClient(f"ws://127.0.0.1:{_dead_port()}", max_attempts=5)
    with pytest.raises(TransportError, match=r"after 1 attempt"):
        c.rpc("author_submitExtrinsic", ["0x00"], retry=False)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9944", "127.0.0.1:9944", "", None])
def test_bad_urls(url):
    with pytest.raises(TransportError, match="ws:// or wss://"):
        SubstrateClient(url)  # type: ignore[arg-type]


def test_bad_options():
    with pytest.raises(TypeError, match="unknown option.*colour"):
        connect_substrate("ws://127.0.0.1:9", "//Alice", colour="red")
    with pytest.raises(TransportError, match="unknown Substrate transport kind"):
        connect_substrate("ws://127.0.0.1:9", "//Alice", kind="smoke-signal")
    with pytest.raises(TransportError, match="rpc_timeout"):
        SubstrateClient("ws://127.0.0.1:9", rpc_timeout=0)


def test_bad_pallet_configuration_refused_before_connecting():
    url = f"ws://127.0.0.1:{_dead_port()}"  # nothing listens: a connection attempt would fail otherwise
    with pytest.raises(TransportError, match="unknown key"):
        connect_substrate(url, "//Alice", kind="pallet", pallet={"palet": "X"})
    with pytest.raises(TransportError, match="unknown protocol call"):
        connect_substrate(url, "//Alice", kind="pallet", pallet={"calls": {"vote": "vote"}})
    with pytest.raises(TransportError, match="only applies to kind='pallet'"):
        connect_substrate(url, "//Alice", kind="remark", pallet={"pallet": "X"})


def _node(module, function, inner=(), remark=None):
    n = {"module": module, "function": function, "args": [], "raw": b"", "inner": list(inner)}
    if remark is not None:
        n["remark"] = remark
    return n


def test_remark_walk_order_and_carriers(caplog):
    tree = _node(
        "Utility",
        "batch",
        [
            _node("System", "remark_with_event", remark=b"a"),
            _node("System", "remark", remark=b"plain"),
            _node("Utility", "batch_all", [_node("System", "remark_with_event", remark=b"b")]),
            _node("Balances", "transfer"),
            _node("System", "remark_with_event", remark=b"c"),
        ],
    )
    with caplog.at_level(logging.INFO, logger="chain.substrate"):
        assert list(_walk_remarks(tree, "here")) == [b"a", b"b", b"c"]
    assert "here: skipped System.remark" in caplog.text


def test_pallet_walk_marks_non_atomic_batches():
    tree = _node(
        "Utility",
        "batch_all",
        [
            _node("PoT", "commit_witness"),
            _node("Utility", "batch", [_node("PoT", "reveal_witness_value")]),
            _node("System", "remark_with_event", remark=b"x"),
        ],
    )
    found = [(c["function"], in_batch) for c, in_batch in _walk_pallet(tree, "PoT", batch=False)]
    assert found == [("commit_witness", False), ("reveal_witness_value", True)]


def test_pallet_list_arguments_read_as_hashes_or_as_text():
    h = bytes(range(32))
    # A Merkle proof comes as hex text: the hashes are read first (the text reading is no proof).
    assert _field_readings(["0x" + h.hex()]) == [[h], ["0x" + h.hex()]]
    # An opening's mirrors are text: the text reading is offered (after a hex reading when one parses).
    assert _field_readings(["http://mirror/o/1"]) == [["http://mirror/o/1"]]
    assert _field_readings(["abcd"]) == [[b"\xab\xcd"], ["abcd"]]
    assert _field_readings([]) == [[]]


def test_pallet_config_from_mapping():
    cfg = PalletConfig.from_mapping(
        {"pallet": "Pot", "calls": {"commit_witness": "commit"}, "events": ["Issued"]}
    )
    assert cfg.pallet == "Pot" and cfg.events == ("Issued",)
    assert cfg.calls["commit_witness"] == "commit" and cfg.calls["submit_opening"] == "submit_opening"
    assert set(cfg.calls) == set(CALL_TYPES)
    assert PalletConfig.from_mapping(None) == PalletConfig()


def test_pubkey_forms():
    alice = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
    key = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")
    assert (
        pubkey(alice) == key == pubkey("0x" + key.hex()) == pubkey({"Id": alice}) == pubkey(("Id", alice))
    )
    with pytest.raises(ValueError):
        pubkey({"Index": 3})
    with pytest.raises(ValueError):
        pubkey("0x1234")
