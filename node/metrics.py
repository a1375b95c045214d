"""Prometheus metrics of the node: job and verdict counts read from the database at scrape time,
the replay pool of the daemon, and the HTTP API's own requests. Names carry the `pot_` prefix and
base units; labels are bounded sets (stage, verdict, tx state, route template), never ids.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from chain.calls import IGNORE_REASONS
from chain.protocol.events import BLOCK_WORK_STAGES
from node import queries as Q
from node.db import ignored_counts
from node.faults import block_fault_counts
from node.stake import stake_status

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# Why the follower ignored a payload: the decode reasons, a call that crashed inside the protocol,
# and "other" for a code this node does not know (a bounded label set whatever the chain holds).
IGNORED_REASONS = (*IGNORE_REASONS, "apply_fault", "other")


class NodeCollector:
    """Reads the database on every scrape, so any process serving the API reports the same numbers
    the daemon wrote; a scrape during a database outage reports pot_database_up 0 instead of failing."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def describe(self) -> list:
        return []  # collected lazily: registering must not touch the database

    def collect(self):
        up = GaugeMetricFamily("pot_database_up", "1 if the node database answered this scrape, else 0.")
        try:
            with self.ctx.engine.connect() as conn:
                stages = Q.stage_counts(conn)
                verdicts = Q.verdict_counts(conn)
                agree = Q.agreement(conn)
                cursor = Q.cursor_state(conn)
                durations = Q.stage_durations(conn)
                txs = Q.tx_counts(conn)
                runs = Q.run_count(conn)
                conflicts = Q.conflict_summary(conn, latest=0)
                ignored = ignored_counts(conn)
                faults = block_fault_counts(conn)
                bond = stake_status(conn, self.ctx.account)
        except Exception:  # any driver error: say the database is down, keep serving the rest
            up.add_metric([], 0.0)
            yield up
            yield from self._pool()
            return
        up.add_metric([], 1.0)
        yield up

        g = GaugeMetricFamily(
            "pot_challenges",
            "Challenge jobs by the stage they are at (a sealed one, until this "
            "node's reveal is on chain, by the stage it shows).",
            labels=["stage"],
        )
        for stage in Q.SHOWN_STAGES:
            g.add_metric([stage], stages.get(stage, 0))
        yield g

        c = CounterMetricFamily("pot_challenges_resolved", "Challenges resolved on chain, by verdict.",
                                labels=["verdict"])
        for verdict in Q.VERDICTS:
            c.add_metric([verdict], verdicts.get(verdict, 0))
        yield c
        g = GaugeMetricFamily("pot_challenges_pending", "Challenges without a verdict yet.")
        g.add_metric([], verdicts.get("pending", 0))
        yield g

        c = CounterMetricFamily("pot_witness_in_winning_cluster",
                                "Resolved challenges where this node's reveal was in the winning cluster.")
        c.add_metric([], agree["agreed"])
        yield c
        c = CounterMetricFamily("pot_witness_outside_winning_cluster",
                                "Resolved challenges where this node revealed outside the winning cluster.")
        c.add_metric([], agree["disagreed"])
        yield c
        c = CounterMetricFamily(
            "pot_verifier_outlier", "Challenges where the chain recorded this node as an outlier."
        )
        c.add_metric([], agree["outliers"])
        yield c

        c = CounterMetricFamily("pot_witness_conflicts",
                                "Journal repeats whose recomputed witness differed from the journaled one "
                                "(a determinism failure; the journaled witness was sent).")
        c.add_metric([], conflicts["total"])
        yield c
        g = GaugeMetricFamily("pot_witness_conflicts_unacknowledged",
                              "Witness conflicts no operator has acknowledged yet (/readyz fails while > 0).")
        g.add_metric([], conflicts["unacknowledged"])
        yield g

        c = CounterMetricFamily("pot_remarks_ignored",
                                "Payloads with the pot1 prefix the follower ignored (undecodable, or a call "
                                "that failed inside the protocol), by reason.", labels=["reason"])
        for reason in IGNORED_REASONS:
            c.add_metric([reason], ignored.get(reason, 0))
        yield c

        c = CounterMetricFamily(
            "pot_block_work_failed",
            "Parts of a block's protocol work that failed inside the protocol and were undone "
            "(BlockWorkFailed events: the follower's determinism alarm), by stage.",
            labels=["stage"],
        )
        for stage in (*BLOCK_WORK_STAGES, "block"):
            c.add_metric([stage], faults.get(stage, 0))
        yield c

        if bond["bond"] is not None:
            g = GaugeMetricFamily("pot_verifier_bond", "This node's active verifier bond (protocol units).")
            g.add_metric([], bond["bond"])
            yield g
            g = GaugeMetricFamily(
                "pot_verifier_reserved",
                "What this node's seats and escalations of open rounds reserve of its bond (protocol units).",
            )
            g.add_metric([], bond["reserved"] or 0)
            yield g
        g = GaugeMetricFamily(
            "pot_verifier_unbonding", "This node's bond amounts waiting for their release block."
        )
        g.add_metric([], bond["unbonding_total"])
        yield g
        c = CounterMetricFamily(
            "pot_verifier_penalised",
            "Protocol units the chain took from this node's bond (no_commit, no_reveal, outlier).",
        )
        c.add_metric([], bond["penalised_total"])
        yield c
        c = CounterMetricFamily(
            "pot_fees_paid",
            "Protocol units the chain credited to this node's bond, by why "
            "(seat_fee, slash_share, dispute_pool).",
            labels=["why"],
        )
        for why, n in bond["paid_by_why"].items():
            c.add_metric([why], n)
        yield c

        g = GaugeMetricFamily("pot_runs", "Runs registered on the followed chain.")
        g.add_metric([], runs)
        yield g
        g = GaugeMetricFamily("pot_chain_cursor_block", "The last finalized block applied to the database.")
        g.add_metric([], -1 if cursor["block"] is None else cursor["block"])
        yield g
        if cursor["age_s"] is not None:
            g = GaugeMetricFamily("pot_chain_cursor_age_seconds", "Seconds since the cursor last advanced.")
            g.add_metric([], cursor["age_s"])
            yield g

        s = SummaryMetricFamily(
            "pot_stage_duration_seconds",
            "Time challenge jobs spent in each finished stage.",
            labels=["stage"],
        )
        for stage, (n, total) in sorted(durations.items()):
            s.add_metric([stage], count_value=n, sum_value=total)
        yield s

        g = GaugeMetricFamily("pot_txs", "Journaled commit/reveal transactions by state.", labels=["state"])
        for state in ("unstarted", "in_progress", "unconfirmed", "confirmed", "failed"):
            g.add_metric([state], txs.get(state, 0))
        yield g
        yield from self._pool()

    def _pool(self):
        live = self.ctx.status()
        if live is None:
            return
        g = GaugeMetricFamily("pot_replay_workers", "Replay worker slots by state.", labels=["state"])
        g.add_metric(["busy"], live.busy)
        g.add_metric(["idle"], live.workers - live.busy)
        yield g


def install(app: FastAPI, ctx: Any) -> CollectorRegistry:
    """A registry of this app (not the process-global one, so apps never share series) with the
    node collector and the HTTP request metrics, recorded by a middleware."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(ctx))
    requests = Counter(
        "pot_http_requests",
        "HTTP requests served, by method, route template and status class.",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram("pot_http_request_duration_seconds", "HTTP request handling time, by route template.",
                        ["route"], registry=registry,
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0))

    @app.middleware("http")
    async def _observe(request: Request, call_next):
        t0 = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            # The route template (e.g. /api/v1/runs/{run_id}), never the raw path: bounded labels.
            route = getattr(request.scope.get("route"), "path", None) or "unmatched"
            method = request.method if request.method in _METHODS else "other"
            requests.labels(method, route, f"{status // 100}xx").inc()
            latency.labels(route).observe(time.perf_counter() - t0)

    return registry


__all__ = ["NodeCollector", "install"]
