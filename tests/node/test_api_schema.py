"""schemathesis against the node's OpenAPI schema: every route, generated valid and invalid input,
no 5xx, and every response (status, content type, body) as the schema says. The database holds
the seeded history, so ids drawn from the schema's examples hit real rows."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from node.api import EXAMPLE_ID, create_app
from node.config import NodeConfig
from node.db import chain_cursor, open_database
from tests.node import api_data

TOKEN = "schema-admin-token-0123456789"


# Built at import: schemathesis parametrizes the test from the schema when pytest collects it.
_DIR = Path(tempfile.mkdtemp(prefix="pot-api-schema-"))
_ENGINE = open_database(f"sqlite:///{_DIR / 'node.db'}", init=True)
api_data.seed(_ENGINE)
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_ENGINE, NodeConfig(), admin_token=TOKEN),
                                        headers={"Host": "127.0.0.1:8700"})


@pytest.fixture(autouse=True)
def _fresh_cursor():
    # The history is seeded at collection, possibly many minutes before these tests run; the
    # node's cursor must look freshly applied or /readyz rightly answers 503 (a stalled node).
    with _ENGINE.begin() as conn:
        conn.execute(chain_cursor.update().values(updated_at=time.time()))


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    _ENGINE.dispose()
    shutil.rmtree(_DIR, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_route_conforms(case):
    # With the admin token, so the admin route's 200/404/409 answers are checked too (the 401
    # without it is covered by the auth checks and by test_api), and with a Host the node answers
    # to by default (http.allowed_hosts).
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}", "Host": "127.0.0.1:8700"})


def test_the_schema_documents_every_route_with_examples():
    raw = schema.raw_schema
    paths = set(raw["paths"])
    assert paths == {
        "/healthz",
        "/readyz",
        "/metrics",
        "/api/v1/status",
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/challenges",
        "/api/v1/challenges/{challenge_id}",
        "/api/v1/refusals",
        "/api/v1/stake",
        "/api/v1/admin/challenges/{challenge_id}/retry",
        "/api/v1/admin/witness-conflicts/acknowledge",
    }
    models = raw["components"]["schemas"]
    for name in ("StatusOut", "RunOut", "RunPage", "ChallengeOut", "ChallengePage", "ChallengeDetailOut",
                 "RunDetailOut", "ReadyOut", "RetryOut", "AcknowledgeOut", "RefusalPage", "StakeOut"):
        assert models[name].get("examples"), f"{name} has no example"
    retry = raw["paths"]["/api/v1/admin/challenges/{challenge_id}/retry"]["post"]
    assert retry["security"] and {"401", "403", "409"} <= set(retry["responses"])
    ack = raw["paths"]["/api/v1/admin/witness-conflicts/acknowledge"]["post"]
    assert ack["security"] and {"401", "403"} <= set(ack["responses"])
    assert EXAMPLE_ID in str(raw["paths"]["/api/v1/challenges/{challenge_id}"])
