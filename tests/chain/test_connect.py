"""Chain URLs: dev files, substrate endpoints, and clear refusals of anything else."""

from __future__ import annotations

import sys
import types

import pytest

from chain.connect import ChainURLError, connect, parse_dev_url
from chain.dev import DevTransport


def test_parse_dev_urls():
    assert parse_dev_url("dev:///abs/chain.db") == ("/abs/chain.db", {})
    assert parse_dev_url("dev://rel/chain.db") == ("rel/chain.db", {})
    assert parse_dev_url("dev:///x.db?sealing=interval") == ("/x.db", {"sealing": "interval"})
    with pytest.raises(ChainURLError, match="unknown dev URL option"):
        parse_dev_url("dev:///x.db?color=red")
    with pytest.raises(ChainURLError, match="looks like"):
        parse_dev_url("dev://")


def test_connect_dev(tmp_path):
    t = connect(f"dev://{tmp_path}/c.db", account="miner-1")
    assert isinstance(t, DevTransport) and t.account == "miner-1" and t.finalized_head() == 0
    t2 = connect(f"dev://{tmp_path}/c.db?sealing=interval")
    assert t2.account == "alice" and t2.chain.sealing == "interval"


@pytest.mark.parametrize("url", ["http://host:9944", "file:///x", "chain.db", ""])
def test_unsupported_urls(url):
    with pytest.raises(ChainURLError, match="unsupported chain URL"):
        connect(url)


def test_ws_delegates_to_the_substrate_transport(monkeypatch):
    seen = {}

    def connect_substrate(url, key_uri, *, kind, **opts):
        seen.update(url=url, key_uri=key_uri, kind=kind, opts=opts)
        return "transport"

    module = types.ModuleType("chain.substrate")
    module.connect_substrate = connect_substrate
    monkeypatch.setitem(sys.modules, "chain.substrate", module)
    assert connect("ws://127.0.0.1:9944", key="//Alice", kind="pallet", pallet="Pot") == "transport"
    assert seen == {
        "url": "ws://127.0.0.1:9944",
        "key_uri": "//Alice",
        "kind": "pallet",
        "opts": {"pallet": "Pot"},
    }
    connect("wss://node.example:443", account="//Bob")
    assert seen["key_uri"] == "//Bob" and seen["kind"] == "remark"
    with pytest.raises(ChainURLError, match="'remark' or 'pallet'"):
        connect("ws://127.0.0.1:9944", kind="rpc")
