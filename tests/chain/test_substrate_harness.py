"""The chopsticks harness itself: the genesis export, a failed start reported with the log (and no
process left behind), funding and block making on the session's node."""

from __future__ import annotations

import json

import pytest
from substrateinterface import SubstrateInterface

from tests.chain.chopsticks_env import Chopsticks, ChopsticksError, chopsticks, export_genesis  # noqa: F401

pytestmark = pytest.mark.chopsticks


def test_genesis_export_is_the_rococo_asset_hub_spec(tmp_path):
    path = export_genesis(tmp_path / "spec.json")
    spec = json.loads(path.read_text())
    assert spec["id"] == "asset-hub-rococo"
    assert "raw" in spec["genesis"] and spec["genesis"]["raw"]["top"]
    assert spec["properties"]["tokenSymbol"] == "ROC"


def test_failed_start_is_loud_and_leaves_nothing_running(tmp_path):
    node = Chopsticks(tmp_path)
    node.genesis_path.write_text('{"name": "broken", "genesis": {"raw": {"top": {}}}}')
    with pytest.raises(ChopsticksError, match="exited during start-up|did not answer") as exc:
        node.start()
    assert "chopsticks.log" in str(exc.value)
    assert node.proc is None
    node.close()


def test_fund_and_new_blocks(chopsticks: Chopsticks):  # noqa: F811
    addr = "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty"  # //Bob
    chopsticks.fund([addr], amount=123 * 10**12)
    si = SubstrateInterface(url=chopsticks.url, auto_reconnect=False, ws_options={"timeout": 30})
    with si:
        assert si.query("System", "Account", [addr])["data"]["free"].value == 123 * 10**12
    before = chopsticks.head()[0]
    assert chopsticks.new_blocks(2) == before + 2
    number, block_hash = chopsticks.head()
    assert chopsticks.rpc("chain_getBlockHash", [number]) == block_hash
