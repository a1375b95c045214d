"""Hostile-input probes, second round: what a node's views tell before its reveal, and the inputs of
its neighbours' parsers (a prover's Range header, a node's config file). Registered in devnet.hostile."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from challenges.opening import load_opening
from challenges.refused import REFUSED_BUCKET, refused_pair
from devnet.hostile import config_refusal, probe
from devnet.lab import CHALLENGED, Lab
from miner.prover import create_app as prover_app
from node.api import create_app
from node.config import NodeConfig
from node.db import challenges, open_database, runs, stage_log, txs, witnesses

_CLOCK_KEYS = {"time", "uptime_s", "age_s", "latency_s"}
_CLOCK_LINES = re.compile(r"^(pot_http_request_duration_seconds|pot_chain_cursor_age_seconds|\w+_created\b)")
_CLOCK_TEXT = re.compile(r"\d+(\.\d+)? s ago")


def _sealed_node(lab: Lab, name: str, cid: bytes, *, refused: bool, now: float):
    """A node database holding the lab's honest run and one challenge of it at the reveal stage, its
    commit on chain: `refused` (the opening was unavailable, the refused pair committed) or fetched,
    validated and replayed, each written as the daemon writes it."""
    db = lab.dir / "hostile" / f"sealing-{name}.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)
    engine = open_database(f"sqlite:///{db}", init=True)
    run_id = lab.honest.run_id
    common = dict(
        challenge_id=cid,
        run_id=run_id,
        idx=0,
        step=CHALLENGED,
        root=bytes(32),
        size=len(lab.leaves),
        mode="value",
        endpoint=lab.prover.endpoint,
        issued_block=3,
        opening_deadline=9,
        commit_deadline=60,
        reveal_deadline=90,
        stage="reveal",
        opening_digest=bytes([4]) * 32,
        opening_uri=f"{lab.prover.endpoint}/openings/x",
        opening_block=5,
        leaf=lab.leaves[CHALLENGED],
        leaf_hash=bytes([5]) * 32,
        committee=json.dumps(["verifier", "other"]),
        on_committee=True,
        round=1,
        next_attempt_at=0.0,
        created_at=now - 100,
    )
    if refused:
        value, proof = refused_pair(cid)
        bucket = REFUSED_BUCKET
        row = dict(refusal_class="unavailable", refusal_reason="connection refused", attempts=3,
                   status="opening refused: unavailable", updated_at=now - 40)
        log = [("awaiting_opening", "opening on chain at block 5"), ("fetch", "connection refused"),
               ("witness", "refused"), ("commit", "commit in block 7")]
    else:
        value, proof, bucket = bytes([0xD1]) * 32, bytes([0xD2]) * 32, 12
        row = dict(
            opening_bytes=len(lab.opening()),
            opening_source=f"{lab.prover.endpoint}/openings/x",
            loss_checks=json.dumps(
                {"steps": len(lab.leaves) - 1, "ok": True, "findings": [], "losses": [1.0]}
            ),
            matches_leaf=True,
            replay_leaf=bytes([0xD3]) * 40,
            replay_state_digest=bytes([0xD4]) * 32,
            replay_proof_hash=proof,
            attempts=0,
            updated_at=now - 10,
        )
        log = [("awaiting_opening", "opening on chain at block 5"), ("fetch", f"{len(lab.opening())} bytes"),
               ("validate", None), ("losschecks", "ok"), ("replay", "matches leaf t"), ("witness", "value"),
               ("commit", "commit in block 7")]
    with engine.begin() as conn:
        conn.execute(
            runs.insert().values(
                run_id=run_id,
                miner="miner",
                spec_digest=lab.spec.digest(),
                mode="value",
                declared_steps=lab.spec.steps,
                endpoint=lab.prover.endpoint,
                initial_hash=lab.honest.initial_hash,
                schedule_commitment=lab.honest.schedule.commitment,
                dataset_hash=lab.dataset.dataset_hash,
                registered_block=1,
                slashed=0,
            )
        )
        conn.execute(
            challenges.insert().values(
                **common, **row, value_hash=value, proof_hash=proof, norm_bucket=bucket
            )
        )
        t = now - 90
        for stage, detail in log:
            conn.execute(
                stage_log.insert().values(
                    challenge_id=cid, stage=stage, started_at=t, finished_at=t + 2, detail=detail
                )
            )
            t += 2
        conn.execute(
            witnesses.insert().values(
                challenge_id=cid,
                verifier="verifier",
                salt=bytes(16),
                value_hash=value,
                norm_bucket=bucket,
                commitment=bytes([6]) * 32,
                created_at=t,
            )
        )
        conn.execute(
            txs.insert().values(
                challenge_id=cid,
                verifier="verifier",
                kind="commit",
                origin="verifier",
                payload=b"c",
                state="confirmed",
                block=7,
                sends=3 if refused else 1,
                created_at=t,
                updated_at=t,
            )
        )
        conn.execute(
            txs.insert().values(
                challenge_id=cid,
                verifier="verifier",
                kind="reveal",
                origin="verifier",
                payload=b"r",
                state="unconfirmed",
                sends=1,
                created_at=t,
                updated_at=t,
                last_error="timed out" if refused else None,
            )
        )
    return engine


def _get_routes(app: Any, run_id: str) -> list[str]:
    """Every GET of the app that takes no argument or a challenge/run id (schema routes, with each
    value of their enumerated query parameters, and the dashboard's pages)."""
    urls = []
    for path, ops in app.openapi()["paths"].items():
        op = ops.get("get")
        if op is None or {p["name"] for p in op.get("parameters", []) if p["in"] == "path"} - {
            "challenge_id",
            "run_id",
        }:
            continue
        url = path.replace("{run_id}", run_id)
        urls.append(url)
        for p in op.get("parameters", []):
            schema = p.get("schema", {})
            for alt in (schema, *schema.get("anyOf", [])):
                urls += [f"{url}?{p['name']}={v}" for v in alt.get("enum", [])] if p["in"] == "query" else []
    for route in app.routes:
        if (isinstance(route, APIRoute) and not route.include_in_schema and "GET" in route.methods
                and not set(route.param_convertors) - {"challenge_id", "run_id"}):
            urls.append(route.path.replace("{run_id}", run_id))
    return urls


def _normal(text: str, cid: bytes) -> str:
    for n in (64, 24, 20, 16, 12):
        text = text.replace(cid.hex()[:n], "<id>")
    try:
        doc = json.loads(text)
    except ValueError:
        return "\n".join(ln for ln in text.splitlines() if not _CLOCK_LINES.match(ln))

    def mask(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: "<clock>" if k in _CLOCK_KEYS else mask(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mask(x) for x in v]
        return _CLOCK_TEXT.sub("<clock>", v) if isinstance(v, str) else v
    return json.dumps(mask(doc), sort_keys=True)


@probe(
    "sealed-refused-looks-replayed",
    "a hostile API request",
    "show a refused and a replayed challenge identically in every route, page and metric before the reveal",
)
def _refused_vs_replayed(lab: Lab) -> tuple[bool, str, str]:
    now = time.time()
    ids = {"refused": bytes([0xE1]) * 32, "replayed": bytes([0xE2]) * 32}
    views: dict[str, dict[str, str]] = {}
    urls: list[str] = []
    for name, cid in ids.items():
        engine = _sealed_node(lab, name, cid, refused=name == "refused", now=now)
        try:
            with TestClient(create_app(engine, NodeConfig()), base_url="http://127.0.0.1:8700") as client:
                urls = urls or _get_routes(client.app, lab.honest.run_id.hex())
                out = {}
                for url in urls:
                    resp = client.get(url.replace("{challenge_id}", cid.hex()))
                    out[url] = f"{resp.status_code} {_normal(resp.text, cid)}"
                views[name] = out
        finally:
            engine.dispose()
    differ = [u for u in urls if views["refused"][u] != views["replayed"][u]]
    if differ:
        return False, "api", f"{len(differ)} of {len(urls)} views tell the refusal: {', '.join(differ[:4])}"
    return True, "api", f"{len(urls)} routes, pages and /metrics are identical up to the ids until the reveal"


@probe("range-5000-digits", "a hostile API request",
       "answer a Range header of 5,000 digits with a 416 or the whole opening, never a server error")
def _range_digits(lab: Lab) -> tuple[bool, str, str]:
    data = lab.opening()
    digest = load_opening(data).digest.hex()
    run = lab.dir / "hostile" / "prover-range"
    (run / "openings").mkdir(parents=True, exist_ok=True)
    (run / "openings" / f"{digest}.opening").write_bytes(data)
    bad = []
    with TestClient(prover_app(run)) as client:
        for header in ("bytes=" + "9" * 5000 + "-", "bytes=0-" + "9" * 5000, "bytes=-" + "9" * 5000):
            resp = client.get(f"/openings/{digest}", headers={"Range": header})
            if resp.status_code >= 500:
                bad.append(f"{header[:12]}... got HTTP {resp.status_code}")
    if bad:
        return False, "api", "; ".join(bad)
    return True, "api", "the prover answers 5,000-digit ranges without a server error"


@probe(
    "hostile-config-file",
    "a hostile API request",
    "refuse an unreadable config file (invalid UTF-8, deep nesting, a huge integer) with a config error "
    "naming it",
)
def _hostile_config(lab: Lab) -> tuple[bool, str, str]:
    folder = lab.dir / "hostile" / "config"
    folder.mkdir(parents=True, exist_ok=True)
    cases = {"invalid-utf8": b'[node]\ndata_dir = "\xff\xfe"\n',
             "deep-nesting": b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
             "huge-integer": b"[replay]\nworkers = 1" + b"0" * 5000 + b"\n"}
    bad = []
    for name, data in cases.items():
        path = folder / f"{name}.toml"
        problem = config_refusal(path, data, str(path))
        if problem is not None:
            bad.append(f"{name}: {problem}")
    if bad:
        return False, "api", "; ".join(bad)
    return True, "api", "each hostile config file is a ConfigError naming the file"
