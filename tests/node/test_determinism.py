"""The determinism alarm end to end in one process: the daemon journals a witness, a repeat with
the same value is a silent no-op, a repeat with another value keeps the journaled one and shows in
the log, /metrics, /readyz and the dashboard until an operator acknowledges it."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from challenges.refused import REFUSED_BUCKET, refused_value_hash
from commitments.leaves import witness_value_hash
from node import journal
from node.api import create_app
from node.config import load_config, load_secrets
from node.daemon import VerifierNode
from node.db import challenges, open_database, stage_log, txs, witness_conflicts
from node.stages import Stage
from tests.node.api_data import seed

TOKEN = "determinism-admin-token-0123"


@pytest.fixture
def node(tmp_path, db_url):
    cfg_path = tmp_path / "n.toml"
    cfg_path.write_text(f'[chain]\nurl = "dev:///{tmp_path / "c.db"}"\naccount = "v1"\n'
                        f'[database]\nurl = "{db_url}"\n'
                        '[protocol]\n')  # a bare dev chain records no parameters: the node pins the defaults
    cfg = load_config(cfg_path, env={})
    engine = open_database(cfg.database_url, init=True)
    n = VerifierNode(cfg, load_secrets(None, env={}), engine)
    n.start()
    try:
        yield n
    finally:
        n.shutdown()
        engine.dispose()


LEAF = b"\x5e" * 40  # what a later replay gave instead of the refusal
PROOF = b"\x9f" * 32


def _witness_again(node, cid: bytes, refusal_class: str | None) -> None:
    """Put the job back at the witness stage, as a replay after a crash would, and run it: a
    refusal (any class gives the one refused pair), or with no class the replay's LEAF and PROOF."""
    with node.engine.begin() as conn:
        conn.execute(sa.update(challenges).where(challenges.c.challenge_id == cid)
                     .values(stage=Stage.WITNESS, refusal_class=refusal_class, commit_deadline=10**6,
                             replay_leaf=LEAF, replay_proof_hash=PROOF, norm_bucket=7))
    [job] = [j for j in node._jobs((Stage.WITNESS,)) if bytes(j.challenge_id) == cid]
    node._witness(job)


def _samples(text: str) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in re.findall(r"^(pot_\S+) (\S+)$", text, re.M)}


def test_a_changed_witness_is_never_sent_and_raises_the_alarm(node, caplog):
    seeded = seed(node.engine)
    cid = seeded.pending[0]
    journaled = refused_value_hash(cid, "unavailable")
    recomputed = witness_value_hash(LEAF)
    with caplog.at_level("INFO"):
        _witness_again(node, cid, "unavailable")
        _witness_again(node, cid, "unavailable")  # the same value again: safe, silent
        _witness_again(node, cid, "invalid")  # another class, the same one refused pair: silent too
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    with node.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(witness_conflicts)).scalar() == 0

    caplog.clear()
    with caplog.at_level("INFO"):
        _witness_again(node, cid, None)  # the recomputation changed its answer
    with node.engine.connect() as c:
        row = c.execute(sa.select(challenges).where(challenges.c.challenge_id == cid)).one()
        assert (row.stage, bytes(row.value_hash), row.norm_bucket) == ("commit", journaled, REFUSED_BUCKET)
        assert bytes(row.proof_hash) == journaled  # the refused pair is (v, v)
        assert (
            c.execute(sa.select(sa.func.count()).select_from(txs).where(txs.c.challenge_id == cid)).scalar()
            == 2
        )
        last = c.execute(sa.select(stage_log.c.detail).where(stage_log.c.challenge_id == cid)
                         .order_by(stage_log.c.id.desc()).limit(1)).scalar()
    assert "DETERMINISM CONFLICT" in last
    [alarm] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert alarm.event == "witness_conflict" and alarm.challenge_id == cid.hex()
    assert alarm.journaled_value_hash == journaled.hex()
    assert alarm.recomputed_value_hash == recomputed.hex() and alarm.recomputed_proof_hash == PROOF.hex()
    assert alarm.journaled_proof_hash == journaled.hex()
    [done] = [r for r in caplog.records if getattr(r, "event", None) == "witness_journaled"]
    assert done.conflict is True and done.inserted is False and done.value_hash == journaled.hex()

    with TestClient(create_app(node.engine, node.cfg, node=node, admin_token=TOKEN),
                    base_url="http://127.0.0.1:8700") as client:
        m = _samples(client.get("/metrics").text)
        assert m["pot_witness_conflicts_total"] == 1 and m["pot_witness_conflicts_unacknowledged"] == 1

        # Before this node's reveal is on chain the alarm shows, but neither value (the log has them).
        sealed = client.get("/readyz").json()["checks"]["determinism"]
        assert (
            sealed["ok"] is False
            and cid.hex() in sealed["detail"]
            and journaled.hex() not in sealed["detail"]
        )
        assert journaled.hex()[:12] not in client.get(f"/challenges/{cid.hex()}").text
        with node.engine.begin() as conn:
            journal.confirm_tx(conn, cid, "v1", "reveal", 60)

        r = client.get("/readyz")
        check = r.json()["checks"]["determinism"]
        assert r.status_code == 503 and r.json()["ready"] is False
        assert (
            check["ok"] is False and check["data"]["conflicts"] == 1 and check["data"]["unacknowledged"] == 1
        )
        assert cid.hex() in check["detail"] and journaled.hex() in check["detail"]
        assert all(c["ok"] for name, c in r.json()["checks"].items() if name != "determinism")

        detail = client.get(f"/api/v1/challenges/{cid.hex()}").json()
        [conflict] = detail["witness_conflicts"]
        assert conflict["journaled"] == {"value_hash": journaled.hex(), "norm_bucket": REFUSED_BUCKET}
        assert conflict["recomputed"]["value_hash"] == recomputed.hex()

        overview = client.get("/").text
        assert 'id="determinism-alarm"' in overview and "1 witness conflict\n" in overview
        assert re.search(r'id="witness-conflicts">\s*<span class="count">1</span>', overview)
        page = client.get(f"/challenges/{cid.hex()}").text
        assert 'id="conflicts"' in page and f'data-conflict="{cid.hex()}"' in page
        assert journaled.hex()[:20] in page and recomputed.hex()[:20] in page
        other = client.get(f"/challenges/{seeded.honest.hex()}").text
        assert (
            'id="conflicts"' not in other and 'id="determinism-alarm"' in other
        )  # the banner is on every page

        # An operator looks, then acknowledges: readiness passes, the counter keeps its count.
        assert client.post("/api/v1/admin/witness-conflicts/acknowledge").status_code == 401
        ack = client.post("/api/v1/admin/witness-conflicts/acknowledge",
                          headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert (ack["acknowledged"], ack["total"]) == (1, 1)
        r = client.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"]["determinism"]["ok"] is True
        assert "all acknowledged" in r.json()["checks"]["determinism"]["detail"]
        m = _samples(client.get("/metrics").text)
        assert m["pot_witness_conflicts_total"] == 1 and m["pot_witness_conflicts_unacknowledged"] == 0
        overview = client.get("/").text
        assert 'id="determinism-alarm"' not in overview
        assert re.search(r'id="witness-conflicts">\s*<span class="count">1</span>', overview)
