"""The HTTP API over SQLite and PostgreSQL: health and readiness checks, status, runs and challenges
with filters, pagination, timelines and clusters, metrics, bad input, and the admin re-queue route
behind its bearer token. Also the pure helpers and the server-rendered pages."""

from __future__ import annotations

import math
import re
import time
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node import queries as Q
from node.api import create_app, read_admin_token
from node.config import ConfigError, NodeConfig, load_config
from node.dashboard.svg import loss_curve_svg, nice_ticks, timeline_svg
from node.db import chain_cursor, challenges
from tests.node import api_data
from tests.node.api_data import (
    LOSSES_A,
    RUN_A,
    RUN_B,
    SEALED_BUCKET,
    SEALED_VALUE,
    confirm_reveal,
    seed,
    seed_sealed,
)

TOKEN = "s3cret-admin-token-0123456789"
BASE = "http://127.0.0.1:8700"  # a name the default http.allowed_hosts answers to


@pytest.fixture
def seeded(engine):
    return seed(engine)


@pytest.fixture
def client(engine, seeded):
    with TestClient(create_app(engine, NodeConfig(), admin_token=TOKEN), base_url=BASE) as c:
        yield c


def test_healthz_and_readyz_report_each_check(client, engine):
    assert client.get("/healthz").json()["status"] == "ok"
    r = client.get("/readyz")
    body = r.json()
    assert r.status_code == 200 and body["ready"] is True
    assert set(body["checks"]) == {"database", "chain_head", "worker_pool", "determinism"}
    assert body["checks"]["determinism"]["data"] == {"conflicts": 0, "unacknowledged": 0}
    assert body["checks"]["chain_head"]["data"]["block"] == 50
    assert body["checks"]["database"]["data"]["revision"] is not None

    # A cursor that stopped moving makes the node unready, and says why.
    with engine.begin() as conn:
        conn.execute(sa.update(chain_cursor).values(updated_at=time.time() - 3600))
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["ready"] is False
    head = r.json()["checks"]["chain_head"]
    assert head["ok"] is False and "not following the chain" in head["detail"]
    assert r.json()["checks"]["database"]["ok"] is True


def test_status_counts_and_agreement(client, engine, seeded):
    s = client.get("/api/v1/status").json()
    assert s["cursor"]["block"] == 50 and s["runs"] == 2
    assert s["challenges_by_status"] == {"honest": 1, "fraud": 1, "inconclusive": 1, "pending": 9}
    # The retrying and the open missed job sit on their committee, unrevealed: they count as sealed.
    assert s["challenges_by_stage"] == {"done": 2, "sealed": 2, "missed": 1, "awaiting_opening": 7}
    assert s["agreement"] == {"agreed": 2, "disagreed": 0, "outliers": 0, "ratio": 1.0}
    with engine.begin() as conn:
        conn.execute(sa.update(challenges).where(challenges.c.challenge_id == seeded.fraud)
                     .values(in_winning_cluster=False, outlier=True, updated_at=time.time()))
    s2 = client.get("/api/v1/status").json()
    assert s2["agreement"] == {"agreed": 1, "disagreed": 1, "outliers": 1, "ratio": 0.5}
    assert s2["fingerprint"] != s["fingerprint"]


def test_runs_list_detail_and_detection(client):
    page = client.get("/api/v1/runs").json()
    assert page["total"] == 2 and [r["run_id"] for r in page["items"]] == [RUN_B.hex(), RUN_A.hex()]
    a = client.get(f"/api/v1/runs/{RUN_A.hex()}").json()
    assert a["challenged_steps"] == 7 and a["challenges"] == 8
    assert {d["fake_share"]: d["probability"] for d in a["detection"]}[0.1] == pytest.approx(1 - 0.9 ** 7)
    assert [p["loss"] for p in a["loss_curve"]["losses"]] == LOSSES_A
    assert [p["step"] for p in a["loss_curve"]["losses"]] == list(range(1, 9))
    assert a["verdicts"] == {"honest": 1, "fraud": 0, "inconclusive": 0, "pending": 7}
    assert client.get("/api/v1/runs", params={"miner": "miner-b"}).json()["total"] == 1
    b = client.get(f"/api/v1/runs/0x{RUN_B.hex().upper()}").json()
    assert b["loss_curve"]["losses"] == [] and b["slashed"] == 0

    r = client.get(f"/api/v1/runs/{'0' * 64}")
    assert r.status_code == 404 and "no run 000" in r.json()["detail"]
    assert client.get("/api/v1/runs/xyz").status_code == 422
    assert client.get("/api/v1/runs", params={"limit": 0}).status_code == 422


def test_challenge_filters_and_cursor_pagination(client, seeded):
    fraud = client.get("/api/v1/challenges", params={"status": "fraud"}).json()
    assert [c["challenge_id"] for c in fraud["items"]] == [seeded.fraud.hex()]
    pend = client.get("/api/v1/challenges", params={"status": "pending", "run": RUN_A.hex()}).json()
    assert pend["total"] == 7 and all(
        c["status"] == "pending" and c["run_id"] == RUN_A.hex() for c in pend["items"]
    )
    missed = client.get("/api/v1/challenges", params={"stage": "missed"}).json()
    assert {c["challenge_id"] for c in missed["items"]} == {seeded.missed_commit.hex()}  # the other is sealed
    sealed = client.get("/api/v1/challenges", params={"stage": "sealed"}).json()
    assert {c["challenge_id"] for c in sealed["items"]} == {seeded.missed_fetch.hex(), seeded.retrying.hex()}
    assert client.get("/api/v1/challenges", params={"stage": "replay"}).json()["total"] == 0

    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/v1/challenges", params=params).json()
        assert page["total"] == 12 and len(page["items"]) <= 3
        seen += [c["challenge_id"] for c in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 4 and len(seen) == len(set(seen)) == 12
    blocks = [
        c["issued_block"] for c in client.get("/api/v1/challenges", params={"limit": 500}).json()["items"]
    ]
    assert blocks == sorted(blocks, reverse=True)

    r = client.get("/api/v1/challenges", params={"cursor": "not-a-cursor"})
    assert r.status_code == 422 and "cursor" in r.text
    r = client.get("/api/v1/challenges", params={"status": "maybe"})
    assert r.status_code == 422 and "honest" in r.text
    assert client.get("/api/v1/challenges", params={"run": "12"}).status_code == 422


def test_the_stake_shows_bond_unbonding_and_penalties(client, engine, seeded):
    from node import stake

    st = client.get("/api/v1/stake").json()
    assert (st["account"], st["bond"], st["target"], st["verifier_stake"], st["eligible"]) == (
        "v1", api_data.BOND - api_data.PENALTY, api_data.BOND, 100, False)
    assert (st["penalised_total"], st["bonded_total"], st["unbonding"], st["pending_bond"]) == (
        api_data.PENALTY, api_data.BOND, [], None)
    assert st["penalties"] == [
        {
            "block": 46,
            "challenge_id": seeded.missed_commit.hex(),
            "amount": api_data.PENALTY,
            "why": "no_commit",
        }
    ]
    assert client.get("/api/v1/status").json()["stake"] == st
    # The penalty is on its challenge too.
    d = client.get(f"/api/v1/challenges/{seeded.missed_commit.hex()}").json()
    assert (d["penalty"], d["penalty_why"]) == (api_data.PENALTY, "no_commit")
    # An unbonding amount and a pending top-up, as the daemon records them.
    from chain.protocol import new_state

    state = new_state()
    state.head, state.vbonds["v1"], state.unbonding["v1"] = 60, 0, [[100, 50]]
    with engine.begin() as conn:
        stake.save_stake(conn, "v1", state, target=100)
        stake.record_bond(conn, account="v1", amount=100, target=100, head=60)
    st = client.get("/api/v1/stake").json()
    assert st["unbonding"] == [{"release_block": 100, "amount": 50}] and st["unbonding_total"] == 50
    assert st["pending_bond"]["amount"] == 100 and st["pending_bond"]["sent_block"] == 60
    html = client.get("/").text
    assert 'id="stake"' in html and "no_commit" in html and seeded.missed_commit.hex()[:12] in html
    assert "release at block 100" in html


def test_challenge_detail_timeline_and_clusters(client, engine, seeded):
    d = client.get(f"/api/v1/challenges/{seeded.honest.hex()}").json()
    assert [e["label"] for e in d["timeline"]] == [
        "issued", "opening fetched", "validated", "loss checks", "replayed", "witness journaled", "committed",
        "revealed", "resolved"]
    for e in d["timeline"]:
        assert e["state"] == "done"
        assert e["duration_s"] == pytest.approx(seeded.durations[e["stage"]])
        assert e["finished_at"] - e["started_at"] == pytest.approx(e["duration_s"])
    # Clusters are witness pairs: v3's copy of H(leaf t) with a made-up proof equals the commitment in
    # its value half, yet is a cluster of its own and never the winner.
    assert [
        (c["size"], c["winning"], c["includes_this_node"], c["matches_commitment"]) for c in d["clusters"]
    ] == [(2, True, True, True), (1, False, False, True)]
    assert [c["proof"] for c in d["clusters"]] == [api_data.PROOF.hex(), api_data.LAZY_PROOF.hex()]
    assert d["clusters"][0]["verifiers"] == ["v1", "v2"] and d["this_node"] == ["v1"]
    assert d["committee"] == api_data.COMMITTEE and (d["round"], d["on_committee"], d["rechallenge"]) == (
        1,
        True,
        None,
    )
    assert d["opening"]["mirrors"] == ["http://mirror.example/openings/x"]
    assert d["opening"]["served_by"] == "http://127.0.0.1:8800/openings/x"
    assert d["witness"]["proof_hash"] == d["replay"]["proof_hash"] == api_data.PROOF.hex()
    assert d["quorum"] == {"cluster_size": 2, "reveals": 3, "outliers": ["v3"]}
    assert {t["kind"]: t["state"] for t in d["txs"]} == {"commit": "confirmed", "reveal": "confirmed"}
    assert "losses" not in d["loss_checks"]

    waiting = client.get(f"/api/v1/challenges/{seeded.retrying.hex()}").json()  # sealed: on its committee
    assert {e["state"] for e in waiting["timeline"]} == {"sealed"} and waiting["note"] is None
    with engine.begin() as conn:  # resolved while the job still waited: unsealed
        conn.execute(sa.update(challenges).where(challenges.c.challenge_id == seeded.retrying)
                     .values(verdict="inconclusive", resolved_block=49))
    waiting = client.get(f"/api/v1/challenges/{seeded.retrying.hex()}").json()
    states = {e["stage"]: e["state"] for e in waiting["timeline"]}
    assert states["fetch"] == "done" and states["replay"] == "running" and states["commit"] == "pending"
    assert waiting["note"].startswith("replay attempt 1 failed")
    stopped = client.get(f"/api/v1/challenges/{seeded.missed_commit.hex()}").json()
    assert {e["stage"]: e["state"] for e in stopped["timeline"]}["resolution"] == "not reached"
    assert client.get(f"/api/v1/challenges/{'ab' * 32}").status_code == 404


def test_admin_requeue_needs_the_token(client, engine, seeded):
    url = f"/api/v1/admin/challenges/{seeded.retrying.hex()}/retry"
    r = client.post(url)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = client.post(url, headers={"Authorization": "Bearer wrong-token"})
    assert r.status_code == 403 and "not this node's admin token" in r.json()["detail"]
    assert client.get(url).status_code == 405  # never through GET

    r = client.post(url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["stage"] == "replay"
    with engine.connect() as conn:
        job = conn.execute(sa.select(challenges).where(challenges.c.challenge_id == seeded.retrying)).one()
    assert (job.stage, job.next_attempt_at, job.attempts, job.status) == (
        "replay",
        0.0,
        0,
        "re-queued by an operator",
    )

    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = client.post(f"/api/v1/admin/challenges/{seeded.missed_fetch.hex()}/retry", headers=auth)
    assert r.status_code == 200 and (r.json()["previous_stage"], r.json()["stage"]) == ("missed", "fetch")
    r = client.post(f"/api/v1/admin/challenges/{seeded.missed_commit.hex()}/retry", headers=auth)
    assert r.status_code == 409 and "missed at stage commit" in r.json()["detail"]
    r = client.post(f"/api/v1/admin/challenges/{seeded.honest.hex()}/retry", headers=auth)
    assert r.status_code == 409 and "stage done has no work" in r.json()["detail"]
    assert client.post(f"/api/v1/admin/challenges/{'cd' * 32}/retry", headers=auth).status_code == 404


def test_admin_routes_disabled_without_a_token(engine, seeded, tmp_path):
    with TestClient(create_app(engine, NodeConfig()), base_url=BASE) as c:
        r = c.post(
            f"/api/v1/admin/challenges/{seeded.retrying.hex()}/retry", headers={"Authorization": "Bearer x"}
        )
        assert r.status_code == 403 and "disabled" in r.json()["detail"]
    # The token comes from http.admin_token_file, which must not be readable by others.
    tok = tmp_path / "admin.token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o644)
    cfg_path = tmp_path / "n.toml"
    cfg_path.write_text('[http]\nadmin_token_file = "admin.token"\n')
    cfg = load_config(cfg_path, env={})
    with pytest.raises(ValueError, match="chmod 600"):
        read_admin_token(cfg)
    tok.chmod(0o600)
    assert read_admin_token(cfg) == TOKEN
    with TestClient(create_app(engine, cfg), base_url=BASE) as c:
        r = c.post(
            f"/api/v1/admin/challenges/{seeded.retrying.hex()}/retry",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert r.status_code == 200


def _every_view(client, sealed) -> dict[str, str]:
    """Every unauthenticated GET that could show a challenge: API lists with their filters,
    details, the run, status, readiness, metrics and each dashboard page."""
    urls = ["/api/v1/status", "/api/v1/runs", f"/api/v1/runs/{RUN_B.hex()}", "/api/v1/challenges",
            "/api/v1/challenges?stage=reveal", "/api/v1/challenges?status=pending", "/readyz", "/metrics",
            "/", "/?stage=reveal", f"/runs/{RUN_B.hex()}"]
    for c in (sealed.replayed, sealed.refused):
        urls += [f"/api/v1/challenges/{c.hex()}", f"/challenges/{c.hex()}"]
    out = {}
    for url in urls:
        r = client.get(url)
        assert r.status_code in (200, 503), (url, r.status_code)  # /readyz: 503 while a conflict is open
        out[url] = r.text
    return out


def test_no_witness_is_shown_before_this_nodes_reveal_is_on_chain(client, engine):
    sealed = seed_sealed(engine)
    views = _every_view(client, sealed)
    for url, text in views.items():
        for secret in sealed.secrets():
            assert secret not in text.lower(), f"{url} shows {secret} before the reveal"
    for c in (sealed.replayed, sealed.refused):
        d = client.get(f"/api/v1/challenges/{c.hex()}").json()
        assert d["witness_disclosed"] is False and d["stage"] == "reveal"  # its commit is on chain
        assert d["matches_leaf"] is None and d["refusal_class"] is None and d["refusal_reason"] is None
        assert set(d["witness"].values()) == {None} and set(d["replay"].values()) == {None}
        assert d["in_winning_cluster"] is None and d["outlier"] is None
        # The timeline keeps its stages and labels only: states, times and details are withheld.
        by = {e["stage"]: e for e in d["timeline"]}
        assert by["witness"] == {**by["witness"], "state": "sealed", "started_at": None, "detail": None}
        assert "unavailable" not in str(d) and "connection refused" not in str(d)
        for item in client.get("/api/v1/challenges", params={"stage": "reveal"}).json()["items"]:
            assert item["matches_leaf"] is None and item["refusal_class"] is None
    d = client.get(f"/api/v1/challenges/{sealed.replayed.hex()}").json()
    assert {e["stage"]: e["detail"] for e in d["timeline"]}["fetch"] is None and d["opening"]["bytes"] is None
    assert d["witness_conflicts"] == []  # a sealed challenge lists none; the alarm below still counts it
    ready = client.get("/readyz").json()["checks"]["determinism"]
    assert ready["ok"] is False and "withheld until this node's reveal is on chain" in ready["detail"]
    page = views[f"/challenges/{sealed.replayed.hex()}"]
    assert 'id="witness-sealed"' in page and "matches the committed leaf" not in page

    # This node's reveal lands on chain: the same views now show the witness.
    confirm_reveal(engine, sealed.replayed)
    d = client.get(f"/api/v1/challenges/{sealed.replayed.hex()}").json()
    assert d["witness_disclosed"] is True and d["matches_leaf"] is True
    assert d["witness"]["value_hash"] == SEALED_VALUE.hex() and d["witness"]["norm_bucket"] == SEALED_BUCKET
    assert {e["stage"]: e["detail"] for e in d["timeline"]}["replay"] == "matches leaf t"
    assert d["witness_conflicts"][0]["journaled"]["value_hash"] == SEALED_VALUE.hex()
    assert SEALED_VALUE.hex() in client.get("/readyz").json()["checks"]["determinism"]["detail"]
    page = client.get(f"/challenges/{sealed.replayed.hex()}").text
    assert "matches the committed leaf t" in page and SEALED_VALUE.hex()[:20] in page
    listed = {
        c["challenge_id"]: c
        for c in client.get("/api/v1/challenges", params={"stage": "revealed"}).json()["items"]
    }
    assert listed[sealed.replayed.hex()]["matches_leaf"] is True
    # The other one is still sealed; a resolution unseals it without a reveal (the windows are closed).
    still = client.get(f"/api/v1/challenges/{sealed.refused.hex()}").json()
    assert still["witness_disclosed"] is False and still["refusal_class"] is None
    with engine.begin() as conn:
        conn.execute(sa.update(challenges).where(challenges.c.challenge_id == sealed.refused)
                     .values(verdict="fraud", resolved_block=49, stage="done", updated_at=time.time()))
    done = client.get(f"/api/v1/challenges/{sealed.refused.hex()}").json()
    assert done["witness_disclosed"] is True and done["refusal_class"] == "unavailable"
    assert done["witness"]["value_hash"] == sealed.refused_value().hex()


def test_disclosure_needs_every_journaled_account_to_have_revealed(engine, seeded):
    from node.db import txs, witnesses

    sealed = seed_sealed(engine)
    with engine.begin() as conn:
        conn.execute(
            witnesses.insert().values(
                challenge_id=sealed.replayed,
                verifier="v1-old",
                salt=bytes(32),
                value_hash=SEALED_VALUE,
                norm_bucket=1,
                commitment=bytes(32),
                created_at=0.0,
            )
        )
    confirm_reveal(engine, sealed.replayed)
    with engine.connect() as conn:
        assert Q.disclosed_ids(conn, [sealed.replayed, sealed.refused]) == set()
        conn.execute(txs.insert().values(challenge_id=sealed.replayed, verifier="v1-old", kind="reveal",
                                         origin="v1-old", payload=b"z", state="confirmed", block=48, sends=1,
                                         created_at=0.0, updated_at=0.0))
        assert Q.disclosed_ids(conn, [sealed.replayed, sealed.refused]) == {sealed.replayed}
        conn.rollback()


def test_host_header_must_name_this_node(client):
    for host in ("127.0.0.1:8700", "127.0.0.1", "localhost:8700", "LOCALHOST.", "[::1]:8700", "[0:0::1]"):
        assert client.get("/api/v1/status", headers={"Host": host}).status_code == 200, host
    # A page on another site whose name was rebound to this node's address sends its own name.
    for path in (
        "/api/v1/status",
        "/api/v1/challenges",
        "/readyz",
        "/metrics",
        "/",
        "/healthz",
        "/static/live.js",
        "/openapi.json",
    ):
        r = client.get(path, headers={"Host": "rebind.attacker.example:8700"})
        assert r.status_code == 421, path
        assert "http.allowed_hosts" in r.json()["detail"] and "rebind.attacker.example" in r.json()["detail"]
    r = client.post("/api/v1/admin/witness-conflicts/acknowledge",
                    headers={"Host": "10.0.0.9", "Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 421
    for bad in ("a b", "host:port", "[::1", "x:99999999", "::1]:80"):
        r = client.get("/api/v1/status", headers={"Host": bad})
        assert r.status_code == 400 and "Host header" in r.json()["detail"], bad
    m = _samples(client.get("/metrics").text)
    assert (
        m['pot_http_requests_total{method="GET",route="unmatched",status="4xx"}'] >= 8
    )  # refusals are counted


def test_allowed_hosts_config(engine, seeded, tmp_path):
    cfg = NodeConfig.model_validate({"http": {"allowed_hosts": ["pot.example.org", "10.1.2.3"]}})
    with TestClient(create_app(engine, cfg), base_url="http://pot.example.org") as c:
        assert c.get("/api/v1/status").status_code == 200
        assert c.get("/", headers={"Host": "10.1.2.3:8700"}).status_code == 200
        assert (
            c.get("/api/v1/status", headers={"Host": "localhost"}).status_code == 421
        )  # the list replaces the default
    with TestClient(create_app(engine, NodeConfig.model_validate({"http": {"allowed_hosts": ["*"]}}))) as c:
        assert c.get("/api/v1/status", headers={"Host": "anything.example"}).status_code == 200
    listen = NodeConfig.model_validate({"http": {"listen": "192.0.2.7:8700"}})
    assert listen.http.host_names() == {"192.0.2.7", "127.0.0.1", "localhost", "[::1]"}
    env = load_config(None, env={"POT_HTTP_ALLOWED_HOSTS": "pot.example.org, [::1]"})
    assert env.http.host_names() == {"pot.example.org", "[::1]"}
    for bad, why in (('["pot.example.org:8700"]', "carry no port"), ('["*", "localhost"]', "stands alone"),
                     ('[""]', "not a host name"), ('["a/b"]', "not a host name")):
        path = tmp_path / "n.toml"
        path.write_text(f"[http]\nallowed_hosts = {bad}\n")
        with pytest.raises(ConfigError, match=why) as info:
            load_config(path, env={})
        assert "http.allowed_hosts" in str(info.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=80))
def test_any_host_header_is_answered_or_refused_never_a_server_error(client, host):
    r = client.get("/api/v1/status", headers={"Host": host})
    assert r.status_code in (200, 400, 421) and r.json()["detail" if r.status_code != 200 else "api_version"]


def test_a_real_socket_request_without_or_with_a_foreign_host(engine, seeded):
    import socket

    from node.api import start_api_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server = start_api_server(NodeConfig.model_validate({"http": {"listen": f"127.0.0.1:{free}"}}), engine)
    try:
        host, port = server.address

        def raw(request: bytes) -> bytes:
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(request)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
                return out

        r = raw(b"GET /api/v1/status HTTP/1.0\r\n\r\n")
        assert r.startswith(b"HTTP/1.1 400") and b"no Host header" in r
        r = raw(
            b"GET /api/v1/status HTTP/1.1\r\nHost: rebind.attacker.example:%d\r\nConnection: close\r\n\r\n"
            % port
        )
        assert r.startswith(b"HTTP/1.1 421") and b"http.allowed_hosts" in r
        r = raw(b"GET /api/v1/status HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % port)
        assert r.startswith(b"HTTP/1.1 200") and b'"api_version"' in r
    finally:
        server.stop()


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_names_units_and_labels(client, seeded):
    client.get(f"/api/v1/challenges/{seeded.honest.hex()}")
    client.get(f"/api/v1/challenges/{seeded.fraud.hex()}")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    assert all(name.startswith("pot_") for name in m)
    assert m['pot_challenges_resolved_total{verdict="honest"}'] == 1
    assert m['pot_challenges_resolved_total{verdict="fraud"}'] == 1
    assert m['pot_challenges{stage="awaiting_opening"}'] == 7
    assert m["pot_witness_in_winning_cluster_total"] == 2
    assert m["pot_chain_cursor_block"] == 50 and m["pot_database_up"] == 1
    assert (
        m["pot_verifier_bond"] == 50
        and m["pot_verifier_penalised_total"] == 50
        and m["pot_verifier_unbonding"] == 0
    )
    assert m['pot_stage_duration_seconds_count{stage="replay"}'] == 1
    assert m['pot_stage_duration_seconds_sum{stage="replay"}'] == pytest.approx(seeded.durations["replay"])
    key = 'pot_http_requests_total{method="GET",route="/api/v1/challenges/{challenge_id}",status="2xx"}'
    assert m[key] == 2
    # No id ever becomes a label value.
    assert seeded.honest.hex() not in r.text and RUN_A.hex() not in r.text


def test_database_outage_is_a_503_not_a_crash(tmp_path):
    from node.db import make_engine

    dead = make_engine("postgresql+psycopg2://postgres@127.0.0.1:1/none")
    with TestClient(create_app(dead, NodeConfig()), base_url=BASE) as c:
        r = c.get("/api/v1/status")
        assert r.status_code == 503 and "unavailable" in r.json()["detail"]
        ready = c.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["database"]["ok"] is False
        assert "unreachable" in ready.json()["checks"]["database"]["detail"]
        assert "pot_database_up 0.0" in c.get("/metrics").text
        assert c.get("/healthz").status_code == 200
    dead.dispose()


def test_dashboard_pages_render_the_data(client, seeded):
    html = client.get("/").text
    assert re.search(r'data-verdict="fraud">\s*<span class="count">1</span>', html)
    assert re.search(r'data-verdict="pending">\s*<span class="count">9</span>', html)
    assert "100.0%" in html and "agreed with the winning cluster" in html
    run = client.get(f"/runs/{RUN_A.hex()}").text
    assert run.count('class="mark"') == 8 and 'data-step="7" data-verdict="honest"' in run
    assert "<polyline" in run and "8 committed losses" in run
    ch = client.get(f"/challenges/{seeded.honest.hex()}").text
    assert 'data-stage="replay" data-state="done"' in ch and "★ winning" in ch
    assert ch.count("(this node)") == 1 and "v1 (this node)</span>, <span class=\"verifier\">v2</span>" in ch
    filtered = client.get("/", params={"status": "fraud"}).text
    assert seeded.fraud.hex() in filtered and seeded.honest.hex() not in filtered
    r = client.get("/", params={"status": "maybe"})
    assert r.status_code == 400 and "status must be one of" in r.text
    assert client.get(f"/runs/{RUN_B.hex()[:10]}").status_code == 400
    assert client.get(f"/challenges/{'ef' * 32}").status_code == 404
    assert client.get("/static/live.js").status_code == 200


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.text(min_size=1, max_size=80).filter(lambda t: t not in (".", "..")),
    st.sampled_from(["/", "/runs/", "/challenges/"]),
    st.sampled_from(["status", "run", "stage", "cursor"]),
)
def test_pages_answer_any_input_without_a_server_error(client, text, page, param):
    if page == "/":
        r = client.get("/", params={param: text})
    else:  # one path segment: a "/" in it would make another path (another route's 404)
        r = client.get(page + quote(text.replace("/", "_"), safe=""))
    assert r.status_code in (200, 400, 404) and r.headers["content-type"].startswith("text/html")
    assert r.status_code == 200 or 'class="error-message"' in r.text


# --- pure helpers -----------------------------------------------------------------------------


@given(st.floats(0, 1), st.integers(0, 500))
def test_detection_probability_bounds_and_monotone(f, k):
    p = Q.detection_probability(f, k)
    assert 0.0 <= p <= 1.0
    assert Q.detection_probability(f, k + 1) >= p
    assert Q.detection_probability(min(1.0, f + 0.1), k) >= p - 1e-12
    assert math.isclose(1 - p, (1 - f) ** k, abs_tol=1e-12)


def test_detection_probability_refuses_nonsense():
    with pytest.raises(ValueError):
        Q.detection_probability(1.5, 3)
    with pytest.raises(ValueError):
        Q.detection_probability(0.5, -1)


@given(st.integers(0, 2**40), st.binary(min_size=32, max_size=32))
def test_cursor_round_trip(block, key):
    assert Q.decode_cursor(Q.encode_cursor(block, key)) == (block, key)


@given(st.text(max_size=90))
def test_decode_cursor_never_crashes(text):
    try:
        block, key = Q.decode_cursor(text)
    except Q.BadQuery as exc:
        assert "next_cursor" in str(exc)
        return
    assert block >= 0 and len(key) == 32


def test_build_timeline_running_and_pending():
    rows = [{"stage": "awaiting_opening", "started_at": 0.0, "finished_at": 2.0, "detail": None},
            {"stage": "fetch", "started_at": 2.0, "finished_at": 2.5, "detail": "ok"}]
    tl = Q.build_timeline(rows, current_stage="validate", current_since=2.5, now=4.0)
    by = {e["stage"]: e for e in tl}
    assert by["awaiting_opening"]["duration_s"] == 2.0 and by["fetch"]["duration_s"] == 0.5
    assert by["validate"]["state"] == "running" and by["validate"]["duration_s"] == 1.5
    assert by["resolution"]["state"] == "pending"


@given(st.floats(-1e6, 1e6), st.floats(0, 1e6))
def test_nice_ticks_cover_the_range(lo, width):
    ticks = nice_ticks(lo, lo + width)
    assert ticks and all(lo - 1e-6 * max(1, abs(lo)) <= t for t in ticks)
    assert ticks == sorted(ticks)


def test_loss_curve_svg_marks_and_gaps():
    svg = loss_curve_svg([3.0, None, 2.0, 1.5], [{"step": 4, "verdict": "fraud", "challenge_id": "ab"},
                                                 {"step": 9, "verdict": None, "challenge_id": "cd"}])
    assert svg.count("<polyline") == 1 and svg.count('class="loss-point"') == 1  # the gap splits the line
    assert 'data-step="4" data-verdict="fraud"' in svg and 'data-verdict="pending"' in svg
    assert "no committed losses" in loss_curve_svg([], [])
    bars = timeline_svg(Q.build_timeline([], current_stage="fetch", current_since=1.0, now=2.0), now=2.0)
    assert 'data-stage="fetch" data-state="running"' in bars


@given(st.lists(st.one_of(st.none(), st.floats(-1e30, 1e30)), max_size=40), st.integers(1, 60))
def test_loss_curve_svg_draws_any_losses(losses, step):
    svg = loss_curve_svg(losses, [{"step": step, "verdict": "fraud", "challenge_id": "ab"}])
    assert svg.startswith("<svg") and svg.endswith("</svg>") and svg.count('class="mark"') == 1
    assert "nan" not in svg.lower().replace("nanosecond", "")
