"""The API's docs pages work offline (their assets come from the node, never a CDN: checked in
headless Chromium with every non-local host unresolvable), and an admin call on a node without an
admin token is 403 whatever the request holds."""

from __future__ import annotations

import json
import re
import time

import pytest
from fastapi.testclient import TestClient

from devnet.procs import free_port
from node.api import DOCS_ASSETS, ApiServer, bind, create_app
from node.config import NodeConfig
from node.db import open_database
from tests.node.browser import chromium

BASE = "http://127.0.0.1:8700"


@pytest.fixture
def engine(tmp_path):
    eng = open_database(f"sqlite:///{tmp_path / 'node.db'}", init=True)
    yield eng
    eng.dispose()


def _assets(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_every_asset_from_the_node(engine, page):
    with TestClient(create_app(engine, NodeConfig()), base_url=BASE) as c:
        r = c.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assets = _assets(r.text)
        assert any(a.endswith(".js") for a in assets), assets
        for a in assets:
            assert a.startswith(f"{DOCS_ASSETS}/"), f"{page} loads {a} from outside the node"
            got = c.get(a)
            assert got.status_code == 200 and len(got.content) > 1000, a
        assert "fonts.googleapis" not in r.text and "cdn." not in r.text
        assert c.get("/openapi.json").json()["paths"]


def test_admin_call_without_a_configured_token_is_403(engine):
    with TestClient(create_app(engine, NodeConfig()), base_url=BASE) as c:
        for headers in ({}, {"Authorization": "Bearer anything"}):
            r = c.post("/api/v1/admin/witness-conflicts/acknowledge", headers=headers)
            assert r.status_code == 403 and "disabled" in r.json()["detail"], (headers, r.text)
            r = c.post(f"/api/v1/admin/challenges/{'ab' * 32}/retry", headers=headers)
            assert r.status_code == 403, (headers, r.text)
    # With a token configured, a call without one is still 401.
    with TestClient(create_app(engine, NodeConfig(), admin_token="t" * 20), base_url=BASE) as c:
        assert c.post("/api/v1/admin/witness-conflicts/acknowledge").status_code == 401


@pytest.fixture
def offline_browser(tmp_path):
    # Every host name but the node's address resolves to nothing: a CDN asset cannot load.
    with chromium(tmp_path / "chromium-profile", "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                  performance_log=True) as driver:
        yield driver


def _requested(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def test_swagger_ui_renders_the_operations_offline(engine, offline_browser):
    from selenium.webdriver.common.by import By

    port = free_port()
    server = ApiServer(create_app(engine, NodeConfig()), bind(f"127.0.0.1:{port}")).start()
    base = f"http://127.0.0.1:{port}"
    try:
        driver = offline_browser
        driver.get(f"{base}/docs")
        deadline = time.monotonic() + 30
        ops: list = []
        while time.monotonic() < deadline and not ops:
            ops = driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
            time.sleep(0.2)
        paths = {o.get_attribute("data-path") or o.text for o in ops}
        assert "/api/v1/status" in paths and "/readyz" in paths, paths
        requested = [u for u in _requested(driver) if u.startswith(("http:", "https:", "ws:", "wss:"))]
        assert requested and all(u.startswith(f"{base}/") for u in requested), requested
        assert any(u.endswith("/swagger-ui-bundle.js") for u in requested)
    finally:
        server.stop()
