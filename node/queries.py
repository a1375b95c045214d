"""Read-side views of the node database shared by the HTTP API, the dashboard and the metrics.

Queries take a Connection and return plain JSON-ready dicts; the deciding bits (timelines,
clusters, detection probability, pagination cursors) are pure functions tested on their own.
Until this node's reveal of a challenge it sits on is on chain, the challenge is sealed here: every
view of it passes through `seal_challenge`, which keeps only the chain's public facts about it (an
allowlist, so a new field is sealed by default) and blanks everything this node did with it (stage,
timeline, sizes, sources, errors, checks, the witness). Counts and sums over challenges (stages,
durations, transactions, the loss curve, the fingerprint) leave sealed challenges' private parts out
the same way, through `sealed_clause`. `tests/node/test_sealing.py` compares every view of a refused
and a replayed challenge before the reveal.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, case, exists, func, literal, or_, select, true
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from node.db import chain_cursor, chain_events, challenges, runs, stage_log, txs, witness_conflicts, witnesses
from node.stages import RESOLUTION, STAGES, STOPPED, Stage

VERDICTS = ("honest", "fraud", "inconclusive")
STATUSES = (*VERDICTS, "pending")  # the outcome filter: a chain verdict, or none yet
# Shares of faked steps the detection table is shown for.
FAKE_SHARES = (0.01, 0.05, 0.1, 0.25, 0.5)

# The timeline, in order: (stage_log stage, label). The seven milestones of a challenge plus the
# two node-internal stages (loss checks, witness journaling) that sit between them.
TIMELINE = (
    (Stage.AWAITING_OPENING, "issued"),
    (Stage.FETCH, "opening fetched"),
    (Stage.VALIDATE, "validated"),
    (Stage.LOSSCHECKS, "loss checks"),
    (Stage.REPLAY, "replayed"),
    (Stage.WITNESS, "witness journaled"),
    (Stage.COMMIT, "committed"),
    (Stage.REVEAL, "revealed"),
    (RESOLUTION, "resolved"),
)


SEALED = "withheld until this node's reveal is on chain"
# The stage a sealed challenge shows once its opening is on chain and before this node's commit is:
# the stage the job is really at would tell whether the opening was refused (a refused opening skips
# the replay). Before the opening, awaiting_opening; after this node's commit is on chain, reveal.
SEALED_STAGE = "sealed"
# The stages a view shows (and filters and counts by): the job stages and the sealed one.
SHOWN_STAGES: tuple[str, ...] = (*STAGES, SEALED_STAGE)


class BadQuery(ValueError):
    """A request parameter the API cannot use (bad id, foreign cursor), with the reason."""


# --- pure helpers -----------------------------------------------------------------------------


def parse_id(value: str, what: str) -> bytes:
    """A 32-byte id from 64 hex digits (an optional 0x prefix is accepted)."""
    raw = value.removeprefix("0x")
    if len(raw) != 64:
        raise BadQuery(f"{what} must be 64 hex digits, got {len(raw)} characters")
    try:
        return bytes.fromhex(raw)
    except ValueError:
        raise BadQuery(f"{what} must be 64 hex digits, got {value!r}") from None


CURSOR_PATTERN = r"^[0-9]{1,15}-[0-9a-f]{64}$"


def encode_cursor(block: int, key: bytes) -> str:
    """A keyset position: the (block, id) of the last row of a page. Any such pair is a valid
    position, so a cursor can be written by hand as well as taken from next_cursor."""
    return f"{block}-{key.hex()}"


def decode_cursor(cursor: str) -> tuple[int, bytes]:
    if re.fullmatch(CURSOR_PATTERN, cursor) is None:
        raise BadQuery("cursor must be <block>-<64 hex digits>, as in next_cursor of the previous page")
    block_s, key_s = cursor.split("-")
    return int(block_s), bytes.fromhex(key_s)


def detection_probability(f: float, k: int) -> float:
    """Chance that k independent uniformly drawn steps hit at least one of a share f of faked steps."""
    if not 0.0 <= f <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= f <= 1 and k >= 0, got f={f}, k={k}")
    return 1.0 - (1.0 - f) ** k


def finite_or_none(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


def build_timeline(stage_rows: Sequence[dict[str, Any]], *, current_stage: str, current_since: float,
                   now: float) -> list[dict[str, Any]]:
    """One entry per timeline stage: done (with duration), running (duration so far) or pending.

    `stage_rows` are stage_log rows (stage, started_at, finished_at, detail) in insertion order; a
    stage logged twice keeps its last row. A job that stopped (missed, skipped, or resolved on chain
    before it finished) shows the stages it never reached as "not reached".
    """
    logged = {r["stage"]: r for r in stage_rows}
    # A job that stopped, or that the chain resolved first, never reaches its remaining stages.
    stopped = current_stage in STOPPED
    out = []
    for stage, label in TIMELINE:
        r = logged.get(stage)
        entry: dict[str, Any] = {"stage": str(stage), "label": label, "state": "pending", "started_at": None,
                                 "finished_at": None, "duration_s": None, "detail": None}
        if r is not None:
            end = r["finished_at"]
            entry.update(started_at=r["started_at"], finished_at=end, detail=r["detail"],
                         state="done" if end is not None else "running",
                         duration_s=max(0.0, (end if end is not None else now) - r["started_at"]))
        elif stage == current_stage or (stage == RESOLUTION and current_stage == Stage.REVEALED):
            entry.update(state="running", started_at=current_since, duration_s=max(0.0, now - current_since))
        elif stopped:
            entry["state"] = "not reached"
        out.append(entry)
    return out


def reveal_clusters(
    reveals: Iterable[dict[str, Any]],
    *,
    mode: str,
    winning: str | None,
    own: set[str],
    expected: str | None,
    outliers: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Group revealed witnesses into clusters, largest first, marking the winner, the miner's
    committed value and this node's members. Exact (value-mode) runs cluster by the whole pair
    (value hash, proof hash), as the verdict does: a reveal of the public H(leaf t) with a wrong
    proof is a cluster of its own, equal to the commitment in its value half and never the
    winner (its members are the resolution's `outliers`). Bucket-mode runs cluster by bucket."""
    groups: dict[tuple[str, str | None], list[str]] = {}
    for r in reveals:
        key = (r["value_hash"], r.get("proof_hash")) if mode == "value" else (str(r["norm_bucket"]), None)
        groups.setdefault(key, []).append(r["verifier"])
    out_set = set(outliers)
    out = [{"value": value, "proof": proof, "size": len(members), "verifiers": sorted(members),
            "winning": winning is not None and value == winning and not (out_set & set(members)),
            "matches_commitment": expected is not None and value == expected,
            "includes_this_node": bool(own & set(members))}
           for (value, proof), members in groups.items()]
    out.sort(key=lambda c: (-c["size"], c["value"], c["proof"] or ""))
    return out


# --- row shapes -------------------------------------------------------------------------------


def _hex(b: Any) -> str | None:
    return None if b is None else bytes(b).hex()


def _json_list(text: str | None) -> list[Any]:
    """A JSON list column (committee, mirrors); [] when unset or unreadable."""
    if not text:
        return []
    try:
        v = json.loads(text)
    except ValueError:
        return []
    return v if isinstance(v, list) else []


# --- disclosure and the sealed view ------------------------------------------------------------


def _confirmed(kind: str, verifier: Any = None) -> ColumnElement[bool]:
    """A confirmed `kind` tx of the challenge row in the enclosing query (of `verifier`, if given)."""
    t = txs.alias()
    conds = [t.c.challenge_id == challenges.c.challenge_id, t.c.kind == kind, t.c.state == "confirmed"]
    if verifier is not None:
        conds.append(t.c.verifier == verifier)
    return exists().where(*conds)


def disclosed_clause() -> ColumnElement[bool]:
    """The challenge row's witness may be shown: the chain resolved it (no commit or reveal can
    follow), or every account that journaled a witness for it has a confirmed reveal tx (the value
    is on chain) and there is at least one."""
    w = witnesses.alias()
    unrevealed = exists().where(
        w.c.challenge_id == challenges.c.challenge_id, ~_confirmed("reveal", w.c.verifier)
    )
    return or_(challenges.c.resolved_block.is_not(None), and_(_confirmed("reveal"), ~unrevealed))


def sealed_clause() -> ColumnElement[bool]:
    """The challenge row is sealed: this node sits on it (its committee has this node's account, an
    older row does not say, or the node journaled a witness for it) and it is not disclosed."""
    w = witnesses.alias()
    seated = or_(challenges.c.on_committee.is_not(False), challenges.c.on_committee.is_(None),
                 exists().where(w.c.challenge_id == challenges.c.challenge_id))
    return and_(seated, ~disclosed_clause())


def shown_stage() -> ColumnElement[str]:
    """The stage a view shows: the job's own unless sealed; a sealed one shows only what the chain
    says (no opening yet; this node's commit on chain) and SEALED_STAGE in between."""
    return case(
        (
            sealed_clause(),
            case(
                (challenges.c.opening_block.is_(None), literal(str(Stage.AWAITING_OPENING))),
                (_confirmed("commit"), literal(str(Stage.REVEAL))),
                else_=literal(SEALED_STAGE),
            ),
        ),
        else_=challenges.c.stage,
    )


def _challenge_rows(where: Any = true()):
    """select() of challenges with the view columns: view_disclosed, view_sealed, view_stage."""
    return select(
        challenges,
        disclosed_clause().label("view_disclosed"),
        sealed_clause().label("view_sealed"),
        shown_stage().label("view_stage"),
    ).where(where)


def disclosed_ids(conn: Connection, ids: Iterable[bytes]) -> set[bytes]:
    """The challenges among `ids` whose witness this node may show (`disclosed_clause`). Anything
    else is withheld, whoever asks."""
    wanted = list({bytes(i) for i in ids})
    out: set[bytes] = set()
    for k in range(0, len(wanted), 500):  # bounded IN lists
        chunk = wanted[k:k + 500]
        out |= {bytes(c) for (c,) in conn.execute(select(challenges.c.challenge_id).where(
            challenges.c.challenge_id.in_(chunk), disclosed_clause()))}
    return out


# What a sealed challenge shows: the chain's own facts about it (issuance, committee, the opening's
# announcement, the others' reveals, a resolution), never what this node did with it. A key not
# named here is sealed: None (a list: empty; one of the always-present FIXED_SHAPE dicts: its keys
# with None), so that neither a value nor whether there is one shows.
PUBLIC_FIELDS = frozenset(
    {
        "challenge_id",
        "run_id",
        "index",
        "step",
        "status",
        "verdict",
        "verdict_reason",
        "witness_disclosed",
        "issued_block",
        "resolved_block",
        "round",
        "first_id",
        "rechallenge",
        "on_committee",
        "penalty",
        "penalty_why",
        "created_at",
        "mode",
        "root",
        "size",
        "endpoint",
        "deadlines",
        "committee",
        "winning_value",
        "miner_slashed",
        "clusters",
        "committed_value",
        "reveals",
        "quorum",
    }
)
PUBLIC_OPENING = frozenset({"digest", "uri", "block", "leaf_hash", "mirrors"})  # the OpeningSubmitted event
PUBLIC_TX = frozenset({"kind", "state", "block", "tx_hash"})  # of a tx confirmed on chain only
PUBLIC_TIMELINE = frozenset({"stage", "label"})
FIXED_SHAPE = frozenset({"replay", "witness"})


def _blank(key: str, value: Any) -> Any:
    if key in FIXED_SHAPE and isinstance(value, dict):
        return {k: None for k in value}
    return [] if isinstance(value, list) else None


def _only(entry: dict[str, Any], public: frozenset[str], **fixed: Any) -> dict[str, Any]:
    return {k: (v if k in public else fixed.get(k)) for k, v in entry.items()}


def seal_challenge(view: dict[str, Any], *, sealed: bool, stage: str) -> dict[str, Any]:
    """The one gate of every challenge view (list item, detail, run page, dashboard): a sealed
    challenge keeps only PUBLIC_FIELDS, its `stage` becomes the shown stage, and everything else
    (stage states and times, sizes, sources, errors, checks, the witness, a key added later) is
    blanked. An unsealed one is returned as it is."""
    if not sealed:
        return view
    out = {k: (v if k in PUBLIC_FIELDS else _blank(k, v)) for k, v in view.items()}
    out["stage"] = stage
    if "opening" in view:
        out["opening"] = _only(view["opening"], PUBLIC_OPENING)
    if "timeline" in view:
        out["timeline"] = [_only(e, PUBLIC_TIMELINE, state="sealed") for e in view["timeline"]]
    if "txs" in view:
        out["txs"] = [_only(t, PUBLIC_TX) for t in view["txs"] if t.get("state") == "confirmed"]
    return out


def challenge_summary(row: Any) -> dict[str, Any]:
    """One challenge row of `_challenge_rows`, through `seal_challenge`."""
    disclosed = bool(row.view_disclosed)
    withheld = (lambda v: v) if disclosed else (lambda _v: None)  # a job of a committee it is not on
    return seal_challenge(
        {
            "challenge_id": _hex(row.challenge_id),
            "run_id": _hex(row.run_id),
            "index": row.idx,
            "step": row.step,
            "stage": row.stage,
            "status": row.verdict or "pending",
            "verdict": row.verdict,
            "verdict_reason": row.verdict_reason,
            "in_winning_cluster": withheld(row.in_winning_cluster),
            "outlier": withheld(row.outlier),
            "refusal_class": withheld(row.refusal_class),
            "matches_leaf": withheld(row.matches_leaf),
            "witness_disclosed": disclosed,
            "issued_block": row.issued_block,
            "resolved_block": row.resolved_block,
            "round": row.round,
            "first_id": _hex(row.first_id),
            "rechallenge": _hex(row.rechallenge),
            "on_committee": row.on_committee,
            "penalty": row.penalty,
            "penalty_why": row.penalty_why,
            "escalation": withheld(row.escalation),
            "note": row.status,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        },
        sealed=bool(row.view_sealed),
        stage=row.view_stage,
    )


def _verdict_counts(rows: Iterable[Any]) -> dict[str, int]:
    counts = {s: 0 for s in STATUSES}
    for verdict, n in rows:
        counts[verdict or "pending"] = counts.get(verdict or "pending", 0) + int(n)
    return counts


def _run_summary(row: Any, challenge_rows: Sequence[Any]) -> dict[str, Any]:
    counts = _verdict_counts((c.verdict, 1) for c in challenge_rows)
    k = len({c.step for c in challenge_rows})
    return {
        "run_id": _hex(row.run_id),
        "miner": row.miner,
        "mode": row.mode,
        "declared_steps": row.declared_steps,
        "endpoint": row.endpoint,
        "spec_digest": _hex(row.spec_digest),
        "registered_block": row.registered_block,
        "slashed": row.slashed,
        "challenges": len(challenge_rows),
        "challenged_steps": k,
        "verdicts": counts,
        "detection": [{"fake_share": f, "probability": detection_probability(f, k)} for f in FAKE_SHARES],
    }


# --- queries ----------------------------------------------------------------------------------


def list_challenges(conn: Connection, *, status: str | None = None, run: bytes | None = None,
                    stage: str | None = None, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
    """Newest first (by issuing block, then id), keyset-paginated: stable while rows are added."""
    conds = []
    if status == "pending":
        conds.append(challenges.c.verdict.is_(None))
    elif status is not None:
        conds.append(challenges.c.verdict == status)
    if run is not None:
        conds.append(challenges.c.run_id == run)
    if stage is not None:  # the shown stage: a sealed job is not found by the stage it is really at
        conds.append(shown_stage() == stage)
    total = conn.execute(
        select(func.count()).select_from(challenges).where(and_(true(), *conds))
    ).scalar_one()
    page_conds = list(conds)
    if cursor is not None:
        block, key = decode_cursor(cursor)
        page_conds.append(or_(challenges.c.issued_block < block,
                              and_(challenges.c.issued_block == block, challenges.c.challenge_id < key)))
    rows = conn.execute(_challenge_rows(and_(true(), *page_conds))
                        .order_by(challenges.c.issued_block.desc(), challenges.c.challenge_id.desc())
                        .limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = encode_cursor(rows[-1].issued_block, bytes(rows[-1].challenge_id)) if more else None
    return {"items": [challenge_summary(r) for r in rows], "total": total, "next_cursor": nxt}


def list_runs(conn: Connection, *, miner: str | None = None, limit: int = 50,
              cursor: str | None = None) -> dict[str, Any]:
    conds = [] if miner is None else [runs.c.miner == miner]
    total = conn.execute(select(func.count()).select_from(runs).where(and_(true(), *conds))).scalar_one()
    page_conds = list(conds)
    if cursor is not None:
        block, key = decode_cursor(cursor)
        page_conds.append(or_(runs.c.registered_block < block,
                              and_(runs.c.registered_block == block, runs.c.run_id < key)))
    rows = conn.execute(
        select(runs)
        .where(and_(true(), *page_conds))
        .order_by(runs.c.registered_block.desc(), runs.c.run_id.desc())
        .limit(limit + 1)
    ).all()
    more = len(rows) > limit
    rows = rows[:limit]
    by_run: dict[bytes, list[Any]] = {bytes(r.run_id): [] for r in rows}
    if by_run:
        for c in conn.execute(select(challenges.c.run_id, challenges.c.step, challenges.c.verdict)
                              .where(challenges.c.run_id.in_(list(by_run)))):
            by_run[bytes(c.run_id)].append(c)
    nxt = encode_cursor(rows[-1].registered_block, bytes(rows[-1].run_id)) if more else None
    return {
        "items": [_run_summary(r, by_run[bytes(r.run_id)]) for r in rows],
        "total": total,
        "next_cursor": nxt,
    }


def _committed_losses(challenge_rows: Sequence[Any]) -> tuple[list[float | None], str | None, list[Any]]:
    """The longest committed loss list among the run's challenges (the root only grows), its source
    challenge and that challenge's loss-check findings. A sealed challenge's are left out: that its
    leaves were fetched tells that its opening was."""
    best: tuple[list[float | None], str | None, list[Any]] = ([], None, [])
    for c in sorted(challenge_rows, key=lambda c: -c.size):
        if c.view_sealed or not c.loss_checks:
            continue
        try:
            report = json.loads(c.loss_checks)
        except ValueError:
            continue
        losses = report.get("losses") if isinstance(report, dict) else None
        if isinstance(losses, list) and len(losses) > len(best[0]):
            best = (
                [finite_or_none(x) for x in losses],
                _hex(c.challenge_id),
                list(report.get("findings") or []),
            )
    return best


def get_run(conn: Connection, run_id: bytes) -> dict[str, Any] | None:
    row = conn.execute(select(runs).where(runs.c.run_id == run_id)).first()
    if row is None:
        return None
    rows = conn.execute(_challenge_rows(challenges.c.run_id == run_id)
                        .order_by(challenges.c.step, challenges.c.idx)).all()
    out = _run_summary(row, rows)
    losses, source, findings = _committed_losses(rows)
    out.update(
        initial_hash=_hex(row.initial_hash), dataset_hash=_hex(row.dataset_hash),
        schedule_commitment=_hex(row.schedule_commitment),
        loss_curve={"losses": [{"step": t, "loss": x} for t, x in enumerate(losses, start=1)],
                    "source_challenge": source, "findings": findings},
        challenge_list=[challenge_summary(c) for c in rows],
    )
    return out


def _own_accounts(conn: Connection, cid: bytes) -> set[str]:
    return {v for (v,) in conn.execute(select(witnesses.c.verifier).where(witnesses.c.challenge_id == cid))}


def get_challenge(conn: Connection, cid: bytes, *, now: float | None = None) -> dict[str, Any] | None:
    row = conn.execute(_challenge_rows(challenges.c.challenge_id == cid)).first()
    if row is None:
        return None
    now = time.time() if now is None else now
    stage_rows = [dict(r._mapping) for r in conn.execute(
        select(stage_log.c.stage, stage_log.c.started_at, stage_log.c.finished_at, stage_log.c.detail)
        .where(stage_log.c.challenge_id == cid).order_by(stage_log.c.id))]
    reveals, resolved = [], None
    for name, body in conn.execute(select(chain_events.c.name, chain_events.c.body)
                                   .where(chain_events.c.challenge_id == cid,
                                          chain_events.c.name.in_(("WitnessRevealed", "ChallengeResolved")))
                                   .order_by(chain_events.c.block, chain_events.c.position)):
        try:
            ev = json.loads(body)
        except ValueError:
            continue
        if name == "WitnessRevealed":
            reveals.append(ev)
        else:
            resolved = ev
    expected = _hex(row.leaf_hash) if row.mode == "value" else None
    if row.mode != "value":
        declared = conn.execute(select(chain_events.c.body).where(
            chain_events.c.challenge_id == cid, chain_events.c.name == "NormBucketDeclared")).scalar()
        expected = None if declared is None else str(json.loads(declared).get("bucket"))
    own = _own_accounts(conn, cid)
    tx_rows = conn.execute(select(txs).where(txs.c.challenge_id == cid).order_by(txs.c.id)).all()
    try:
        loss_report = json.loads(row.loss_checks) if row.loss_checks else None
    except ValueError:
        loss_report = None
    if isinstance(loss_report, dict):
        loss_report = {k: v for k, v in loss_report.items() if k != "losses"}
    disclosed = bool(row.view_disclosed)
    seal = (lambda v: v) if disclosed else (lambda _v: None)
    timeline = build_timeline(stage_rows, current_stage=row.stage, current_since=row.updated_at, now=now)
    if not disclosed:  # a job this node is not on has no witness; its details are blanked all the same
        timeline = [{**e, "detail": SEALED} if e["detail"] is not None else e for e in timeline]
    out = challenge_summary(row)
    outliers = list(resolved.get("outliers") or []) if resolved else []
    out.update(
        mode=row.mode,
        root=_hex(row.root),
        size=row.size,
        endpoint=row.endpoint,
        deadlines={
            "opening": row.opening_deadline,
            "commit": row.commit_deadline,
            "reveal": row.reveal_deadline,
            **({} if row.escalate_deadline is None else {"escalate": row.escalate_deadline}),
        },
        committee=_json_list(row.committee),
        opening={
            "digest": _hex(row.opening_digest),
            "uri": row.opening_uri,
            "block": row.opening_block,
            "bytes": row.opening_bytes,
            "leaf_hash": _hex(row.leaf_hash),
            "mirrors": _json_list(row.opening_mirrors),
            "served_by": row.opening_source,
        },
        refusal_reason=seal(row.refusal_reason),
        loss_checks=loss_report,
        # The replayed leaf, its state digest and loss bits each tell the match (and the leaf is
        # the value's preimage): sealed with the value.
        replay={
            "matches_leaf": seal(row.matches_leaf),
            "leaf": seal(_hex(row.replay_leaf)),
            "state_digest": seal(_hex(row.replay_state_digest)),
            "loss_bits": seal(row.replay_loss_bits),
            "proof_hash": seal(_hex(row.replay_proof_hash)),
        },
        witness={
            "value_hash": seal(_hex(row.value_hash)),
            "proof_hash": seal(_hex(row.proof_hash)),
            "norm_bucket": seal(row.norm_bucket),
            "fault": seal(row.fault),
        },
        winning_value=row.winning_value,
        miner_slashed=row.miner_slashed,
        timeline=timeline,
        clusters=reveal_clusters(
            reveals, mode=row.mode, winning=row.winning_value, own=own, expected=expected, outliers=outliers
        ),
        committed_value=expected,
        this_node=sorted(own),
        reveals=len(reveals),
        quorum={
            "cluster_size": resolved.get("cluster_size"),
            "reveals": resolved.get("reveals"),
            "outliers": outliers,
        }
        if resolved
        else None,
        txs=[
            {
                "kind": t.kind,
                "state": t.state,
                "sends": t.sends,
                "block": t.block,
                "tx_hash": _hex(t.tx_hash),
                "last_error": t.last_error,
            }
            for t in tx_rows
        ],
        witness_conflicts=witness_conflicts_of(conn, cid, disclosed=disclosed),
    )
    return seal_challenge(out, sealed=bool(row.view_sealed), stage=row.view_stage)


def verdict_counts(conn: Connection) -> dict[str, int]:
    return _verdict_counts(
        conn.execute(select(challenges.c.verdict, func.count()).group_by(challenges.c.verdict))
    )


def stage_counts(conn: Connection) -> dict[str, int]:
    """Jobs by the stage a view shows (a sealed job by its shown stage, `shown_stage`)."""
    counts = {s: 0 for s in SHOWN_STAGES}
    shown = shown_stage().label("shown")
    for stage, n in conn.execute(select(shown, func.count()).group_by(shown)):
        counts[stage] = counts.get(stage, 0) + int(n)
    return counts


def agreement(conn: Connection) -> dict[str, Any]:
    """How often this node's reveal was in the winning cluster (challenges it revealed for)."""
    agreed = disagreed = outliers = 0
    # Resolved challenges only: the chain has published every reveal of those, so the counts
    # never tell an open challenge's outcome.
    for in_win, outlier, n in conn.execute(
        select(challenges.c.in_winning_cluster, challenges.c.outlier, func.count())
        .where(challenges.c.resolved_block.is_not(None))
        .group_by(challenges.c.in_winning_cluster, challenges.c.outlier)
    ):
        if in_win is True:
            agreed += int(n)
        elif in_win is False:
            disagreed += int(n)
        if outlier:
            outliers += int(n)
    decided = agreed + disagreed
    return {"agreed": agreed, "disagreed": disagreed, "outliers": outliers,
            "ratio": None if decided == 0 else agreed / decided}


def cursor_state(conn: Connection, *, now: float | None = None) -> dict[str, Any]:
    row = conn.execute(
        select(chain_cursor.c.block, chain_cursor.c.updated_at).where(chain_cursor.c.id == 1)
    ).first()
    now = time.time() if now is None else now
    if row is None:
        return {"block": None, "updated_at": None, "age_s": None}
    return {"block": row.block, "updated_at": row.updated_at, "age_s": max(0.0, now - row.updated_at)}


def fingerprint(conn: Connection) -> str:
    """Changes whenever a run or challenge changes: the live view re-renders a page when it does.
    The cursor block is left out on purpose (it moves every block; the header shows it apart). A
    sealed challenge counts by its shown stage, never by when it last changed."""
    sealed = sealed_clause()
    n, last = conn.execute(select(func.count(), func.max(case((sealed, None), else_=challenges.c.updated_at)))
                           .select_from(challenges)).one()
    shown = ",".join(f"{k}:{v}" for k, v in stage_counts(conn).items() if v)
    runs_n = conn.execute(select(func.count()).select_from(runs)).scalar_one()
    conflicts = conn.execute(select(func.count(), func.max(witness_conflicts.c.acknowledged_at))
                             .select_from(witness_conflicts)).one()
    return f"{n}-{runs_n}-{last or 0:.6f}-{conflicts[0]}-{conflicts[1] or 0:.6f}-{shown}"


def _conflict(row, disclosed: bool) -> dict[str, Any]:
    if not disclosed:  # both values are witnesses of an open challenge: the journaled one is sent
        none = {"value_hash": None, "norm_bucket": None}
        return {"challenge_id": _hex(row.challenge_id), "verifier": row.verifier, "journaled": none,
                "recomputed": none, "disclosed": False, "created_at": row.created_at,
                "acknowledged_at": row.acknowledged_at}
    return {
        "challenge_id": _hex(row.challenge_id),
        "verifier": row.verifier,
        "journaled": {"value_hash": _hex(row.journaled_value_hash), "norm_bucket": row.journaled_norm_bucket},
        "recomputed": {
            "value_hash": _hex(row.recomputed_value_hash),
            "norm_bucket": row.recomputed_norm_bucket,
        },
        "disclosed": True,
        "created_at": row.created_at,
        "acknowledged_at": row.acknowledged_at,
    }


def witness_conflicts_of(
    conn: Connection, challenge_id: bytes, *, disclosed: bool | None = None
) -> list[dict[str, Any]]:
    """The determinism conflicts recorded for one challenge, oldest first (values sealed until
    the challenge is disclosed; `disclosed` when the caller already knows)."""
    rows = conn.execute(select(witness_conflicts).where(witness_conflicts.c.challenge_id == challenge_id)
                        .order_by(witness_conflicts.c.id)).all()
    if disclosed is None:
        disclosed = bool(rows) and bool(disclosed_ids(conn, [challenge_id]))
    return [_conflict(r, disclosed) for r in rows]


def conflict_summary(conn: Connection, *, latest: int = 5) -> dict[str, Any]:
    """All recorded determinism conflicts: total, unacknowledged, and the latest few."""
    total, open_ = conn.execute(select(
        func.count(), func.count().filter(witness_conflicts.c.acknowledged_at.is_(None)))
        .select_from(witness_conflicts)).one()
    rows = (
        conn.execute(select(witness_conflicts).order_by(witness_conflicts.c.id.desc()).limit(latest)).all()
        if total and latest
        else []
    )
    shown = disclosed_ids(conn, (r.challenge_id for r in rows))
    return {"total": int(total), "unacknowledged": int(open_),
            "latest": [_conflict(r, bytes(r.challenge_id) in shown) for r in rows]}


def stage_durations(conn: Connection) -> dict[str, tuple[int, float]]:
    """Per stage: (count, total seconds) of finished stage_log rows, a sealed challenge's left out
    until it is disclosed (which stages it went through tells whether its opening was refused)."""
    out = {}
    for stage, n, total in conn.execute(
        select(stage_log.c.stage, func.count(), func.sum(stage_log.c.finished_at - stage_log.c.started_at))
        .select_from(stage_log.join(challenges, challenges.c.challenge_id == stage_log.c.challenge_id))
        .where(stage_log.c.finished_at.is_not(None), ~sealed_clause())
        .group_by(stage_log.c.stage)
    ):
        out[stage] = (int(n), float(total or 0.0))
    return out


def tx_counts(conn: Connection) -> dict[str, int]:
    """Journaled txs by state; of a sealed challenge only those confirmed on chain (when this node
    journaled and sent one tells how long it took, i.e. whether it replayed)."""
    hidden = select(challenges.c.challenge_id).where(sealed_clause())
    keep = or_(txs.c.state == "confirmed", txs.c.challenge_id.not_in(hidden))
    return {state: int(n) for state, n in conn.execute(select(txs.c.state, func.count()).where(keep)
                                                       .group_by(txs.c.state))}


def run_count(conn: Connection) -> int:
    return conn.execute(select(func.count()).select_from(runs)).scalar_one()


def stuck_replays(conn: Connection, *, timeout_s: float, now: float | None = None) -> int:
    """Jobs in the replay stage for longer than a replay may take (a wedged pool)."""
    now = time.time() if now is None else now
    return conn.execute(select(func.count()).select_from(challenges).where(
        challenges.c.stage == Stage.REPLAY, challenges.c.status == "replaying",
        challenges.c.updated_at < now - timeout_s)).scalar_one()


__all__ = [
    "CURSOR_PATTERN",
    "FAKE_SHARES",
    "SEALED",
    "STATUSES",
    "TIMELINE",
    "VERDICTS",
    "BadQuery",
    "agreement",
    "build_timeline",
    "challenge_summary",
    "conflict_summary",
    "cursor_state",
    "decode_cursor",
    "detection_probability",
    "disclosed_clause",
    "disclosed_ids",
    "encode_cursor",
    "seal_challenge",
    "sealed_clause",
    "shown_stage",
    "PUBLIC_FIELDS",
    "SEALED_STAGE",
    "SHOWN_STAGES",
    "fingerprint",
    "get_challenge",
    "get_run",
    "list_challenges",
    "list_runs",
    "parse_id",
    "reveal_clusters",
    "run_count",
    "stage_counts",
    "stage_durations",
    "stuck_replays",
    "tx_counts",
    "verdict_counts",
    "witness_conflicts_of",
]


# --- refusals: payloads that were no call, and calls the protocol refused ------------------------

REFUSAL_EVENTS = ("RemarkIgnored", "CallRefused")
REFUSAL_SCAN = 10_000  # the newest refusal records looked through per request


def list_refusals(conn: Connection, account: str | None, *, origin: str | None = None,
                  limit: int = 50) -> dict[str, Any]:
    """The newest RemarkIgnored and CallRefused records of `origin`, or by default of this node's
    account and of the miners of the runs it knows, newest first."""
    if origin is not None:
        accounts = {origin}
    else:
        accounts = {m for (m,) in conn.execute(select(runs.c.miner).distinct())}
        if account:
            accounts.add(account)
    items: list[dict[str, Any]] = []
    if accounts:
        rows = conn.execute(select(chain_events.c.body).where(chain_events.c.name.in_(REFUSAL_EVENTS))
                            .order_by(chain_events.c.block.desc(), chain_events.c.position.desc())
                            .limit(REFUSAL_SCAN))
        for (body,) in rows:
            d = json.loads(body)
            if d.get("origin") in accounts:
                items.append(d)
                if len(items) >= limit:
                    break
    return {"items": items, "accounts": sorted(accounts)}
