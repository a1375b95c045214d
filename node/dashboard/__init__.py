"""The dashboard of challenge outcomes: Overview, Run and Challenge pages rendered on the server
(Jinja2, inline SVG charts), with local CSS and a small polling script; nothing is fetched from
outside the node.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from node import queries as Q
from node.dashboard.svg import VERDICT_COLORS, format_duration, loss_curve_svg, timeline_svg
from node.stake import stake_status

HERE = Path(__file__).resolve().parent
POLL_MS = 3000


def _short(h: str | None, n: int = 12) -> str:
    return "–" if not h else (h if len(h) <= n else h[:n] + "…")


def _when(ts: float | None) -> str:
    return "–" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%" if x < 0.9995 or x == 1 else f"{100 * x:.2f}%"


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(short=_short, when=_when, pct=_pct, duration=format_duration)
    env.globals.update(verdict_colors=VERDICT_COLORS, statuses=Q.STATUSES, all_stages=Q.SHOWN_STAGES)
    return env


def mount_dashboard(app: FastAPI, ctx: Any) -> None:
    """Add `/`, `/runs/{id}`, `/challenges/{id}` and `/static` to the app (not in the API schema)."""
    env = _environment()
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def render(name: str, status: int = 200, **data: Any) -> HTMLResponse:
        with ctx.engine.connect() as conn:
            fp = Q.fingerprint(conn)
            cursor = Q.cursor_state(conn)
            conflicts = Q.conflict_summary(conn)
        # Every page carries the determinism alarm: it is the one failure that must never go unseen.
        html = env.get_template(name).render(account=ctx.account, chain=ctx.config.chain.url, fingerprint=fp,
                                             cursor=cursor, poll_ms=POLL_MS, conflicts=conflicts, **data)
        return HTMLResponse(html, status_code=status)

    def error(status: int, message: str) -> HTMLResponse:
        return render("error.html", status=status, title=f"{status}", message=message)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def overview(
        request: Request,
        status: str | None = None,
        run: str | None = None,
        stage: str | None = None,
        cursor: str | None = None,
    ) -> HTMLResponse:
        # Empty form fields arrive as "": they mean "any".
        status, run, stage, cursor = (v or None for v in (status, run, stage, cursor))
        if status is not None and status not in Q.STATUSES:
            return error(400, f"status must be one of {', '.join(Q.STATUSES)}, got {status!r}")
        if stage is not None and stage not in Q.SHOWN_STAGES:
            return error(400, f"stage must be one of {', '.join(Q.SHOWN_STAGES)}, got {stage!r}")
        try:
            run_id = None if run is None else Q.parse_id(run, "run")
            with ctx.engine.connect() as conn:
                page = Q.list_challenges(
                    conn, status=status, run=run_id, stage=stage, limit=50, cursor=cursor
                )
                runs = Q.list_runs(conn, limit=100)
                counts = Q.verdict_counts(conn)
                stages = {k: v for k, v in Q.stage_counts(conn).items() if v}
                agree = Q.agreement(conn)
                stake = stake_status(conn, ctx.account)
        except Q.BadQuery as exc:
            return error(400, str(exc))
        filters = {"status": status or "", "run": run or "", "stage": stage or ""}
        next_query = None
        if page["next_cursor"]:
            next_query = "&".join(
                f"{k}={v}" for k, v in {**filters, "cursor": page["next_cursor"]}.items() if v
            )
        return render(
            "overview.html",
            title="Overview",
            counts=counts,
            stages=stages,
            agreement=agree,
            stake=stake,
            runs=runs["items"],
            challenges=page["items"],
            total=page["total"],
            filters=filters,
            next_query=next_query,
            fake_shares=Q.FAKE_SHARES,
            paged=cursor is not None,
        )

    @app.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
    def run_page(run_id: str) -> HTMLResponse:
        try:
            rid = Q.parse_id(run_id, "run id")
        except Q.BadQuery as exc:
            return error(400, str(exc))
        with ctx.engine.connect() as conn:
            run = Q.get_run(conn, rid)
        if run is None:
            return error(404, f"no run {rid.hex()} in this node's database")
        losses = [p["loss"] for p in run["loss_curve"]["losses"]]
        marks = [{"step": c["step"], "verdict": c["status"], "challenge_id": c["challenge_id"]}
                 for c in run["challenge_list"]]
        return render("run.html", title=f"Run {_short(run['run_id'])}", run=run,
                      chart=loss_curve_svg(losses, marks), n_losses=sum(x is not None for x in losses))

    @app.get("/challenges/{challenge_id}", response_class=HTMLResponse, include_in_schema=False)
    def challenge_page(challenge_id: str) -> HTMLResponse:
        try:
            cid = Q.parse_id(challenge_id, "challenge id")
        except Q.BadQuery as exc:
            return error(400, str(exc))
        now = time.time()
        with ctx.engine.connect() as conn:
            ch = Q.get_challenge(conn, cid, now=now)
        if ch is None:
            return error(404, f"no challenge {cid.hex()} in this node's database")
        return render("challenge.html", title=f"Challenge {_short(ch['challenge_id'])}", ch=ch,
                      chart=timeline_svg(ch["timeline"], now=now))


__all__ = ["mount_dashboard"]
