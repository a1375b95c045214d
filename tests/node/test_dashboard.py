"""The dashboard in headless Chromium against a real `pot node run` on a live dev chain: an honest
run and a run that trained step 7 on another batch are challenged at step 7, replayed and resolved;
the test reads what a person sees (verdict counts updating live, the loss curve with its marked
steps, a challenge's timeline and clusters, the witness sealed until this node's reveal is on chain)
and keeps screenshots under artifacts/."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from chain.protocol import ProtocolParams
from tests.node.browser import chromium
from tests.node.harness import REPO, Network

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ARTIFACTS = REPO / "artifacts"
# Windows wide enough for a replay on a busy 2-core machine (blocks every 0.5 s: 60 s to commit).
# Protocol v3: a seat reserves verifier_stake of free bond, and a committee draws committee_size seats
# from the seat units. The node bonds two units and each challenge seats one, so the two runs'
# challenges are open at once.
PARAMS = ProtocolParams(
    commit_window=120,
    reveal_window=10,
    opening_deadline=10,
    challenge_delay=2,
    quorum_min_reveals=1,
    challenges_per_run=1,
    forced_challenge_steps=(7,),
    committee_size=1,
)
BOND = 2 * PARAMS.verifier_stake
HONEST, FAKED = b"\x42" * 16, b"\x43" * 16  # the runs' nonces


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path / "chromium-profile", window="1280,1500") as driver:
        yield driver


def _wait(cond, timeout: float, what: str):
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = cond()
        except StaleElementReferenceException:  # the live view swapped the page under the read
            value = None
        if value:
            return value
        time.sleep(0.3)
    raise TimeoutError(f"{what} not seen within {timeout} s")


def _count(driver, verdict: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'.card[data-verdict="{verdict}"] .count').text


def _screenshot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    # The whole page, not only the window: size the window to the document first.
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(4000, max(900, height + 40)))
    driver.save_screenshot(str(path))
    return path


def test_dashboard_shows_real_outcomes_live(tmp_path, browser):
    from selenium.webdriver.common.by import By

    net = Network(tmp_path, PARAMS, interval=0.5)
    try:
        net.start_node("v1", net.node_config("v1", bond=BOND))
        base = f"http://{net.http_listen['v1']}"
        _wait(lambda: _get(base + "/healthz") == 200, 90, "the node's HTTP API")

        # The page is open before anything is decided; it must update itself, without a reload.
        browser.get(base + "/")
        browser.execute_script("window.__sameDocument = true;")
        assert browser.title.startswith("Overview")
        assert _count(browser, "honest") == "0" and _count(browser, "fraud") == "0"

        honest = net.start_run(steps=8, nonce=HONEST)
        faked = net.start_run(steps=8, nonce=FAKED, substitute_at=7)
        assert honest.opened.wait(120) and faked.opened.wait(120), net.log("v1")[-3000:]

        # Journaled and committed, not yet revealed: the witness is sealed in the API, on the
        # challenge page and in the open overview's row. The views are kept, to search them for
        # the values once they are known.
        sealed_views: dict[str, list[str]] = {}
        for run in (honest, faked):
            cid = run.challenge_id.hex()

            def committed(cid=cid):
                d = httpx.get(f"{base}/api/v1/challenges/{cid}", timeout=10).json()
                return d if d["stage"] in ("commit", "reveal") else None

            sealed = _wait(committed, 120, f"this node's witness of challenge {cid[:12]} committed")
            assert sealed["witness_disclosed"] is False and sealed["matches_leaf"] is None
            assert set(sealed["witness"].values()) == {None} and set(sealed["replay"].values()) == {None}
            sealed_views[cid] = [httpx.get(f"{base}{path}", timeout=10).text for path in (
                f"/api/v1/challenges/{cid}", f"/challenges/{cid}", "/", "/api/v1/challenges",
                f"/runs/{run.run_id.hex()}", "/api/v1/status", "/readyz", "/metrics")]
            assert 'id="witness-sealed"' in sealed_views[cid][1]
        _wait(
            lambda: browser.find_elements(
                By.CSS_SELECTOR, f'tr[data-challenge="{faked.challenge_id.hex()}"] .agree.sealed'
            ),
            30,
            "a sealed row on the open overview",
        )

        for run in (honest, faked):
            ch = net.wait_resolved(run.challenge_id, 180).state.challenges[run.challenge_id]
            assert ch.verdict == ("fraud" if run is faked else "honest"), httpx.get(
                f"{base}/api/v1/challenges/{run.challenge_id.hex()}", timeout=10).text

        try:
            _wait(lambda: _count(browser, "honest") == "1" and _count(browser, "fraud") == "1", 30,
                  "both verdicts on the open overview")
        except TimeoutError:
            status = httpx.get(base + "/api/v1/status", timeout=10).json()
            raise AssertionError(f"the page shows {browser.find_element(By.TAG_NAME, 'main').text[:600]!r}, "
                                 f"live badge {browser.find_element(By.ID, 'live').text!r}; the API says "
                                 f"{status['challenges_by_status']}; browser log "
                                 f"{browser.get_log('browser')[-5:]}") from None
        assert browser.execute_script("return window.__sameDocument === true;"), "the page was reloaded"
        # The header's block number follows the chain on the same page.
        first = int(browser.find_element(By.ID, "cursor-block").text)
        _wait(
            lambda: int(browser.find_element(By.ID, "cursor-block").text) > first,
            15,
            "the header's block moving",
        )

        def overview() -> None:
            assert _count(browser, "pending") == "0"
            agreement = browser.find_element(By.ID, "agreement").text
            assert "100.0%" in agreement and "2 of 2" in agreement
            rows = browser.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
            assert {r.get_attribute("data-run") for r in rows} == {honest.run_id.hex(), faked.run_id.hex()}
            # The stake panel: the bond the node put up before the runs were challenged, and the
            # fees its two winning seats were paid (credited to the bond), nothing reserved any more.
            state = net.view().state
            assert state.paid["v1"] > 0 and state.vbonds["v1"] == BOND + state.paid["v1"]
            assert browser.find_element(By.CSS_SELECTOR, "#stake-bond .count").text == str(state.vbonds["v1"])
            assert browser.find_element(By.CSS_SELECTOR, "#stake-paid .count").text == str(state.paid["v1"])
            assert browser.find_element(By.CSS_SELECTOR, "#stake-reserved .count").text == "0"
            assert browser.find_element(By.CSS_SELECTOR, "#stake-penalised .count").text == "0"
            for r in rows:  # k = 1 challenged step: 1 - (1 - f)^1 = f
                assert [c.text for c in r.find_elements(By.CSS_SELECTOR, "td.detection")] == [
                    "1.0%", "5.0%", "10.0%", "25.0%", "50.0%"]
            table = {r.get_attribute("data-challenge"): r.get_attribute("data-status")
                     for r in browser.find_elements(By.CSS_SELECTOR, "table.challenges tbody tr")}
            assert table == {honest.challenge_id.hex(): "honest", faked.challenge_id.hex(): "fraud"}

        _unless_replaced(overview)
        _screenshot(browser, "dashboard.png")

        # Filtering by verdict leaves only the faked run's challenge.
        browser.find_element(By.CSS_SELECTOR, 'select[name="status"] option[value="fraud"]').click()
        browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
        _wait(lambda: "status=fraud" in browser.current_url, 10, "the filtered overview")
        shown = [r.get_attribute("data-challenge")
                 for r in browser.find_elements(By.CSS_SELECTOR, "table.challenges tbody tr")]
        assert shown == [faked.challenge_id.hex()]

        # Run pages: the committed loss curve (8 steps) with step 7 marked by its verdict.
        for run, verdict in ((faked, "fraud"), (honest, "honest")):
            browser.get(f"{base}/runs/{run.run_id.hex()}")
            svg = browser.find_element(By.CSS_SELECTOR, "#loss-chart svg.loss-curve")
            assert svg.is_displayed() and svg.size["width"] > 500
            points = svg.find_element(By.CSS_SELECTOR, "polyline.loss-line").get_attribute("points").split()
            assert len(points) == 8
            marks = svg.find_elements(By.CSS_SELECTOR, "a.mark")
            assert [(m.get_attribute("data-step"), m.get_attribute("data-verdict")) for m in marks] == [
                ("7", verdict)
            ]
            assert f"{verdict} @ 7" in svg.text
            # The mark sits on the curve: its dot has the 7th point's coordinates.
            dot = marks[0].find_element(By.CSS_SELECTOR, "circle.mark-dot")
            assert f"{dot.get_attribute('cx')},{dot.get_attribute('cy')}" == points[6]
            assert "8 committed losses" in browser.find_element(By.TAG_NAME, "main").text
        _screenshot(browser, "dashboard-run.png")

        # Clicking the marked dot opens the challenge: its timeline with durations, and the cluster.
        dot.click()
        _wait(lambda: "/challenges/" in browser.current_url, 10, "the challenge page")
        assert honest.challenge_id.hex() in browser.current_url
        rows = browser.find_elements(By.CSS_SELECTOR, "table.timeline-table tbody tr")
        assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == [
            "issued",
            "opening fetched",
            "validated",
            "loss checks",
            "replayed",
            "witness journaled",
            "committed",
            "revealed",
            "resolved",
        ]
        assert all(r.get_attribute("data-state") == "done" for r in rows)
        for r in rows:
            assert re.fullmatch(r"\d+(\.\d)? (ms|s|min)", r.find_element(By.CSS_SELECTOR, "td.duration").text)
        bars = browser.find_elements(By.CSS_SELECTOR, "#timeline-chart g.tl-bar")
        assert len(bars) == 9 and all(b.get_attribute("data-state") == "done" for b in bars)
        clusters = browser.find_elements(By.CSS_SELECTOR, "table.clusters tbody tr")
        assert len(clusters) == 1 and "★ winning" in clusters[0].text and "v1 (this node)" in clusters[0].text
        assert clusters[0].find_elements(By.TAG_NAME, "td")[5].text == "yes"  # equals the miner's H(leaf t)
        assert "v1 (this node)" in browser.find_element(By.ID, "committee").text
        _screenshot(browser, "dashboard-challenge.png")

        # Revealed and resolved: the witness shows now, and no view kept while it was sealed held
        # any of it. (An honest replay's value is H(leaf t), which the chain already published as
        # the miner's commitment; the faked run's value is one nobody else had.)
        for run, matched in ((honest, True), (faked, False)):
            cid = run.challenge_id.hex()
            opened = httpx.get(f"{base}/api/v1/challenges/{cid}", timeout=10).json()
            assert opened["witness_disclosed"] is True and opened["matches_leaf"] is matched
            public = {opened["committed_value"], opened["opening"]["leaf_hash"]}
            secrets = [
                h
                for h in (
                    opened["witness"]["value_hash"],
                    opened["witness"]["proof_hash"],
                    opened["replay"]["leaf"],
                    opened["replay"]["state_digest"],
                )
                if h not in public
            ]
            assert all(secrets) and (matched or opened["witness"]["value_hash"] in secrets)
            for text in sealed_views[cid]:
                assert not [h[:12] for h in secrets if h[:12] in text.lower()], cid

        # The same node's API agrees with what the pages show.
        detail = httpx.get(f"{base}/api/v1/challenges/{faked.challenge_id.hex()}", timeout=10).json()
        assert detail["verdict"] == "fraud" and detail["replay"]["matches_leaf"] is False
        assert detail["clusters"][0]["matches_commitment"] is False
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["checks"]["worker_pool"]["data"]["workers"] == 1
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert 'pot_challenges_resolved_total{verdict="fraud"} 1.0' in metrics
        assert 'pot_replay_workers{state="idle"} 1.0' in metrics
    finally:
        net.close()
        shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)


def _unless_replaced(check, attempts: int = 3) -> None:
    """Run a check of the page again if the live view swapped the elements it was reading."""
    from selenium.common.exceptions import StaleElementReferenceException

    for i in range(attempts):
        try:
            return check()
        except StaleElementReferenceException:
            if i == attempts - 1:
                raise
            time.sleep(0.5)


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0
