"""Prover routes: openings by digest (whole, ranges, limits), the run's leaves, bearer tokens."""

from __future__ import annotations

import socket

import httpx
import pytest
from fastapi.testclient import TestClient

from challenges.opening import load_opening, verify_leaves
from commitments import merkle
from miner.prover import BackgroundServer, create_app, parse_range
from tests.miner.helpers import served_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return served_run(tmp_path_factory.mktemp("prover"))


def test_healthz_and_whole_opening(run):
    run_dir, run_id, d, data, _ = run
    c = TestClient(create_app(run_dir))
    assert c.get("/healthz").json() == {"ok": True, "run_id": run_id.hex(), "leaves": 4}
    r = c.get(f"/openings/{d.hex()}")
    assert r.status_code == 200 and r.content == data
    assert r.headers["accept-ranges"] == "bytes" and int(r.headers["content-length"]) == len(data)
    assert load_opening(r.content).digest == d
    assert c.get(f"/openings/{d.hex().upper()}").content == data


def test_range_requests(run):
    run_dir, _, d, data, _ = run
    c = TestClient(create_app(run_dir))
    r = c.get(f"/openings/{d.hex()}", headers={"Range": "bytes=10-99"})
    assert r.status_code == 206 and r.content == data[10:100]
    assert r.headers["content-range"] == f"bytes 10-99/{len(data)}"
    assert c.get(f"/openings/{d.hex()}", headers={"Range": "bytes=-16"}).content == data[-16:]
    assert c.get(f"/openings/{d.hex()}", headers={"Range": f"bytes={len(data) - 5}-"}).content == data[-5:]
    # Resuming a download in pieces gives the same file.
    parts = [c.get(f"/openings/{d.hex()}", headers={"Range": f"bytes={i}-{i + 99_999}"}).content
             for i in range(0, len(data), 100_000)]
    assert b"".join(parts) == data
    for bad in (f"bytes={len(data)}-", "bytes=5-2", "bytes=0-1,4-5", "items=0-1", "bytes=-0"):
        r = c.get(f"/openings/{d.hex()}", headers={"Range": bad})
        assert r.status_code == 416, bad
        assert r.headers["content-range"] == f"bytes */{len(data)}"


def test_parse_range():
    assert parse_range("bytes=0-0", 10) == (0, 0)
    assert parse_range("bytes=3-100", 10) == (3, 9)
    assert parse_range("bytes=-100", 10) == (0, 9)
    assert parse_range("bytes=-", 10) is None


def test_unknown_and_malformed_digests(run):
    run_dir, *_ = run
    c = TestClient(create_app(run_dir))
    r = c.get("/openings/" + "ab" * 32)
    assert r.status_code == 404 and "no opening" in r.json()["error"]
    r = c.get("/openings/../meta.cbor")
    assert r.status_code in (400, 404)
    r = c.get("/openings/xyz")
    assert r.status_code == 400 and "64-hex-digit" in r.json()["error"]


def test_size_limit(run):
    run_dir, _, d, data, _ = run
    r = TestClient(create_app(run_dir, max_bytes=len(data) - 1)).get(f"/openings/{d.hex()}")
    assert r.status_code == 413 and "over this server's limit" in r.json()["error"]


def test_leaves(run):
    run_dir, run_id, _, _, leaves = run
    c = TestClient(create_app(run_dir))
    r = c.get(f"/runs/{run_id.hex()}/leaves")
    assert r.status_code == 200 and r.headers["content-type"] == "application/cbor"
    got = verify_leaves(r.content, merkle.root(leaves), len(leaves))
    assert [x.to_bytes() for x in got] == leaves
    r = c.get(f"/runs/{'00' * 32}/leaves")
    assert r.status_code == 404


def test_the_token_guards_only_the_private_routes(run):
    run_dir, run_id, d, data, _ = run
    c = TestClient(create_app(run_dir, token="s3cret"))
    # What verifiers fetch is public by design: no token, a wrong one, or the right one.
    for path in ("/healthz", f"/openings/{d.hex()}", f"/runs/{run_id.hex()}/leaves"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer s3cret"}):
            assert c.get(path, headers=headers).status_code == 200, (path, headers)
    assert c.get(f"/openings/{d.hex()}").content == data
    # The run directory's listing is the miner's own.
    r = c.get("/admin/store")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "openings, leaves and /healthz need none" in r.json()["error"]
    assert c.get("/admin/store", headers={"Authorization": "Bearer wrong"}).status_code == 401
    r = c.get("/admin/store", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200
    body = r.json()
    assert body["run_id"] == run_id.hex() and body["leaves"] == 4
    assert body["openings"] == [
        {"digest": d.hex(), "bytes": len(data), "modified": body["openings"][0]["modified"]}
    ]
    assert 0 in {st["step"] for st in body["states"]}
    # Nothing else of the run directory is reachable, with the token or without.
    for path in ("/states/00000000.safetensors", "/meta.cbor", "/leaves.bin", "/openings/../meta.cbor"):
        assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code in (400, 404), path


def test_admin_routes_are_off_without_a_token(run):
    run_dir, run_id, d, _, _ = run
    c = TestClient(create_app(run_dir))
    r = c.get("/admin/store")
    assert r.status_code == 403 and "--token" in r.json()["error"]
    assert c.get(f"/openings/{d.hex()}").status_code == 200


def test_background_server_over_real_http(run):
    run_dir, _, d, data, _ = run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = BackgroundServer(run_dir, "127.0.0.1", port, token="t").start()
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/openings/{d.hex()}", headers={"Authorization": "Bearer t"},
                      timeout=10)
        assert r.status_code == 200 and r.content == data
    finally:
        srv.stop()
    assert not srv.thread.is_alive()
