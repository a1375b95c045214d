"""The API reads a running daemon only through node.status.NodeStatus: a real daemon's snapshot
is what /readyz and /metrics report, a snapshot out of range is refused, and an object that is not
a NodeStatus is refused when the app is built."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from node.api import ApiContext, create_app
from node.config import load_config, load_secrets
from node.daemon import VerifierNode
from node.db import open_database
from node.status import NodeStatus, StatusSnapshot


@pytest.fixture
def node(tmp_path, db_url):
    cfg_path = tmp_path / "n.toml"
    cfg_path.write_text(f'[chain]\nurl = "dev:///{tmp_path / "c.db"}"\naccount = "v1"\n'
                        f'[database]\nurl = "{db_url}"\n[replay]\nworkers = 2\n[protocol]\n')
    cfg = load_config(cfg_path, env={})
    engine = open_database(cfg.database_url, init=True)
    n = VerifierNode(cfg, load_secrets(None, env={}), engine)
    n.start()
    try:
        yield n
    finally:
        n.shutdown()
        engine.dispose()


def _gauge(text: str, name: str, state: str) -> float:
    [line] = [x for x in text.splitlines() if x.startswith(f'{name}{{state="{state}"}}')]
    return float(line.split()[-1])


def test_a_real_daemon_is_a_node_status_and_the_api_reports_its_snapshot(node):
    assert isinstance(node, NodeStatus)
    live = node.status()
    assert live.account == "v1" and live.workers == 2 and live.busy == 0 and not live.stopping
    with TestClient(create_app(node.engine, node.cfg, node=node), base_url="http://127.0.0.1:8700") as client:
        pool = client.get("/readyz").json()["checks"]["worker_pool"]
        assert (
            pool["data"]["workers"] == 2 and pool["data"]["busy"] == 0 and pool["data"]["stopping"] is False
        )
        metrics = client.get("/metrics").text
        assert _gauge(metrics, "pot_replay_workers", "idle") == 2
        assert _gauge(metrics, "pot_replay_workers", "busy") == 0
        node.stop.set()  # the first stop signal: the snapshot, and so readiness, says so at once
        assert node.status().stopping
        pool = client.get("/readyz").json()["checks"]["worker_pool"]
        assert pool["ok"] is False and "stopping" in pool["detail"] and pool["data"]["stopping"] is True


def test_the_api_refuses_an_object_that_is_not_a_node_status(node):
    with pytest.raises(TypeError, match="NodeStatus"):
        ApiContext(node.engine, node.cfg, node=object())


@pytest.mark.parametrize("fields, problem", [
    ({"head": -2}, "head"),
    ({"busy": 3}, "busy"),
    ({"busy": -1}, "busy"),
])
def test_a_snapshot_out_of_range_is_refused(fields, problem):
    base = {"account": "v1", "head": 5, "workers": 2, "busy": 1, "stopping": False}
    with pytest.raises(ValueError, match=problem):
        StatusSnapshot(**{**base, **fields})
