"""Fuzzed HTTP input to the node's API and dashboard: any path segment, query string, repeated or
unknown parameter and Authorization header. No request gets a 5xx; API errors are JSON with a
`detail`; dashboard errors are pages that say what was wrong."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.api import create_app
from node.config import NodeConfig
from node.db import open_database
from tests.node import api_data

FUZZ = settings(max_examples=80, deadline=3000, suppress_health_check=list(HealthCheck))
TOKEN = "fuzz-admin-token-0123456789"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    engine = open_database(f"sqlite:///{tmp_path_factory.mktemp('api') / 'node.db'}", init=True)
    api_data.seed(engine)
    with TestClient(create_app(engine, NodeConfig(), admin_token=TOKEN), raise_server_exceptions=False,
                    base_url="http://127.0.0.1:8700") as c:
        yield c
    engine.dispose()


def _known_id() -> str:
    return api_data.RUN_A.hex()


# Segments that stress the parsers: near-ids, unicode, traversal, encodings, huge numbers.
segments = st.one_of(
    st.text(max_size=80),
    st.from_regex(r"\A[0-9a-fA-F]{60,70}\Z"),
    st.sampled_from(["..", "%2e%2e", "%00", "0x" + "ab" * 32, "AB" * 32, " " + "ab" * 32, "ab" * 32 + "\n",
                     "9" * 400, "-1", "null", "[]", "{}", "%", "\u202e" + "ab" * 31]),
)
query_values = st.one_of(
    st.text(max_size=60),
    st.integers().map(str),
    st.from_regex(r"\A[0-9]{1,30}-[0-9a-f]{0,70}\Z"),
    st.sampled_from(
        [
            "",
            "0",
            "-5",
            "501",
            "1e9",
            "NaN",
            "honest",
            "fraud",
            "pending",
            "done",
            "99999999999999999999",
            "1" * 15 + "-" + "f" * 64,
        ]
    ),
)
query_keys = st.sampled_from(["limit", "cursor", "status", "run", "stage", "miner"]) | st.text(max_size=12)
queries = st.lists(st.tuples(query_keys, query_values), max_size=5)


def _url(path: str, query: list[tuple[str, str]]) -> str:
    qs = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
    return path + ("?" + qs if qs else "")


def _assert_clean(resp, api: bool) -> None:
    assert resp.status_code < 500, f"{resp.request.url} -> {resp.status_code}: {resp.text[:500]}"
    if resp.status_code >= 400:
        if api:
            body = resp.json()
            assert body.get("detail"), f"{resp.request.url}: an API error must say why"
        else:
            assert resp.text.strip(), f"{resp.request.url}: an error page must say why"


@FUZZ
@given(
    st.sampled_from(
        ["/api/v1/runs", "/api/v1/challenges", "/api/v1/status", "/healthz", "/readyz", "/metrics"]
    ),
    queries,
)
def test_list_routes_with_any_query(client, path, query):
    _assert_clean(client.get(_url(path, query)), api=path.startswith("/api"))


@FUZZ
@given(st.sampled_from(["/api/v1/runs/", "/api/v1/challenges/"]), segments, queries)
def test_detail_routes_with_any_id(client, prefix, segment, query):
    _assert_clean(client.get(_url(prefix + quote(segment, safe=""), query)), api=True)


@FUZZ
@given(st.sampled_from(["/", "/runs/", "/challenges/"]), segments, queries)
def test_dashboard_pages_with_any_input(client, prefix, segment, query):
    path = prefix if prefix == "/" else prefix + quote(segment, safe="")
    _assert_clean(client.get(_url(path, query)), api=False)


@FUZZ
@given(segments, st.one_of(st.none(), st.text(max_size=60), st.just(f"Bearer {TOKEN}"),
                           st.text(max_size=40).map(lambda t: "Bearer " + t)))
def test_admin_route_with_any_id_and_token(client, segment, auth):
    headers = {}
    if auth is not None:
        headers["Authorization"] = auth.encode("utf-8")  # raw bytes, as any HTTP client may send them
    resp = client.post(f"/api/v1/admin/challenges/{quote(segment, safe='')}/retry", headers=headers)
    _assert_clean(resp, api=True)
    if auth != f"Bearer {TOKEN}":
        assert resp.status_code in (401, 403, 404, 405, 422), resp.status_code


def test_unknown_query_keys_and_repeats_do_not_change_the_answer(client):
    plain = client.get("/api/v1/runs").json()
    assert client.get("/api/v1/runs?zzz=1&limit=50&limit=50").json() == plain
    assert client.get(f"/api/v1/runs/{_known_id()}").status_code == 200
