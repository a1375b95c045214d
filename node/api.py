"""The node's HTTP API: health and readiness, status, runs, challenges with their timelines,
Prometheus metrics and the dashboard. Read-only, except admin routes behind a bearer token.

`create_app(db, config)` builds the app over a database URL or engine; `start_api_server` serves it
from a thread of the daemon on the configured `http.listen` address.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import and_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from node import queries as Q
from node.config import NodeConfig, normalize_host
from node.db import challenges, current_revision, head_revision, open_database, stage_log, witness_conflicts
from node.logs import log_event
from node.stages import WORK_STAGES, Stage
from node.stake import stake_status
from node.status import NodeStatus, StatusSnapshot

log = logging.getLogger("node.api")

API_VERSION = "1"
ID_PATTERN = r"^(0x)?[0-9a-fA-F]{64}$"

EXAMPLE_ID = "5f3c" + "0" * 56 + "a1b2"
EXAMPLE_RUN = "42" * 32


# --- response models (the OpenAPI schema, with examples) ---------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ErrorOut(_Model):
    detail: str = Field(description="What was wrong and how to fix it.",
                        examples=["no run 42424242... in this node's database"])


class HealthOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": "ok", "uptime_s": 812.4}]})
    status: Literal["ok"]
    uptime_s: float


class CheckOut(_Model):
    ok: bool
    detail: str
    data: dict[str, float | int | str | bool | None] = Field(default_factory=dict)


class ReadyOut(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "ready": True,
                    "checks": {
                        "database": {
                            "ok": True,
                            "detail": "reachable, schema at revision 0001",
                            "data": {"latency_s": 0.002},
                        },
                        "chain_head": {
                            "ok": True,
                            "detail": "cursor at block 118, applied 0.4 s ago",
                            "data": {"block": 118, "age_s": 0.4, "max_age_s": 60.0},
                        },
                        "worker_pool": {
                            "ok": True,
                            "detail": "1 replay worker(s), 0 busy",
                            "data": {"workers": 1, "busy": 0},
                        },
                        "determinism": {
                            "ok": True,
                            "detail": "no witness conflicts: every recomputed witness equalled "
                            "the journaled one",
                            "data": {"conflicts": 0, "unacknowledged": 0},
                        },
                    },
                }
            ]
        }
    )
    ready: bool
    checks: dict[str, CheckOut]


class VerdictCounts(_Model):
    honest: int = 0
    fraud: int = 0
    inconclusive: int = 0
    pending: int = 0


class AgreementOut(_Model):
    agreed: int = Field(description="Challenges where this node's reveal was in the winning cluster.")
    disagreed: int = Field(description="Challenges where it revealed but was outside the winning cluster.")
    outliers: int
    ratio: float | None = Field(description="agreed / (agreed + disagreed); null before any such challenge.")


class CursorOut(_Model):
    block: int | None
    updated_at: float | None
    age_s: float | None


class UnbondingOut(_Model):
    amount: int
    release_block: int = Field(description="The block from which the amount is released.")


class PenaltyOut(_Model):
    block: int
    challenge_id: str | None
    amount: int = Field(description="What the chain took from this node's bond.")
    why: str | None = Field(description="no_commit, no_reveal or outlier.")


class PaymentOut(_Model):
    block: int
    challenge_id: str | None
    amount: int = Field(description="What the chain credited to this node's bond.")
    why: str | None = Field(description="seat_fee, slash_share or dispute_pool.")


class PendingBondOut(_Model):
    amount: int
    sent_block: int = Field(description="The finalized head when the bond call was sent.")
    tx_hash: str | None
    error: str | None


_STAKE_EXAMPLE: dict[str, Any] = {
    "account": "v1", "block": 118, "bond": 62, "target": 100, "verifier_stake": 100, "eligible": False,
    "reserved": 0, "free": 62,
    "unbonding": [{"amount": 50, "release_block": 150}], "unbonding_total": 50, "penalised_total": 50,
    "bonded_total": 150, "released_total": 0,
    "penalties": [{"block": 46, "challenge_id": EXAMPLE_ID, "amount": 50, "why": "outlier"}],
    "paid_total": 12, "paid_by_why": {"seat_fee": 12, "slash_share": 0, "dispute_pool": 0},
    "payments": [{"block": 40, "challenge_id": EXAMPLE_ID, "amount": 12, "why": "seat_fee"}],
    "escalation_stake": 500, "escalated_total": 0, "forfeited_total": 0,
    "pending_bond": None}


class StakeOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [_STAKE_EXAMPLE]})
    account: str | None
    block: int | None = Field(description="The block of the chain state these figures are from.")
    bond: int | None = Field(
        description="The active bond, reserved part included; null before the node started once."
    )
    target: int | None = Field(description="The bond the node keeps ([verifier] bond); 0: it never bonds.")
    verifier_stake: int | None = Field(description="What one committee seat reserves of the free bond.")
    eligible: bool | None = Field(
        description="free >= verifier_stake: the account can be drawn onto committees."
    )
    reserved: int | None = Field(
        description="What the account's seats and escalations of open rounds reserve."
    )
    free: int | None = Field(
        description="bond - reserved: what new seats, escalations and unbonding may take."
    )
    unbonding: list[UnbondingOut]
    unbonding_total: int
    penalised_total: int = Field(description="Every penalty this node's database recorded for the account.")
    bonded_total: int
    released_total: int
    penalties: list[PenaltyOut] = Field(description="The latest penalties, newest first.")
    paid_total: int = Field(
        description="Every fee and share the chain credited to the account (VerifierPaid)."
    )
    paid_by_why: dict[str, int] = Field(description="paid_total by why: seat_fee, slash_share, dispute_pool.")
    payments: list[PaymentOut] = Field(description="The latest payments, newest first.")
    escalation_stake: int | None = Field(description="What one escalation reserves of the free bond.")
    escalated_total: int = Field(description="The stakes of every escalation this node made.")
    forfeited_total: int = Field(
        description="The escalation stakes the dispute round took (it proved the node wrong)."
    )
    pending_bond: PendingBondOut | None = Field(description="A bond call sent and not yet on chain.")


class StatusOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "api_version": "1", "account": "v1", "chain": "dev:///pot-chain.db", "database": "sqlite",
        "schema_revision": "0001", "cursor": {"block": 118, "updated_at": 1764410000.0, "age_s": 0.4},
        "runs": 2, "challenges_by_stage": {"done": 2, "replay": 1},
        "challenges_by_status": {"honest": 1, "fraud": 1, "inconclusive": 0, "pending": 1},
        "agreement": {"agreed": 2, "disagreed": 0, "outliers": 0, "ratio": 1.0}, "stake": _STAKE_EXAMPLE,
        "fingerprint": "3-2-1764410000.000000", "time": 1764410000.4}]})
    api_version: str
    account: str | None
    chain: str
    database: str
    schema_revision: str | None
    cursor: CursorOut
    runs: int
    challenges_by_stage: dict[str, int]
    challenges_by_status: VerdictCounts
    agreement: AgreementOut
    stake: StakeOut = Field(description="This node's verifier bond, unbonding amounts and penalties.")
    fingerprint: str = Field(
        description="Changes whenever a run or challenge changes (the dashboard polls it)."
    )
    time: float


class DetectionOut(_Model):
    fake_share: float = Field(description="Share f of the run's steps a miner faked.")
    probability: float = Field(description="1 - (1 - f)^k for the k distinct steps challenged so far.")


_RUN_EXAMPLE: dict[str, Any] = {
    "run_id": EXAMPLE_RUN,
    "miner": "miner",
    "mode": "value",
    "declared_steps": 8,
    "endpoint": "http://127.0.0.1:8800",
    "spec_digest": "ab" * 32,
    "registered_block": 3,
    "slashed": 0,
    "challenges": 1,
    "challenged_steps": 1,
    "verdicts": {"honest": 1, "fraud": 0, "inconclusive": 0, "pending": 0},
    "detection": [{"fake_share": 0.1, "probability": 0.1}, {"fake_share": 0.5, "probability": 0.5}],
}


class RunOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [_RUN_EXAMPLE]})
    run_id: str
    miner: str
    mode: str
    declared_steps: int
    endpoint: str
    spec_digest: str
    registered_block: int
    slashed: int
    challenges: int
    challenged_steps: int
    verdicts: VerdictCounts
    detection: list[DetectionOut]


_REFUSAL_EXAMPLES: list[dict[str, Any]] = [
    {
        "event": "RemarkIgnored",
        "block": 12,
        "position": 0,
        "origin": "miner",
        "reason": "bad_prefix",
        "message": "the payload nearly carries the pot1 prefix (its detail says how)",
        "detail": "the payload starts with b'ot1': its first byte (p, 0x70) was read as a SCALE length, so "
                  "only "
        "28 bytes of it went on chain; submit the remark as a 0x-hex string",
        "size": 28,
        "payload_digest": "cd" * 32,
    },
    {
        "event": "CallRefused",
        "block": 13,
        "origin": "miner",
        "call": "start_training_commitment",
        "refusal": "InvalidCall",
        "reason": "the spec is not in its canonical CBOR form: optimizer.grad_clip: a float "
        "must be encoded as a float (f93c00), got the integer 1",
    },
]


class RefusalOut(_Model):
    event: Literal["RemarkIgnored", "CallRefused"]
    block: int
    origin: str
    call: str | None = Field(None, description="CallRefused: the call's name.")
    refusal: str | None = Field(None, description="CallRefused: the refusal's code (docs/protocol.md).")
    reason: str = Field(description="CallRefused: why, in words; RemarkIgnored: the reason code.")
    position: int | None = Field(None, description="RemarkIgnored: the payload's place in its block.")
    message: str | None = Field(None, description="RemarkIgnored: the reason code's fixed message.")
    detail: str | None = Field(None, description="RemarkIgnored: what exactly is wrong (field, rule).")
    size: int | None = None
    payload_digest: str | None = None


class RefusalPage(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{"items": _REFUSAL_EXAMPLES,
                                                               "accounts": ["miner", "v1"]}]})
    items: list[RefusalOut]
    accounts: list[str] = Field(description="The accounts whose records are listed.")


class RunPage(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{"items": [_RUN_EXAMPLE], "total": 1,
                                                               "next_cursor": None}]})
    items: list[RunOut]
    total: int
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


_CHALLENGE_EXAMPLE: dict[str, Any] = {
    "challenge_id": EXAMPLE_ID, "run_id": EXAMPLE_RUN, "index": 0, "step": 7, "stage": "done",
    "status": "honest", "verdict": "honest", "verdict_reason": "the largest cluster equals H(leaf t)",
    "in_winning_cluster": True, "outlier": False, "refusal_class": None, "matches_leaf": True,
    "witness_disclosed": True, "issued_block": 9, "resolved_block": 40, "round": 1, "first_id": None,
    "rechallenge": None, "on_committee": True, "penalty": None, "penalty_why": None, "escalation": None,
    "note": None,
    "created_at": 1764410000.0, "updated_at": 1764410031.0}


class ChallengeOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [_CHALLENGE_EXAMPLE]})
    challenge_id: str
    run_id: str
    index: int
    step: int
    stage: str = Field(
        description="Where this node's job is: awaiting_opening ... done, or missed/skipped. Until "
        "witness_disclosed, a challenge this node sits on shows only awaiting_opening (no opening on "
        "chain), sealed, or reveal (this node's commit is on chain)."
    )
    status: Literal["honest", "fraud", "inconclusive", "pending"] = Field(
        description="The chain's verdict, or pending before resolution.")
    verdict: str | None
    verdict_reason: str | None
    in_winning_cluster: bool | None = Field(description="Null until witness_disclosed.")
    outlier: bool | None = Field(description="Null until witness_disclosed.")
    refusal_class: str | None = Field(description="Why this node refused the opening (it fixes the refused "
                                      "value); null until witness_disclosed.")
    matches_leaf: bool | None = Field(description="Whether this node's replay gave leaf t; null until "
                                      "witness_disclosed.")
    witness_disclosed: bool = Field(description=(
        "False until this node's reveal is confirmed on chain (every account it journaled a witness with) "
        "or the chain resolved the challenge. Until then a challenge this node sits on is sealed for every "
        "caller: only the chain's public facts about it are shown (ids, step, blocks, committee, the "
        "opening's announcement, the others' reveals); its stage states and times, sizes, sources, errors, "
        "check results and witness are null, and it counts by its shown stage only."))
    issued_block: int
    resolved_block: int | None
    round: int | None = Field(None, description="The challenge's round: 1, or a re-challenge's 2, 3, ...")
    first_id: str | None = Field(None, description="A re-challenge's first round's challenge id.")
    rechallenge: str | None = Field(
        None, description="The next round's challenge id, once this one re-challenged."
    )
    on_committee: bool | None = Field(None, description="Whether this node sits on the challenge's committee "
                                      "(a job it is not on is skipped).")
    penalty: int | None = Field(
        None, description="What the chain took from this node's bond for this challenge."
    )
    penalty_why: str | None = Field(None, description="no_commit, no_reveal or outlier.")
    escalation: str | None = Field(
        None,
        description=(
            "This node's escalation of the round to the dispute round (protocol v3): journaled, unaffordable "
            "(its "
            "free bond did not cover escalation_stake), missed (the escalation window closed first), "
            "escalated (on "
            "chain), returned or forfeited (how the dispute round settled its stake); null: none. Null until "
            "witness_disclosed."
        ),
    )
    note: str | None = Field(
        description="Why a job stopped or is waiting (a retry, a missed window, a re-challenge)."
    )
    created_at: float
    updated_at: float | None = Field(description="Null while sealed (when the job last moved tells how).")


class ChallengePage(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{"items": [_CHALLENGE_EXAMPLE], "total": 1,
                                                               "next_cursor": None}]})
    items: list[ChallengeOut]
    total: int
    next_cursor: str | None


class LossPoint(_Model):
    step: int
    loss: float | None = Field(description="The committed loss of the step; null if it was not finite.")


class LossCurveOut(_Model):
    losses: list[LossPoint]
    source_challenge: str | None = Field(description="The challenge whose fetched leaves gave the losses.")
    findings: list[dict[str, Any]]


class RunDetailOut(RunOut):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    **_RUN_EXAMPLE,
                    "initial_hash": "01" * 32,
                    "dataset_hash": "02" * 32,
                    "schedule_commitment": "03" * 32,
                    "loss_curve": {
                        "losses": [{"step": 1, "loss": 5.5}, {"step": 2, "loss": 5.1}],
                        "source_challenge": EXAMPLE_ID,
                        "findings": [],
                    },
                    "challenge_list": [_CHALLENGE_EXAMPLE],
                }
            ]
        }
    )
    initial_hash: str
    dataset_hash: str
    schedule_commitment: str
    loss_curve: LossCurveOut
    challenge_list: list[ChallengeOut]


class TimelineEntry(_Model):
    stage: str
    label: str = Field(examples=["opening fetched"])
    state: Literal["done", "running", "pending", "not reached", "sealed"] = Field(
        description="sealed (with no times and no detail) until witness_disclosed.")
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    detail: str | None


class ClusterOut(_Model):
    value: str = Field(description="The revealed value hash (value mode) or norm bucket (bucket mode).")
    proof: str | None = Field(
        None, description="Value mode: the pair's proof hash (the cluster is the whole pair)."
    )
    size: int
    verifiers: list[str]
    winning: bool
    matches_commitment: bool = Field(
        description="Equal to the miner's committed H(leaf t) or declared bucket."
    )
    includes_this_node: bool


class ChallengeDetailOut(ChallengeOut):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    **_CHALLENGE_EXAMPLE,
                    "mode": "value",
                    "root": "cd" * 32,
                    "size": 9,
                    "endpoint": "http://127.0.0.1:8800",
                    "deadlines": {"opening": 13, "commit": 31, "reveal": 39, "escalate": 41},
                    "committee": ["v1", "v2", "v3"],
                    "opening": {
                        "digest": "ef" * 32,
                        "uri": "http://127.0.0.1:8800/openings/ef",
                        "block": 11,
                        "bytes": 52311,
                        "leaf_hash": "aa" * 32,
                        "mirrors": ["http://mirror.example/openings/ef"],
                        "served_by": "http://127.0.0.1:8800/openings/ef",
                    },
                    "refusal_reason": None,
                    "loss_checks": {"steps": 8, "ok": True, "findings": []},
                    "replay": {
                        "matches_leaf": True,
                        "leaf": "bb" * 20,
                        "state_digest": "cc" * 32,
                        "loss_bits": 1085507584,
                        "proof_hash": "dd" * 32,
                    },
                    "witness": {
                        "value_hash": "aa" * 32,
                        "proof_hash": "dd" * 32,
                        "norm_bucket": 12,
                        "fault": None,
                    },
                    "winning_value": "aa" * 32,
                    "miner_slashed": None,
                    "timeline": [
                        {
                            "stage": "fetch",
                            "label": "opening fetched",
                            "state": "done",
                            "started_at": 1764410003.0,
                            "finished_at": 1764410003.2,
                            "duration_s": 0.2,
                            "detail": "52311 bytes",
                        }
                    ],
                    "clusters": [
                        {
                            "value": "aa" * 32,
                            "proof": "dd" * 32,
                            "size": 1,
                            "verifiers": ["v1"],
                            "winning": True,
                            "matches_commitment": True,
                            "includes_this_node": True,
                        }
                    ],
                    "committed_value": "aa" * 32,
                    "this_node": ["v1"],
                    "reveals": 1,
                    "quorum": {"cluster_size": 1, "reveals": 1, "outliers": []},
                    "txs": [
                        {
                            "kind": "commit",
                            "state": "confirmed",
                            "sends": 1,
                            "block": 20,
                            "tx_hash": None,
                            "last_error": None,
                        }
                    ],
                    "witness_conflicts": [],
                }
            ]
        }
    )
    mode: str
    root: str
    size: int
    endpoint: str
    deadlines: dict[str, int] = Field(
        description="The round's last blocks: opening, commit, reveal and (protocol "
        "v3) escalate; it resolves at the block after the last."
    )
    committee: list[str] = Field(
        description="The challenge's committee, in draw order (only its reveals count)."
    )
    opening: dict[str, Any] = Field(
        description="The opening on chain: digest, URI, mirrors, block, leaf hash; "
        "its size and the address that served it once fetched."
    )
    refusal_reason: str | None = Field(description="Null until witness_disclosed.")
    loss_checks: dict[str, Any] | None
    replay: dict[str, str | int | bool | None] = Field(
        description="The replay's leaf, state digest, loss bits and match; each null until witness_disclosed."
    )
    witness: dict[str, str | int | None] = Field(
        description="This node's witness pair (value hash, proof hash), "
        "norm bucket and test fault; each null until witness_disclosed."
    )
    winning_value: str | None
    miner_slashed: int | None
    timeline: list[TimelineEntry]
    clusters: list[ClusterOut]
    committed_value: str | None
    this_node: list[str] = Field(description="The account(s) this node witnessed this challenge with.")
    reveals: int
    quorum: dict[str, Any] | None
    txs: list[dict[str, Any]]
    witness_conflicts: list[WitnessConflictOut] = Field(
        description="Determinism alarms: later computations of this node's witness that gave another value.")


class ConflictValue(_Model):
    value_hash: str | None
    norm_bucket: int | None


class WitnessConflictOut(_Model):
    challenge_id: str
    verifier: str
    journaled: ConflictValue = Field(description="The witness in the journal: the only one this node sends.")
    recomputed: ConflictValue = Field(description="The different witness a later computation gave.")
    disclosed: bool = Field(
        description="False while the challenge's witness is sealed (both values null; the "
        "node's log has them, event witness_conflict)."
    )
    created_at: float
    acknowledged_at: float | None


class AcknowledgeOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "acknowledged": 1, "total": 1,
        "detail": "1 witness conflict(s) acknowledged; /readyz passes its determinism check again"}]})
    acknowledged: int = Field(description="Conflicts acknowledged by this call.")
    total: int = Field(description="Conflicts ever recorded (pot_witness_conflicts_total).")
    detail: str


class RetryOut(_Model):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "challenge_id": EXAMPLE_ID, "previous_stage": "missed", "stage": "replay",
        "detail": "re-queued at stage replay; the daemon picks it up on its next pass"}]})
    challenge_id: str
    previous_stage: str
    stage: str
    detail: str


# --- the app ----------------------------------------------------------------------------------


class ApiContext:
    """What the routes share: the engine, the config, the daemon's status (when the API runs in
    the daemon's process; node/status.py), the token."""

    def __init__(self, engine: Engine, config: NodeConfig, *, node: NodeStatus | None = None,
                 admin_token: str | None = None, owns_engine: bool = False) -> None:
        if node is not None and not isinstance(node, NodeStatus):
            raise TypeError(
                f"node must implement node.status.NodeStatus (a status() method), not {type(node).__name__}"
            )
        self.engine = engine
        self.config = config
        self.node = node
        self.admin_token = admin_token or None
        self.owns_engine = owns_engine
        self.started = time.monotonic()
        self.head_revision = head_revision()

    def status(self) -> StatusSnapshot | None:
        """The daemon's live facts now, or None when the API serves a database alone."""
        return self.node.status() if self.node is not None else None

    @property
    def account(self) -> str | None:
        live = self.status()
        if live is not None and live.account:
            return live.account
        return self.config.chain.account or None

    def backend(self) -> str:
        return self.engine.url.get_backend_name()


def read_admin_token(config: NodeConfig) -> str | None:
    """The admin token from `http.admin_token_file` (mode 600, like the secrets file); None if unset."""
    path = config.http.admin_token_file
    if not path:
        return None
    p = Path(path)
    try:
        token = p.read_text().strip()
        mode = p.stat().st_mode
    except OSError as exc:
        raise ValueError(f"http.admin_token_file {p} cannot be read: {exc}") from None
    if os.name == "posix" and mode & 0o077:
        raise ValueError(
            f"http.admin_token_file {p} is readable by others (mode {mode & 0o777:o}); run: chmod 600 {p}"
        )
    if len(token) < 16:
        raise ValueError(
            f"http.admin_token_file {p} holds a token of {len(token)} characters; use at least 16"
        )
    return token


def request_host(raw: str) -> str:
    """The host part of a Host header (`name`, `name:port`, `[v6]:port`), normalized as the
    configured names are; ValueError when it is not one."""
    if raw.startswith("["):
        end = raw.find("]")
        host, rest = (raw[:end + 1], raw[end + 1:]) if end > 0 else (raw, "")
    elif raw.count(":") == 1:
        host, rest = raw.split(":")[0], ":" + raw.split(":")[1]
    else:
        host, rest = raw, ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        raise ValueError("bad port")
    return normalize_host(host)


class HostCheck:
    """Answers only requests whose Host header names this node (`http.allowed_hosts`): a page on
    another site that rebinds its DNS name to this node's address still sends its own name, so it
    gets a 421 and never reads the API. A missing or malformed Host is a 400."""

    def __init__(self, app: Any, names: frozenset[str] | None) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.names is None:
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope.get("headers", ()) if k == b"host"), None)
        problem = None
        if raw is None or not raw.strip():
            problem = (
                400,
                "the request has no Host header; this node answers only requests naming it "
                "(http.allowed_hosts)",
            )
        else:
            text = raw.decode("latin-1")
            try:
                host = request_host(text.strip())
            except ValueError:
                problem = 400, f"the Host header {text[:100]!r} is not a host name with an optional port"
            else:
                if host not in self.names:
                    problem = (
                        421,
                        (
                            f"this node does not answer to the name {host[:100]!r} (Host header): ask for it "
                            f"by one of its names, or add this name to http.allowed_hosts. A foreign name is "
                            f"how a web page would reach a local API through DNS rebinding"
                        ),
                    )
        if problem is None:
            await self.app(scope, receive, send)
            return
        await JSONResponse({"detail": problem[1]}, status_code=problem[0])(scope, receive, send)


_bearer = HTTPBearer(auto_error=False, description="The admin token (http.admin_token_file).")


def _ctx(request: Request) -> ApiContext:
    return request.app.state.pot


def require_admin(request: Request,
                  creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """403 when no admin token is configured (whatever the request holds), else 401 without a
    bearer token and 403 with a wrong one."""
    ctx = _ctx(request)
    if ctx.admin_token is None:
        raise HTTPException(403, "admin routes are disabled on this node: set http.admin_token_file")
    if creds is None or creds.scheme.lower() != "bearer":
        raise HTTPException(401, "admin routes need an `Authorization: Bearer <token>` header",
                            headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(creds.credentials.encode(), ctx.admin_token.encode()):
        raise HTTPException(403, "the bearer token is not this node's admin token")


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "A parameter the API cannot use."},
    404: {"model": ErrorOut, "description": "No such object."},
    503: {"model": ErrorOut, "description": "The database is unreachable."},
}


def _not_found(what: str, ident: str) -> HTTPException:
    return HTTPException(404, f"no {what} {ident.removeprefix('0x').lower()} in this node's database")


def create_app(db: str | Engine, config: NodeConfig | None = None, *, node: NodeStatus | None = None,
               admin_token: str | None = None) -> FastAPI:
    """The API and dashboard over a node database (URL or engine). `node` is the running
    VerifierNode when served from the daemon (its worker pool shows in /readyz and /metrics);
    `admin_token` defaults to the one in `http.admin_token_file`."""
    from node import metrics
    from node.dashboard import mount_dashboard

    config = config or NodeConfig()
    owns = isinstance(db, str)
    engine = open_database(db) if isinstance(db, str) else db
    ctx = ApiContext(engine, config, node=node, admin_token=admin_token or read_admin_token(config),
                     owns_engine=owns)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        if ctx.owns_engine:
            ctx.engine.dispose()

    app = FastAPI(
        title="Proof-of-Training verifier node",
        version=API_VERSION,
        description="Status, runs and challenge outcomes of one verifier node. Read-only; admin routes need "
        "the node's bearer token. Ids are 64 hex digits. Lists are newest first and paginated with "
        "`limit` and `cursor` (the previous page's `next_cursor`: `<block>-<id>`, a keyset position).",
        lifespan=lifespan,
        docs_url=None,  # served by mount_api_docs from packaged assets, never a CDN
        redoc_url=None,
    )
    app.state.pot = ctx
    # Inside the metrics middleware: refused requests are counted (route "unmatched", 4xx).
    app.add_middleware(HostCheck, names=config.http.host_names())
    registry = metrics.install(app, ctx)

    @app.exception_handler(Q.BadQuery)
    async def _bad_query(_request: Request, exc: Q.BadQuery) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    async def _db_down(_request: Request, exc: Exception) -> JSONResponse:
        log_event(
            log, "api_database_error", level=logging.WARNING, error=f"{type(exc).__name__}: {exc}"[:500]
        )
        return JSONResponse({"detail": "the node database is unavailable; see /readyz"}, status_code=503)

    @app.get("/healthz", response_model=HealthOut, tags=["health"], summary="Liveness: the process answers.")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "uptime_s": time.monotonic() - ctx.started}

    @app.get("/readyz", response_model=ReadyOut, tags=["health"],
             summary="Readiness, with a per-check breakdown (database, chain head age, worker pool, "
                     "determinism).",
             responses={503: {"model": ReadyOut, "description": "At least one check failed."}})
    def readyz() -> JSONResponse:
        checks = readiness(ctx)
        ready = all(c["ok"] for c in checks.values())
        body = ReadyOut(ready=ready, checks=checks).model_dump()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics (pot_ prefix, base units).",
             response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"},
                                                         "example": "pot_challenges{stage=\"done\"} 2.0\n"}},
                              "description": "Prometheus text exposition format."}})
    def metrics_route() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/status", response_model=StatusOut, tags=["status"], responses=ERRORS,
             summary="The node at a glance: cursor, counts by stage and verdict, agreement.")
    def status() -> dict[str, Any]:
        return node_status(ctx)

    @app.get(
        "/api/v1/stake",
        response_model=StakeOut,
        tags=["status"],
        responses=ERRORS,
        summary="This node's verifier bond: active bond, unbonding amounts with release blocks, penalties.",
    )
    def get_stake() -> dict[str, Any]:
        with ctx.engine.connect() as conn:
            return stake_status(conn, ctx.account)

    @app.get("/api/v1/runs", response_model=RunPage, tags=["runs"], responses=ERRORS,
             summary="Runs this node knows, newest first, with detection probabilities.")
    def list_runs(
        miner: Annotated[
            str | None, Query(max_length=128, description="Only runs of this miner.", examples=["miner"])
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500, description="Page size.", examples=[50])] = 50,
        cursor: Annotated[
            str | None,
            Query(
                pattern=Q.CURSOR_PATTERN,
                description="next_cursor of the previous page.",
                examples=[f"44-{EXAMPLE_ID}"],
            ),
        ] = None,
    ) -> dict[str, Any]:
        with ctx.engine.connect() as conn:
            return Q.list_runs(conn, miner=miner, limit=limit, cursor=cursor)

    @app.get("/api/v1/runs/{run_id}", response_model=RunDetailOut, tags=["runs"], responses=ERRORS,
             summary="One run: its commitments, committed loss curve and challenges.")
    def get_run(run_id: Annotated[str, PathParam(pattern=ID_PATTERN, description="64 hex digits.",
                                                 examples=[EXAMPLE_RUN])]) -> dict[str, Any]:
        with ctx.engine.connect() as conn:
            out = Q.get_run(conn, Q.parse_id(run_id, "run id"))
        if out is None:
            raise _not_found("run", run_id)
        return out

    @app.get("/api/v1/refusals", response_model=RefusalPage, tags=["runs"], responses=ERRORS,
             summary="Payloads that were no call and refused calls, newest first: of `origin`, or by default "
                     "of this node's account and the miners of its runs.")
    def list_refusals(
        origin: Annotated[str | None, Query(min_length=1, max_length=128, description="Only this account's.",
                                            examples=["miner"])] = None,
        limit: Annotated[int, Query(ge=1, le=500, description="At most this many.", examples=[50])] = 50,
    ) -> dict[str, Any]:
        with ctx.engine.connect() as conn:
            return Q.list_refusals(conn, ctx.account, origin=origin, limit=limit)

    @app.get("/api/v1/challenges", response_model=ChallengePage, tags=["challenges"], responses=ERRORS,
             summary="Challenges, newest first; filter by outcome, run and stage.")
    def list_challenges(
        status: Annotated[
            Literal["honest", "fraud", "inconclusive", "pending"] | None,
            Query(description="The chain's verdict, or pending.", examples=["fraud"]),
        ] = None,
        run: Annotated[
            str | None,
            Query(pattern=ID_PATTERN, description="Only this run's challenges.", examples=[EXAMPLE_RUN]),
        ] = None,
        stage: Annotated[
            Literal[Q.SHOWN_STAGES] | None,  # type: ignore[valid-type]
            Query(description="Only jobs at this stage of this node.", examples=["done"]),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500, description="Page size.", examples=[50])] = 50,
        cursor: Annotated[
            str | None,
            Query(
                pattern=Q.CURSOR_PATTERN,
                description="next_cursor of the previous page.",
                examples=[f"44-{EXAMPLE_ID}"],
            ),
        ] = None,
    ) -> dict[str, Any]:
        run_id = None if run is None else Q.parse_id(run, "run")
        with ctx.engine.connect() as conn:
            return Q.list_challenges(conn, status=status, run=run_id, stage=stage, limit=limit, cursor=cursor)

    @app.get(
        "/api/v1/challenges/{challenge_id}",
        response_model=ChallengeDetailOut,
        tags=["challenges"],
        responses=ERRORS,
        summary="One challenge: its timeline with stage durations and the reveal clusters.",
    )
    def get_challenge(
        challenge_id: Annotated[
            str, PathParam(pattern=ID_PATTERN, description="64 hex digits.", examples=[EXAMPLE_ID])
        ],
    ) -> dict[str, Any]:
        with ctx.engine.connect() as conn:
            out = Q.get_challenge(conn, Q.parse_id(challenge_id, "challenge id"))
        if out is None:
            raise _not_found("challenge", challenge_id)
        return out

    @app.post(
        "/api/v1/admin/challenges/{challenge_id}/retry",
        response_model=RetryOut,
        tags=["admin"],
        dependencies=[Depends(require_admin)],
        responses={
            **ERRORS,
            401: {"model": ErrorOut, "description": "No bearer token."},
            403: {"model": ErrorOut, "description": "Wrong token, or admin routes disabled."},
            409: {"model": ErrorOut, "description": "The job cannot be re-queued now (why)."},
        },
        summary="Re-queue a job: retry its stage now, or resume a missed one while its commit window is "
                "open.",
    )
    def retry_challenge(
        challenge_id: Annotated[
            str, PathParam(pattern=ID_PATTERN, description="64 hex digits.", examples=[EXAMPLE_ID])
        ],
    ) -> dict[str, Any]:
        cid = Q.parse_id(challenge_id, "challenge id")
        out = requeue(ctx, cid)
        log_event(log, "admin_requeue", challenge_id=cid.hex(), previous_stage=out["previous_stage"],
                  stage=out["stage"])
        return out

    @app.post("/api/v1/admin/witness-conflicts/acknowledge", response_model=AcknowledgeOut, tags=["admin"],
              dependencies=[Depends(require_admin)],
              responses={**ERRORS, 401: {"model": ErrorOut, "description": "No bearer token."},
                         403: {"model": ErrorOut, "description": "Wrong token, or admin routes disabled."}},
              summary="Acknowledge the recorded witness conflicts once investigated; /readyz passes again.")
    def acknowledge_conflicts() -> dict[str, Any]:
        out = acknowledge(ctx)
        log_event(log, "admin_acknowledge_conflicts", level=logging.WARNING, acknowledged=out["acknowledged"],
                  total=out["total"])
        return out

    mount_dashboard(app, ctx)
    mount_api_docs(app)
    return app


DOCS_ASSETS = "/static-docs"


def docs_assets_dir() -> Path:
    """The Swagger UI and ReDoc files shipped by the fastapi-offline package (a dependency)."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).resolve().parent / "static"


def mount_api_docs(app: FastAPI) -> None:
    """`/docs` (Swagger UI) and `/redoc` over `/openapi.json`, their scripts, styles and icon
    served from the installed package under DOCS_ASSETS: the pages work with no outside network."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    assets = docs_assets_dir()
    if not (assets / "swagger-ui-bundle.js").is_file():
        raise RuntimeError(f"{assets}: the API docs assets are missing (reinstall fastapi-offline)")
    app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="static-docs")
    title = f"{app.title} - API"

    def root(request: Request) -> str:
        return request.scope.get("root_path", "").rstrip("/")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> Response:
        base = root(request)
        return get_swagger_ui_html(openapi_url=f"{base}{app.openapi_url}", title=title,
                                   swagger_js_url=f"{base}{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{base}{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{base}{DOCS_ASSETS}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> Response:
        base = root(request)
        return get_redoc_html(openapi_url=f"{base}{app.openapi_url}", title=title,
                              redoc_js_url=f"{base}{DOCS_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{base}{DOCS_ASSETS}/favicon.png", with_google_fonts=False)


# --- route bodies that need more than one query -----------------------------------------------


def node_status(ctx: ApiContext) -> dict[str, Any]:
    with ctx.engine.connect() as conn:
        return {
            "api_version": API_VERSION, "account": ctx.account, "chain": ctx.config.chain.url,
            "database": ctx.backend(), "schema_revision": current_revision_on(conn),
            "cursor": Q.cursor_state(conn), "runs": Q.run_count(conn),
            "challenges_by_stage": {k: v for k, v in Q.stage_counts(conn).items() if v},
            "challenges_by_status": Q.verdict_counts(conn), "agreement": Q.agreement(conn),
            "stake": stake_status(conn, ctx.account),
            "fingerprint": Q.fingerprint(conn), "time": time.time(),
        }


def current_revision_on(conn) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def readiness(ctx: ApiContext) -> dict[str, dict[str, Any]]:
    """Each check is ok or not with a reason; a failing check never raises out of here."""
    checks: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    try:
        rev = current_revision(ctx.engine)
        latency = time.perf_counter() - t0
        ok = rev == ctx.head_revision
        checks["database"] = {"ok": ok, "data": {"latency_s": round(latency, 6), "revision": rev},
                              "detail": f"reachable, schema at revision {rev}" if ok else
                              f"schema at revision {rev}, this node needs {ctx.head_revision}"}
    except Exception as exc:  # any driver error means "not ready", with its text as the reason
        checks["database"] = {
            "ok": False,
            "data": {},
            "detail": f"unreachable: {type(exc).__name__}: {exc}"[:500],
        }
        checks["chain_head"] = {"ok": False, "data": {}, "detail": "unknown: the database is unreachable"}
        checks["worker_pool"] = pool_check(ctx, None)
        checks["determinism"] = {"ok": False, "data": {}, "detail": "unknown: the database is unreachable"}
        return checks
    max_age = ctx.config.chain.watchdog_s
    try:
        with ctx.engine.connect() as conn:
            cur = Q.cursor_state(conn)
            stuck = Q.stuck_replays(conn, timeout_s=ctx.config.replay.timeout_s + 60)
            conflicts = Q.conflict_summary(conn, latest=1)
    except Exception as exc:  # a database without this node's tables (another revision, not initialised)
        why = f"unknown: the node's tables cannot be read: {type(exc).__name__}: {exc}"[:500]
        checks["chain_head"] = {"ok": False, "data": {}, "detail": why}
        checks["worker_pool"] = pool_check(ctx, None)
        checks["determinism"] = {"ok": False, "data": {}, "detail": why}
        return checks
    data: dict[str, Any] = {"block": cur["block"], "age_s": cur["age_s"], "max_age_s": max_age}
    live = ctx.status()
    if live is not None and live.head >= 0:
        data["finalized_head"] = live.head
    if cur["block"] is None and data.get("finalized_head") == 0:
        checks["chain_head"] = {"ok": True, "data": data, "detail": "the chain has no finalized block yet"}
    elif cur["block"] is None:
        checks["chain_head"] = {"ok": False, "data": data, "detail": "no block applied yet: the node has not "
                                "followed the chain"}
    else:
        ok = cur["age_s"] <= max_age
        checks["chain_head"] = {"ok": ok, "data": data, "detail": (
            f"cursor at block {cur['block']}, applied {cur['age_s']:.1f} s ago" if ok else
            f"cursor at block {cur['block']} was applied {cur['age_s']:.1f} s ago, more than {max_age:g} s "
            f"(chain.watchdog_s): the node is not following the chain")}
    checks["worker_pool"] = pool_check(ctx, stuck)
    checks["determinism"] = determinism_check(conflicts)
    return checks


def determinism_check(conflicts: dict[str, Any]) -> dict[str, Any]:
    """Fails while a witness conflict is unacknowledged: a node whose replay changed its answer is
    not a node to trust until someone has looked. The journaled witness was still the one sent."""
    data: dict[str, Any] = {"conflicts": conflicts["total"], "unacknowledged": conflicts["unacknowledged"]}
    if conflicts["unacknowledged"] == 0:
        detail = ("no witness conflicts: every recomputed witness equalled the journaled one"
                  if conflicts["total"] == 0 else
                  f"{conflicts['total']} witness conflict(s) recorded, all acknowledged")
        return {"ok": True, "data": data, "detail": detail}
    last = conflicts["latest"][0]
    data.update(latest_challenge_id=last["challenge_id"], latest_at=last["created_at"])
    if not last["disclosed"]:
        return {
            "ok": False,
            "data": data,
            "detail": (
                f"DETERMINISM FAILURE: {conflicts['unacknowledged']} unacknowledged witness conflict(s); the "
                "latest, "
                f"challenge {last['challenge_id']}, recomputed another value than the journaled one (both "
                "withheld "
                "until this node's reveal is on chain; the node's log has them, event witness_conflict). "
                "Only the "
                f"journaled value was sent. Find why the replay changed (docs/operator.md), then POST "
                f"/api/v1/admin/witness-conflicts/acknowledge"
            ),
        }
    return {"ok": False, "data": data, "detail": (
        f"DETERMINISM FAILURE: {conflicts['unacknowledged']} unacknowledged witness conflict(s); the latest, "
        f"challenge {last['challenge_id']}, journaled value {last['journaled']['value_hash']} bucket "
        f"{last['journaled']['norm_bucket']} but recomputed {last['recomputed']['value_hash']} bucket "
        f"{last['recomputed']['norm_bucket']}. Only the journaled value was sent. Find why the replay "
        f"changed (docs/operator.md), then POST /api/v1/admin/witness-conflicts/acknowledge")}


def pool_check(ctx: ApiContext, stuck: int | None) -> dict[str, Any]:
    data: dict[str, Any] = {"workers": ctx.config.replay.workers}
    problems = []
    if stuck:
        problems.append(f"{stuck} replay(s) running longer than replay.timeout_s")
    data["stuck_replays"] = stuck
    live = ctx.status()
    if live is None:
        detail = (f"{ctx.config.replay.workers} replay worker(s) configured; the pool runs in the daemon, "
                  f"judged here by its jobs")
    else:
        data.update(workers=live.workers, busy=live.busy, stopping=live.stopping)
        if live.stopping:
            problems.append("the daemon is stopping")
        detail = f"{live.workers} replay worker(s), {live.busy} busy"
    if problems:
        detail = "; ".join(problems)
    return {"ok": not problems, "detail": detail, "data": data}


def requeue(ctx: ApiContext, cid: bytes) -> dict[str, Any]:
    """Retry a job's stage now (clearing its backoff), or put a missed job back at the stage it
    missed in, as long as its commit window is still open. Conflicts are 409 with the reason."""
    now = time.time()
    with ctx.engine.begin() as conn:
        job = conn.execute(select(challenges).where(challenges.c.challenge_id == cid)).first()
        if job is None:
            raise _not_found("challenge", cid.hex())
        head = Q.cursor_state(conn, now=now)["block"]
        if job.stage in WORK_STAGES:
            if job.stage == Stage.REPLAY and job.status == "replaying":
                raise HTTPException(409, "a replay of this challenge is running; it cannot be re-queued now")
            target = job.stage
        elif job.stage == Stage.MISSED:
            last = conn.execute(select(stage_log.c.stage).where(stage_log.c.challenge_id == cid)
                                .order_by(stage_log.c.id.desc()).limit(1)).scalar()
            if last not in WORK_STAGES:
                raise HTTPException(409, f"it was missed at stage {last or 'unknown'}; only the work stages "
                                         f"({', '.join(WORK_STAGES)}) can be re-queued")
            if head is not None and head >= job.commit_deadline:
                raise HTTPException(409, f"its commit window closed at block {job.commit_deadline} "
                                         f"(the node is at block {head}); it can no longer be witnessed")
            target = last
        else:
            raise HTTPException(409, f"stage {job.stage} has no work to re-queue")
        done = conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid,
                                                          challenges.c.stage == job.stage,
                                                          challenges.c.updated_at == job.updated_at))
                            .values(stage=target, next_attempt_at=0.0, attempts=0, updated_at=now,
                                    status="re-queued by an operator")).rowcount
        if done != 1:
            raise HTTPException(409, "the job changed while it was being re-queued; try again")
    return {"challenge_id": cid.hex(), "previous_stage": job.stage, "stage": target,
            "detail": f"re-queued at stage {target}; the daemon picks it up on its next pass"}


def acknowledge(ctx: ApiContext) -> dict[str, Any]:
    """Mark every unacknowledged witness conflict as looked at; the rows and the counter stay."""
    with ctx.engine.begin() as conn:
        n = conn.execute(update(witness_conflicts).where(witness_conflicts.c.acknowledged_at.is_(None))
                         .values(acknowledged_at=time.time())).rowcount
        total = Q.conflict_summary(conn, latest=0)["total"]
    return {"acknowledged": n, "total": total,
            "detail": f"{n} witness conflict(s) acknowledged; /readyz passes its determinism check again"}


# --- serving from the daemon ------------------------------------------------------------------


class ApiServer:
    """uvicorn on a socket bound before the daemon starts (a busy port is a start-up error)."""

    def __init__(self, app: FastAPI, sock: socket.socket) -> None:
        import uvicorn

        self.sock = sock
        self.server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="pot-http")

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def start(self) -> ApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {listen} (http.listen): {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def start_api_server(config: NodeConfig, engine: Engine, *, node: NodeStatus | None = None) -> ApiServer:
    """Serve the API and dashboard on `http.listen` from a background thread of this process."""
    app = create_app(engine, config, node=node)
    server = ApiServer(app, bind(config.http.listen)).start()
    host, port = server.address
    log_event(log, "http_listening", listen=f"{host}:{port}", admin=app.state.pot.admin_token is not None)
    return server


__all__ = ["ApiServer", "HostCheck", "create_app", "read_admin_token", "request_host", "start_api_server"]
