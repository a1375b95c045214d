"""Before this node's reveal, a challenge whose opening it refused and one it fetched, validated and
replayed look the same in every view: every GET route of the OpenAPI schema (with each value of its
enumerated filters), every dashboard page and /metrics. Two node databases with the same history hold
one of each; their views are compared after the challenge ids are normalised. The routes are read
from the app, so a route added later is compared too. After the reveal they differ."""

from __future__ import annotations

import difflib
import json
import re
import time
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from challenges.refused import REFUSED_BUCKET, refused_pair
from node.api import create_app
from node.config import NodeConfig
from node.db import open_database, stage_log, txs, witnesses
from tests.node import api_data
from tests.node.api_data import RUN_B, cid, confirm_reveal, seed

NOW = 1_764_410_000.0
BASE = "http://127.0.0.1:8700"
REFUSED, REPLAYED = cid(0x61), cid(0x60)
IDS = {REFUSED: "<challenge>", REPLAYED: "<challenge>"}
# Values that change with the wall clock between two requests, not with the data.
CLOCK_KEYS = {"time", "uptime_s", "age_s", "latency_s"}
CLOCK_METRICS = re.compile(r"^(pot_http_request_duration_seconds|pot_chain_cursor_age_seconds|\w+_created\b)")
CLOCK_TEXT = re.compile(r"\d+(\.\d+)? s ago")


def _sealed_challenge(engine, c: bytes, *, refused: bool) -> None:
    """One challenge of run B at the reveal stage, written as the daemon writes it: its commit on
    chain, its reveal sent and not yet confirmed."""
    public = dict(leaf_hash=bytes([0xAB]) * 32, opening_digest=bytes([5]) * 32, opening_block=47,
                  opening_uri="http://127.0.0.1:8800/openings/x", opening_mirrors=json.dumps(["http://m.example/x"]))
    with engine.begin() as conn:
        if refused:
            value, proof = refused_pair(c)
            api_data._challenge(conn, c, RUN_B, step=4, block=45, stage="reveal", now=NOW, **public,
                                refusal_class="unavailable", status="opening refused: unavailable",
                                refusal_reason="GET http://127.0.0.1:8800/openings/x: connection refused",
                                value_hash=value, proof_hash=proof, norm_bucket=REFUSED_BUCKET,
                                attempts=3, updated_at=NOW - 31)
            log = [("awaiting_opening", "opening on chain at block 47"),
                   ("fetch", "GET http://127.0.0.1:8800/openings/x: connection refused"),
                   ("witness", f"refused: value {value.hex()[:16]}"), ("commit", "commit in block 48")]
            sends, error = 3, "the node is not connected"
        else:
            value, proof, bucket = bytes([0xD1]) * 32, bytes([0xD2]) * 32, 424242
            api_data._challenge(
                conn,
                c,
                RUN_B,
                step=4,
                block=45,
                stage="reveal",
                now=NOW,
                **public,
                opening_bytes=5000,
                opening_path="/data/openings/x",
                updated_at=NOW - 12,
                opening_source="http://127.0.0.1:8800/openings/x",
                loss_checks=json.dumps(
                    {"steps": 8, "ok": True, "findings": [], "losses": [5.0, 4.0, 3.5, 3.0]}
                ),
                matches_leaf=True,
                replay_leaf=bytes([0xD3]) * 40,
                replay_state_digest=bytes([0xD4]) * 32,
                replay_loss_bits=1085507584,
                replay_proof_hash=proof,
                value_hash=value,
                proof_hash=proof,
                norm_bucket=bucket,
            )
            log = [("awaiting_opening", "opening on chain at block 47"), ("fetch", "5000 bytes"),
                   ("validate", None), ("losschecks", "ok"), ("replay", "matches leaf t"),
                   ("witness", f"value {value.hex()[:16]}"), ("commit", "commit in block 48")]
            sends, error = 1, None
        t = NOW - 60
        for st, detail in log:
            conn.execute(
                stage_log.insert().values(
                    challenge_id=c, stage=st, started_at=t, finished_at=t + 1.5, detail=detail
                )
            )
            t += 7 if st == "replay" else 1.5
        conn.execute(
            witnesses.insert().values(
                challenge_id=c,
                verifier="v1",
                salt=bytes(32),
                value_hash=value,
                norm_bucket=REFUSED_BUCKET if refused else 424242,
                commitment=bytes(32),
                created_at=t,
            )
        )
        conn.execute(
            txs.insert().values(
                challenge_id=c,
                verifier="v1",
                kind="commit",
                origin="v1",
                payload=b"x",
                state="confirmed",
                block=48,
                sends=sends,
                created_at=t,
                updated_at=t + 1,
            )
        )
        conn.execute(
            txs.insert().values(
                challenge_id=c,
                verifier="v1",
                kind="reveal",
                origin="v1",
                payload=b"y",
                state="unconfirmed",
                sends=sends,
                last_error=error,
                created_at=t + 2,
                updated_at=t + 3,
            )
        )


def _node(db_url: str, monkeypatch, *, refused: bool):
    engine = open_database(db_url, init=True)
    with monkeypatch.context() as m:  # the same history, written at the same instant, in both databases
        m.setattr(time, "time", lambda: NOW)
        seed(engine)
    _sealed_challenge(engine, REFUSED if refused else REPLAYED, refused=refused)
    return engine


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    a = _node(f"sqlite:///{tmp_path / 'refused.db'}", monkeypatch, refused=True)
    b = _node(f"sqlite:///{tmp_path / 'replayed.db'}", monkeypatch, refused=False)
    yield a, b
    a.dispose()
    b.dispose()


def _enum_values(schema: dict[str, Any]) -> list[Any]:
    for alt in [schema, *schema.get("anyOf", [])]:
        if "enum" in alt:
            return list(alt["enum"])
    return []


def _routes(app) -> list[str]:
    """Every GET the app answers that takes no argument or a challenge/run id: the schema's routes,
    each once bare and once per value of each enumerated query parameter, and the dashboard's pages
    (not in the schema), with the overview's filters."""
    subst = {"challenge_id": "{challenge_id}", "run_id": RUN_B.hex()}
    urls: list[str] = []
    for path, ops in app.openapi()["paths"].items():
        op = ops.get("get")
        if op is None:
            continue
        params = op.get("parameters", [])
        if {p["name"] for p in params if p["in"] == "path"} - set(subst):
            continue
        url = path.replace("{run_id}", subst["run_id"])
        urls.append(url)
        for p in params:
            if p["in"] == "query":
                urls += [f"{url}?{p['name']}={v}" for v in _enum_values(p.get("schema", {}))]
    from node.queries import SHOWN_STAGES, STATUSES

    for route in app.routes:
        if not isinstance(route, APIRoute) or route.include_in_schema or "GET" not in route.methods:
            continue
        if set(route.param_convertors) - set(subst):
            continue
        url = route.path.replace("{run_id}", subst["run_id"])
        urls.append(url)
        if route.path == "/":
            urls += [f"/?stage={s}" for s in SHOWN_STAGES] + [f"/?status={s}" for s in STATUSES]
    return urls


def _normalise(text: str, challenge: bytes) -> str:
    h = challenge.hex()
    for n in (64, 24, 20, 16, 12):
        text = text.replace(h[:n], "<challenge>")
    try:
        doc = json.loads(text)
    except ValueError:
        lines = [ln for ln in text.splitlines() if not CLOCK_METRICS.match(ln)]
        return "\n".join(lines)

    def mask(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ("<clock>" if k in CLOCK_KEYS else mask(x)) for k, x in v.items()}
        if isinstance(v, str):
            return CLOCK_TEXT.sub("<clock> s ago", v)
        return [mask(x) for x in v] if isinstance(v, list) else v
    return json.dumps(mask(doc), indent=1, sort_keys=True)


def _views(client: TestClient, urls: list[str], challenge: bytes) -> dict[str, str]:
    out = {}
    for url in urls:
        r = client.get(url.replace("{challenge_id}", challenge.hex()))
        assert r.status_code < 500 or url == "/readyz", (url, r.status_code, r.text[:300])
        out[url] = f"{r.status_code}\n{_normalise(r.text, challenge)}"
    return out


def _differences(a: dict[str, str], b: dict[str, str]) -> list[str]:
    out = []
    for url in a:
        if a[url] != b[url]:
            diff = difflib.unified_diff(
                a[url].splitlines(), b[url].splitlines(), "refused", "replayed", n=0, lineterm=""
            )
            out.append(f"{url}:\n" + "\n".join(list(diff)[2:12]))
    return out


def test_a_refused_and_a_replayed_challenge_look_the_same_before_the_reveal(nodes):
    refused_db, replayed_db = nodes
    with TestClient(create_app(refused_db, NodeConfig()), base_url=BASE) as ca, \
            TestClient(create_app(replayed_db, NodeConfig()), base_url=BASE) as cb:
        urls = _routes(ca.app)
        assert {
            "/api/v1/challenges/{challenge_id}",
            f"/api/v1/runs/{RUN_B.hex()}",
            "/api/v1/status",
            "/metrics",
            "/challenges/{challenge_id}",
            f"/runs/{RUN_B.hex()}",
            "/",
            "/api/v1/challenges?stage=replay",
        } <= set(urls)
        a, b = _views(ca, urls, REFUSED), _views(cb, urls, REPLAYED)
        assert not _differences(a, b), "\n\n".join(_differences(a, b))
        # What both show is the sealed view, not an empty one.
        d = ca.get(f"/api/v1/challenges/{REFUSED.hex()}").json()
        assert (
            d["witness_disclosed"] is False
            and d["stage"] == "reveal"
            and d["committee"] == api_data.COMMITTEE
        )
        assert {e["state"] for e in d["timeline"]} == {"sealed"} and d["opening"]["block"] == 47
        assert d["txs"] == [
            {
                "kind": "commit",
                "state": "confirmed",
                "sends": None,
                "block": 48,
                "tx_hash": None,
                "last_error": None,
            }
        ]

        # This node's reveal lands on chain: the seal lifts, and the two differ where they really do.
        confirm_reveal(refused_db, REFUSED)
        confirm_reveal(replayed_db, REPLAYED)
        a, b = _views(ca, urls, REFUSED), _views(cb, urls, REPLAYED)
        differing = {d.split(":\n")[0] for d in _differences(a, b)}
        assert {"/api/v1/challenges/{challenge_id}", "/challenges/{challenge_id}", "/metrics"} <= differing
        d = ca.get(f"/api/v1/challenges/{REFUSED.hex()}").json()
        assert d["refusal_class"] == "unavailable" and d["stage"] == "revealed"
        assert re.search(r'pot_stage_duration_seconds_count\{stage="replay"\} 2', cb.get("/metrics").text)


def test_the_stage_filter_finds_a_sealed_job_by_its_shown_stage_only(nodes):
    _, replayed_db = nodes
    with TestClient(create_app(replayed_db, NodeConfig()), base_url=BASE) as c:
        for stage in ("replay", "witness", "commit", "fetch"):
            items = c.get("/api/v1/challenges", params={"stage": stage}).json()["items"]
            assert REPLAYED.hex() not in {i["challenge_id"] for i in items}, stage
        items = c.get("/api/v1/challenges", params={"stage": "reveal"}).json()["items"]
        assert REPLAYED.hex() in {i["challenge_id"] for i in items}
        run = c.get(f"/api/v1/runs/{RUN_B.hex()}").json()
        assert run["loss_curve"]["source_challenge"] != REPLAYED.hex()


def test_a_new_field_is_sealed_by_default():
    from node.queries import seal_challenge

    view = {
        "challenge_id": "ab",
        "stage": "replay",
        "added_later": 5000,
        "nested_later": {"a": 1},
        "list_later": [1],
        "opening": {"digest": "cd", "bytes": 5000, "source_later": "x"},
        "timeline": [
            {
                "stage": "fetch",
                "label": "opening fetched",
                "state": "done",
                "detail": "5000 bytes",
                "started_at": 1.0,
            }
        ],
        "txs": [
            {"kind": "commit", "state": "confirmed", "block": 3, "sends": 2},
            {"kind": "reveal", "state": "unconfirmed", "block": None},
        ],
    }
    out = seal_challenge(view, sealed=True, stage="sealed")
    assert out == {
        "challenge_id": "ab",
        "stage": "sealed",
        "added_later": None,
        "nested_later": None,
        "list_later": [],
        "opening": {"digest": "cd", "bytes": None, "source_later": None},
        "timeline": [
            {
                "stage": "fetch",
                "label": "opening fetched",
                "state": "sealed",
                "detail": None,
                "started_at": None,
            }
        ],
        "txs": [{"kind": "commit", "state": "confirmed", "block": 3, "sends": None}],
    }
    assert seal_challenge(view, sealed=False, stage="sealed") is view
