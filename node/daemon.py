"""The verifier daemon: follow finalized blocks, run each challenge's pipeline, commit and reveal.

One loop ingests blocks (events, jobs and the cursor in one transaction per block) and hands stage
work to threads (fetch, validate, loss checks) and to replay processes, round-robin across miners
with a cap per miner; every piece of work has a wall-clock budget from the commit window and is
cancelled or abandoned past it. Journaled commits and reveals go out from a thread of their own, so
they never wait behind that work. A watchdog rebuilds the chain connection when blocks stop arriving.

Protocol v2: the node keeps its verifier bond at `[verifier] bond` (one journaled bond_verifier
call after a start or a reconnect, node.stake), works only the challenges whose committee it sits
on (the others are skipped), commits to and reveals the witness pair (value hash, proof hash),
fetches an opening from its mirrors when its URI fails, and records penalties and re-challenges.

Protocol v3: a seat reserves collateral of the free bond; once a round's reveal window has closed
and until its escalation deadline, a node whose revealed value half differs from the value the
round would resolve to (chain.protocol.round_result) escalates it to the dispute round with one
journaled escalate_challenge call, if its free bond covers the escalation stake (`[verifier]
escalate`); the fees paid to it, its escalations and their settlements are recorded with its stake.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import and_, func, select, update
from sqlalchemy.engine import Connection, Engine

from chain import protocol as P
from chain.calls import IGNORE_REASONS, BondVerifier, EscalateChallenge
from chain.network import NetworkParamsError, read_network, seeded_state, start_params
from chain.protocol import ProtocolState, SnapshotError
from chain.protocol.events import (
    BlockWorkFailed,
    BondReleased,
    ChallengeEscalated,
    EscalationSettled,
    VerifierBonded,
    VerifierPaid,
    VerifierPenalized,
    VerifierUnbonding,
)
from chain.transport import Block, Transport, TransportError
from chain.view import ChainView, SnapshotKeyError, open_snapshot, seal_snapshot, snapshot_key
from challenges.losschecks import LossCheckConfig
from challenges.refused import REFUSED_BUCKET, refused_pair
from challenges.witness import new_salt
from commitments.files import make_private_dir
from commitments.retry import Backoff
from node import journal, lifecycle, stake
from node.config import ConfigError, NodeConfig, Secrets, check_authority
from node.db import chain_cursor, chain_events, challenges, count_ignored, runs, stage_log, txs
from node.faults import count_block_fault
from node.fetch import FetchPolicy, FetchStopped, OpeningsFull, endpoint_owners
from node.hooks import NodeHooks
from node.logs import log_event
from node.pipeline import (
    ChainFacts,
    ReplayPool,
    StageOutcome,
    stage_fetch,
    stage_losschecks,
    stage_validate,
    start_warm_up,
)
from node.scheduler import BlockClock, Budgets, InFlight, describe_error, is_input_error, round_robin
from node.stages import RESOLUTION, WORK_STAGES, Stage
from node.status import StatusSnapshot

log = logging.getLogger("node.daemon")

# The main loop's retry delay after an error, full jitter (commitments.retry); the stages' and the
# sender's are node.lifecycle's, with the rules of a challenge's life the daemon follows.
LOOP_BACKOFF = Backoff(0.5, 30.0)
# A stop (SIGTERM, SIGINT) waits at most this long for a fetch to reach a point it resumes from and
# for the sender to finish a send; nothing else is waited for (docs/operator.md, "First start").
STOP_GRACE_S = 1.5
# The protocol-state snapshot is rewritten every SNAPSHOT_MIN_BLOCKS blocks, or more rarely when it
# is large (about SNAPSHOT_BYTES_PER_BLOCK of snapshot per block, amortised), but at least every
# SNAPSHOT_MAX_BLOCKS blocks and at shutdown: the blocks since are re-derived from the chain on start.
SNAPSHOT_MIN_BLOCKS = 16
SNAPSHOT_MAX_BLOCKS = 256
SNAPSHOT_BYTES_PER_BLOCK = 64 * 1024
# A pending bond call is sent again only after this many times chain.resend_after_blocks blocks
# passed without the chain showing it (it may still be on its way: a second one would bond twice).
BOND_RESEND_FACTOR = 4
# The database's protocol-state snapshot: CBOR [domain, state, keyed digest] under the node's
# snapshot key (chain.view.snapshot_key: SNAPSHOT_KEY_FILE in the data dir, 0600, made on first use).
NODE_SNAPSHOT_DOMAIN = "pot/node-snapshot/v1"


def seal_state(state: ProtocolState, key: bytes) -> bytes:
    """The bytes of the database's snapshot column for `state`."""
    return seal_snapshot(key, NODE_SNAPSHOT_DOMAIN, state.to_cbor())


def read_snapshot(data: bytes, key: bytes) -> ProtocolState:
    """The state in a snapshot column, once its digest checks under `key` and every field is what
    a node writes; else SnapshotError naming what is wrong."""
    (state_bytes,) = open_snapshot(key, bytes(data), NODE_SNAPSHOT_DOMAIN, 1)
    if not isinstance(state_bytes, bytes):
        raise SnapshotError("its state is not a byte string")
    return ProtocolState.from_cbor(state_bytes)


@dataclass
class _Task:
    """A stage running on a thread: its budget, and the owners (miner, endpoint) it counts against."""

    stage: Stage
    future: Future
    owners: tuple[str, ...]
    started_at: float  # wall clock, for the stage log
    deadline: float  # time.monotonic() past which the work is cancelled or abandoned
    budget_s: float
    part: Path | None = None  # a fetch's partial file, removed once an abandoned fetch has ended


def _run_on_thread(name: str, fn, *args: Any, **kw: Any) -> Future:
    """`fn` on a thread of its own: one that overruns is abandoned without holding up a pool."""
    fut: Future = Future()

    def body() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(*args, **kw))
        except BaseException as exc:  # handed to the loop, which decides
            fut.set_exception(exc)

    threading.Thread(target=body, name=name, daemon=True).start()
    return fut


class StartupError(RuntimeError):
    """The node cannot start as configured (chain mismatch, parameters), with what to fix."""


def _hex(b: bytes | None) -> str | None:
    return None if b is None else bytes(b).hex()


def connect_transport(cfg: NodeConfig, secrets: Secrets) -> Transport:
    from chain.connect import connect

    if cfg.chain.url.startswith("dev://"):
        return connect(cfg.chain.url, account=cfg.chain.account)
    opts: dict[str, Any] = {"kind": cfg.chain.kind, "rpc_timeout": cfg.chain.rpc_timeout_s}
    if secrets.password:
        opts["password"] = secrets.password
    return connect(cfg.chain.url, key=secrets.key, **opts)


class VerifierNode:
    def __init__(self, cfg: NodeConfig, secrets: Secrets, engine: Engine, *,
                 stop: threading.Event | None = None, hooks: NodeHooks | None = None) -> None:
        self.cfg = cfg
        self.hooks = hooks or NodeHooks()  # test networks steer the daemon here (node/hooks.py)
        self.secrets = secrets
        self.engine = engine
        self.pinned = cfg.pinned_params()  # None: the node follows the chain's parameters
        self.stop = stop or threading.Event()
        self.data_dir = cfg.data_dir
        make_private_dir(self.data_dir)  # 0700 when new: it holds the database and downloads
        try:
            self.snapshot_key = snapshot_key(self.data_dir)  # authenticates the database's snapshot
        except SnapshotKeyError as exc:
            raise StartupError(str(exc)) from None
        # Downloads live apart from the database (their own volume where given), under a quota.
        self.openings = cfg.openings_store()
        make_private_dir(self.openings.path)
        (self.openings.path / "leaves").mkdir(parents=True, exist_ok=True)
        self.policy: FetchPolicy = cfg.fetch.policy()
        self.loss_config = LossCheckConfig(**cfg.losschecks.model_dump())
        self.transport: Transport | None = None
        self.view: ChainView | None = None
        self.account = ""
        self.head = -1
        sched = cfg.schedule
        self.clock = BlockClock(sched.block_time_s)
        self.budgets = Budgets(sched.commit_margin_blocks, sched.fetch_share, sched.fetch_max_s,
                               sched.validate_max_s, sched.losschecks_max_s, cfg.replay.timeout_s)
        self.tasks: dict[bytes, _Task] = {}  # live stage work, at most schedule.stage_threads
        self.abandoned: list[tuple[bytes, _Task]] = []  # overran their budget; still count for their owners
        self.in_flight = InFlight(sched.max_jobs_per_miner)
        self.replay_owners: dict[bytes, tuple[str, ...]] = {}
        self._rr_last: str | None = None  # the miner served last: the next pass starts after it
        self.replays: Any = self._replay_backend(cfg)
        self.cluster = cfg.replay.backend == "ray"
        self.limits = lifecycle.Limits(stage_attempts=sched.stage_attempts, cluster=self.cluster)
        self.cluster_specs: dict[bytes, Any] = {}  # the spec each peeked manifest carried (sizes the task)
        self._send_wake = threading.Event()  # a one-slot mailbox: "there may be a tx to send"
        self._sender: threading.Thread | None = None
        self.sent_here: set[int] = set()  # tx ids this process has sent (others: maybe sent before a crash)
        self.last_block_at = time.monotonic()
        self.failures = 0
        self._confirmed_commit = False
        self.stage_failures: dict[bytes, int] = {}  # stage thread errors in a row, per job (retry backoff)
        self.fetch_retries: dict[bytes, int] = {}  # fetches that failed and may pass, per job (retry backoff)
        self.snapshot_block: int | None = None  # the block the database's snapshot is of (None: none yet)
        self.snapshot_bytes = 0
        self._bond_due = True  # check the bond once caught up (set again after a reconnect)
        self._agreed: set[bytes] = set()  # rounds whose would-be value this node's reveal agrees with
        self._stake_saved: tuple[Any, ...] | None = None  # the stake figures last saved (node.stake)

    @staticmethod
    def _replay_backend(cfg: NodeConfig) -> Any:
        if cfg.replay.backend == "local":
            return ReplayPool(cfg.replay.workers, cfg.replay.timeout_s)
        from node.cluster import ClusterError, ClusterReplays

        try:
            return ClusterReplays(cfg.replay.address, cfg.replay.workers, cfg.replay.timeout_s,
                                  max_retries=cfg.replay.max_retries)
        except ClusterError as exc:
            raise StartupError(str(exc)) from None

    # --- start-up -----------------------------------------------------------------------------
    def start(self) -> None:
        """Connect and load the view; refuses a chain or parameters the database does not match."""
        try:
            check_authority(self.cfg)  # before connecting: an unpinned Substrate node follows no one's records
        except ConfigError as exc:
            raise StartupError(str(exc)) from None
        self.transport = connect_transport(self.cfg, self.secrets)
        self.account = self.transport.account
        self.view = self._load_view()
        self._bond_due = True
        with self.engine.begin() as conn:
            stake.save_stake(conn, self.account, self.view.state, target=self.bond_target())
        with self.engine.connect() as conn:  # downloads left by challenges that are over
            self.openings.prune({bytes(r[0]).hex() for r in conn.execute(
                select(challenges.c.challenge_id).where(challenges.c.stage.in_(WORK_STAGES)))})
        # The validate stage's imports load now, while the node follows the chain: the first
        # challenge's validation must not pay for them.
        start_warm_up(lambda s: log_event(log, "validate_warmed_up", seconds=round(s, 2)))
        log_event(log, "node_started", account=self.account, chain=self.cfg.chain.url, cursor=self.view.cursor,
                  database=self.engine.url.render_as_string(hide_password=True), fault=self.hooks.fault,
                  bond=self.view.state.vbonds.get(self.account, 0), bond_target=self.bond_target())

    def _load_view(self) -> ChainView:
        assert self.transport is not None
        with self.engine.connect() as conn:
            row = conn.execute(select(chain_cursor).where(chain_cursor.c.id == 1)).first()
        if row is None:
            return self._start_view()
        try:
            state: ProtocolState | None = read_snapshot(row.snapshot, self.snapshot_key)
            if state is not None and state.head > row.block:
                raise SnapshotError(f"it is of block {state.head}, after the database's cursor {row.block}")
        except SnapshotError as exc:
            # Never trusted, never fatal: the state is derived again from the start block.
            log_event(log, "snapshot_discarded", level=logging.WARNING, reason=str(exc), cursor=row.block,
                      start_block=self.cfg.chain.start_block,
                      detail="the database's protocol snapshot is refused; the state is derived again from the "
                             "chain from the start block")
            state = None
        if row.block_hash is not None:
            head = self.transport.finalized_head()
            if head < row.block:
                raise StartupError(f"the database follows this chain up to block {row.block}, but the chain's "
                                   f"finalized head is {head}: a different or reset chain")
            if self.transport.block(row.block).hash != bytes(row.block_hash):
                raise StartupError(f"block {row.block} of this chain differs from the one in the database: "
                                   f"the database belongs to another chain")
        if state is None:
            view = self._start_view()
            if view.cursor > row.block:
                raise StartupError(f"the database's cursor {row.block} is before [chain] start_block "
                                   f"{view.cursor}: the state cannot be derived again under this configuration")
            snapshot_block = None  # the next block writes a fresh snapshot
        else:
            snapshot_block = state.head
            if self.pinned is not None and self.pinned != state.params:
                raise StartupError(
                    "this node's [protocol] section disagrees with the protocol parameters its database follows "
                    f"(those of the chain at block {state.head}): "
                    + "; ".join(f"{d} (pinned != chain)" for d in self.pinned.differences(state.params)))
            authority = self.cfg.chain.authority or None
            if authority is not None and state.authority is not None and state.authority != authority:
                raise StartupError(f"the database follows a network configured by {state.authority}, "
                                   f"[chain] authority is {authority}")
            view = ChainView(self.transport, state.params, cursor=state.head, state=state, keep_events=False)
        # The snapshot may be a few blocks older than the cursor (or gone): re-derive them (their
        # events and jobs are in the database already).
        since = view.cursor
        while view.cursor < row.block:
            view.process(self.transport.block(view.cursor + 1))
        if row.block > since:
            log_event(log, "snapshot_rederived", snapshot_block=snapshot_block, cursor=row.block,
                      blocks=row.block - since)
        view.cursor_hash = bytes(row.block_hash) if row.block_hash is not None else None
        self.snapshot_block, self.snapshot_bytes = snapshot_block, len(row.snapshot or b"")
        return view

    def _start_view(self) -> ChainView:
        """The view of a node starting at [chain] start_block: the network's parameters and record
        as of that block (chain.network), nothing derived yet."""
        assert self.transport is not None
        start = self.cfg.chain.start_block
        head = self.transport.finalized_head()
        try:
            # Up to the head: the pin is checked against what the chain has in effect now, even
            # when the node follows from an earlier block.
            rec = read_network(self.transport, head, authority=self.cfg.chain.authority or None,
                               at=min(start, head))
            params = start_params(rec, self.pinned, pin_name="this node's [protocol] section")
        except NetworkParamsError as exc:
            raise StartupError(str(exc)) from None
        log_event(log, "network_params", source=rec.source(), authority=rec.authority,
                  params_digest=params.digest().hex(), pinned=self.pinned is not None)
        return ChainView(self.transport, params, cursor=start, state=seeded_state(rec, params),
                         keep_events=False)

    def _reconnect(self, why: str) -> None:
        log_event(log, "chain_reconnect", level=logging.WARNING, reason=why)
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:  # a broken connection may fail to close; it is dropped either way
                pass
        self.transport = None
        self.view = None
        self.transport = connect_transport(self.cfg, self.secrets)
        self.view = self._load_view()
        self._bond_due = True
        self.last_block_at = time.monotonic()

    def status(self) -> StatusSnapshot:
        """The live facts the HTTP API reads (node/status.py's NodeStatus)."""
        workers = self.replays.workers
        busy = min(max(workers - self.replays.free(), 0), workers)
        return StatusSnapshot(account=self.account, head=max(self.head, -1), workers=workers, busy=busy,
                              stopping=self.stop.is_set())

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        self.start()
        self._sender = threading.Thread(target=self._sender_loop, name="pot-sender", daemon=True)
        self._sender.start()
        try:
            while not self.stop.is_set():
                try:
                    if self.transport is None or self.view is None:
                        self._reconnect("no connection")
                    self.step()
                    self.failures = 0
                except Exception as exc:  # the daemon never dies on bad input or a flaky chain
                    self.failures += 1
                    delay = LOOP_BACKOFF.delay(self.failures)
                    log_event(log, "loop_error", level=logging.ERROR, error=f"{type(exc).__name__}: {exc}",
                              retry_in_s=round(delay, 2), exc_info=True)
                    if isinstance(exc, TransportError):
                        self.view = None  # rebuilt from the database's cursor on the next pass
                    self.stop.wait(delay)
                    continue
                self.stop.wait(self.cfg.node.loop_interval_s)
        finally:
            self.shutdown()

    def step(self) -> None:
        """One pass: ingest new blocks, move jobs, watch the connection (txs: the sender thread)."""
        self.ingest()
        self.clock.observe(self.head, time.monotonic())
        self.ensure_bond()
        self.escalate()
        self._send_wake.set()
        self.collect()
        self.schedule()
        if time.monotonic() - self.last_block_at > self.cfg.chain.watchdog_s:
            self._reconnect(f"no new finalized block for {self.cfg.chain.watchdog_s:g} s")

    def shutdown(self) -> None:
        """Stop within about STOP_GRACE_S: nothing durable is lost, and nothing waits on work that is redone.

        Replays are stopped at once (a replay is redone after the restart, and the stopped attempt
        does not count against the replay attempts); a fetch sees `stop` and keeps its partial file
        to resume; validations and loss checks, which read their input and write nothing until they
        end, are left running and start again on the next start. The sender gets the same grace to
        finish its send: a tx it had begun is journaled in_progress and sent again on the next start,
        as after a crash. Stage work that ended inside the grace is persisted; then the snapshot of the
        cursor is written.
        """
        started = time.monotonic()
        self.stop.set()
        self._send_wake.set()
        until = started + STOP_GRACE_S
        replaying = list(self.replay_owners)
        self.replays.shutdown()
        self._replays_stopped(replaying)
        for task in [*self.tasks.values(), *(t for _, t in self.abandoned)]:
            if task.stage != Stage.FETCH:
                continue
            try:
                task.future.exception(timeout=max(0.0, until - time.monotonic()))
            except Exception:  # a fetch still inside one read: it ends with the process, its .part stays
                pass
        if self._sender is not None:
            self._sender.join(max(0.0, until - time.monotonic()))
        try:
            for cid, task in list(self.tasks.items()):
                if task.future.done():
                    del self.tasks[cid]
                    self.in_flight.remove(task.owners)
                    self._finished(cid, task)
        except Exception as exc:  # the job stays at its stage and the work is done again on the next start
            log_event(log, "stage_persist_failed", level=logging.WARNING, error=describe_error(exc, 500))
        left = sorted(str(t.stage) for t in [*self.tasks.values(), *(t for _, t in self.abandoned)]
                      if not t.future.done())
        self._final_snapshot()
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:
                pass
        log_event(log, "node_stopped", account=self.account, seconds=round(time.monotonic() - started, 2),
                  replays_stopped=len(replaying), stages_left=left,
                  sender_left=self._sender is not None and self._sender.is_alive())

    def _replays_stopped(self, cids: list[bytes]) -> None:
        """The replays a stop ended: each job stays at replay, and the attempt is given back."""
        if not cids:
            return
        try:
            with self.engine.begin() as conn:
                for cid in cids:
                    conn.execute(update(challenges)
                                 .where(and_(challenges.c.challenge_id == cid, challenges.c.stage == Stage.REPLAY,
                                             challenges.c.attempts > 0))
                                 .values(attempts=challenges.c.attempts - 1, updated_at=time.time(),
                                         status="the replay was stopped by the node's shutdown; it runs again "
                                                "on the next start"))
        except Exception as exc:  # the attempt counts; the replay still runs again on the next start
            log_event(log, "replay_stop_record_failed", level=logging.WARNING, error=describe_error(exc, 500))
        for cid in cids:
            log_event(log, "replay_stopped", challenge_id=cid.hex(),
                      detail="stopped by the shutdown; the replay runs again on the next start")

    def _maybe_kill(self, point: str) -> None:
        """Tell the hooks that `point` became durable (a crash test's power cut happens here)."""
        self.hooks.reached(point)

    # --- the bond ---------------------------------------------------------------------------------
    def bond_target(self) -> int:
        """The active bond this node keeps (`[verifier] bond`; "auto": the chain's verifier_stake)."""
        params = self.view.params if self.view is not None else self.pinned
        return 0 if params is None else self.cfg.verifier.target(params)

    def ensure_bond(self) -> None:
        """Top the active bond up to the target with one BondVerifier call, once the view has caught
        up with the finalized head (the chain's state, not an old one, says what is missing). The
        call is journaled before it is sent; a pending one is not sent again before
        BOND_RESEND_FACTOR x chain.resend_after_blocks blocks have passed, restarts included."""
        if not self._bond_due or self.view is None or self.transport is None or self.view.cursor < self.head:
            return
        target = self.bond_target()
        active = self.view.state.vbonds.get(self.account, 0)
        with self.engine.connect() as conn:
            pending = stake.pending_bond(conn)
        if target <= 0 or active >= target:
            if pending is not None:
                with self.engine.begin() as conn:
                    stake.clear_bond(conn)
            self._bond_due = False
            log_event(log, "bond_ok", account=self.account, bond=active, target=target)
            return
        window = BOND_RESEND_FACTOR * self.cfg.chain.resend_after_blocks
        if pending is not None and pending.account == self.account and self.head - pending.sent_block < window:
            return  # sent, not on chain yet: wait for it
        amount = target - active
        with self.engine.begin() as conn:
            stake.record_bond(conn, account=self.account, amount=amount, target=target, head=self.head)
            stake.save_stake(conn, self.account, self.view.state, target=target)
        try:
            receipt = self.transport.submit([BondVerifier(amount)], wait=False,
                                            timeout=self.cfg.chain.submit_timeout_s)
        except TransportError as exc:
            with self.engine.begin() as conn:
                stake.update_bond(conn, error=str(exc)[:500])
            log_event(log, "bond_send_failed", level=logging.WARNING, account=self.account, amount=amount,
                      error=str(exc)[:500], retry_after_blocks=window)
            return
        with self.engine.begin() as conn:
            stake.update_bond(conn, tx_hash=_hex(receipt.tx_hash), error=None)
        log_event(log, "bond_sent", account=self.account, amount=amount, bond=active, target=target, head=self.head,
                  resent=pending is not None, tx_hash=_hex(receipt.tx_hash))

    # --- escalation (protocol v3) ------------------------------------------------------------------
    def escalate(self) -> None:
        """Escalate each round this node revealed on that is about to resolve against its reveal.

        Once the view has applied a round's reveal deadline (every reveal is in) and while a call
        sent now can still land by its escalation deadline, the round's result as it stands
        (chain.protocol.round_result) is compared with this node's revealed value half (the value
        hash, or the bucket in bucket mode): the node dissents when the winning value half differs
        from its own and so does the verdict its own value gives (honest when it is the miner's
        H(leaf t) or declared bucket, else fraud): an escalation disputes the round's verdict. A
        refusal of the opening is no verdict on the step: it never escalates. A dissent is
        escalated once: an escalate_challenge call journaled (txs, kind "escalate") and sent by the
        sender thread, if the node's escalation room (the protocol's escalation_room: its bond less
        its escalation stakes and what its open seats may still be charged) covers the chain's
        escalation_stake; otherwise `escalation_unaffordable` is logged with the numbers. Off with `[verifier] escalate = false`."""
        view = self.view
        if not self.cfg.verifier.escalate or view is None or not self.account:
            return
        state, n = view.state, view.cursor
        with self.engine.connect() as conn:
            jobs = list(conn.execute(select(challenges).where(
                challenges.c.stage == Stage.REVEALED, challenges.c.escalation.is_(None),
                challenges.c.escalate_deadline.is_not(None), challenges.c.reveal_deadline <= n)))
        for job in jobs:
            cid = bytes(job.challenge_id)
            if cid in self._agreed:
                continue
            ch = state.challenges.get(cid)
            mine = ch.reveals.get(self.account) if ch is not None else None
            if ch is None or ch.verdict is not None or ch.dispute or mine is None:
                continue
            result = P.round_result(state, cid)
            value = mine[0] if ch.mode == "value" else mine[1]
            if not self._dissents(ch, value, result):
                self._agreed.add(cid)  # nothing to dissent from: the reveals are final after their deadline
                continue
            winning = result.winning_value.hex() if isinstance(result.winning_value, bytes) else result.winning_value
            own = value.hex() if isinstance(value, bytes) else value
            if n >= ch.escalate_deadline:
                self._escalation(cid, "missed")
                log_event(log, "escalation_missed", level=logging.WARNING, challenge_id=cid.hex(), cursor=n,
                          escalate_deadline=ch.escalate_deadline, value=own, winning_value=winning,
                          detail="the node read the round's reveals after its escalation window closed")
                continue
            stake_needed, free = state.params.escalation_stake, max(0, P.escalation_room(state, self.account))
            if free < stake_needed:
                self._escalation(cid, "unaffordable")
                log_event(log, "escalation_unaffordable", level=logging.WARNING, challenge_id=cid.hex(),
                          escalation_stake=stake_needed, escalation_room=free, bond=state.vbonds.get(self.account, 0),
                          reserved=state.reserved.get(self.account, 0), value=own, winning_value=winning,
                          verdict=result.verdict,
                          detail="the round resolves to another value than this node revealed, and its escalation "
                                 "room does not cover the escalation stake: it is not escalated")
                continue
            with self.engine.begin() as conn:
                tx, inserted = journal.journal_escalation(conn, challenge_id=cid, verifier=self.account)
                conn.execute(update(challenges).where(challenges.c.challenge_id == cid).values(
                    escalation="journaled", updated_at=time.time(),
                    status=f"escalating to the dispute round: the round resolves {result.verdict} to "
                           f"{str(winning)[:16]}, this node revealed {str(own)[:16]}; staking {stake_needed} of an "
                           f"escalation room of {free}"))
            log_event(log, "escalation_journaled", challenge_id=cid.hex(), escalation_stake=stake_needed,
                      escalation_room=free, value=own, winning_value=winning, verdict=result.verdict, inserted=inserted,
                      escalate_deadline=ch.escalate_deadline)
            self._send_wake.set()

    @staticmethod
    def _dissents(ch: P.ChallengeState, value: bytes | int, result: Any) -> bool:
        """Whether this node's revealed value half `value` disputes the round's would-be `result`."""
        if result.verdict not in ("honest", "fraud") or value == result.winning_value:
            return False
        refused = refused_pair(ch.challenge_id)[0] if ch.mode == "value" else REFUSED_BUCKET
        expected = (ch.opening or {}).get("leaf_hash") if ch.mode == "value" else ch.declared_bucket
        if value == refused or expected is None:
            return False
        return ("honest" if value == expected else "fraud") != result.verdict

    def _escalation(self, cid: bytes, what: str) -> None:
        self._set(cid, escalation=what)

    # --- following the chain -------------------------------------------------------------------
    def ingest(self, max_blocks: int = 100) -> int:
        assert self.transport is not None and self.view is not None
        self.head = head = self.transport.finalized_head()
        n = 0
        while self.view.cursor < head and n < max_blocks and not self.stop.is_set():
            block = self.transport.block(self.view.cursor + 1)
            try:
                events = self.view.process(block)
                with self.engine.begin() as conn:
                    relevant = self._apply_events(conn, block, events)
                    written = self._save_cursor(conn, block)
            except BaseException:
                self.view = None  # its state ran ahead of the database: rebuild from the cursor
                raise
            if written is not None:
                self.snapshot_block, self.snapshot_bytes = block.number, written
            self.last_block_at = time.monotonic()
            n += 1
            if relevant:
                self._maybe_kill("event_ingested")
            if self._confirmed_commit:
                self._maybe_kill("commit_confirmed")
        return n

    def _snapshot_due(self, number: int) -> bool:
        if self.snapshot_block is None:
            return True
        every = min(SNAPSHOT_MAX_BLOCKS, max(SNAPSHOT_MIN_BLOCKS, -(-self.snapshot_bytes // SNAPSHOT_BYTES_PER_BLOCK)))
        return number - self.snapshot_block >= every

    def _save_cursor(self, conn: Connection, block: Block) -> int | None:
        """Move the cursor to `block`; with the snapshot too when one is due (its size, else None)."""
        assert self.view is not None
        values: dict[str, Any] = dict(block=block.number, block_hash=block.hash, updated_at=time.time())
        snapshot = seal_state(self.view.state, self.snapshot_key) if self._snapshot_due(block.number) else None
        if snapshot is not None:
            values["snapshot"] = snapshot
        if conn.execute(update(chain_cursor).where(chain_cursor.c.id == 1).values(**values)).rowcount == 0:
            if snapshot is None:
                snapshot = values["snapshot"] = seal_state(self.view.state, self.snapshot_key)
            conn.execute(chain_cursor.insert().values(id=1, **values))
        return None if snapshot is None else len(snapshot)

    def _final_snapshot(self) -> None:
        """At shutdown: the snapshot of the cursor itself, so the next start re-derives nothing."""
        view = self.view
        if view is None or view.cursor == self.snapshot_block or view.state.head != view.cursor:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(update(chain_cursor).where(and_(chain_cursor.c.id == 1, chain_cursor.c.block == view.cursor))
                             .values(snapshot=seal_state(view.state, self.snapshot_key)))
        except Exception as exc:  # the older snapshot still stands; the next start re-derives from it
            log_event(log, "snapshot_write_failed", level=logging.WARNING, error=type(exc).__name__)

    def _apply_events(self, conn: Connection, block: Block, events: list[P.Event]) -> bool:
        """Record a block's events and turn them into job changes. True if one concerned our jobs."""
        relevant = False
        staked = False
        self._confirmed_commit = False
        now = time.time()
        for pos, ev in enumerate(events):
            cid = getattr(ev, "challenge_id", None)
            conn.execute(chain_events.insert().values(
                block=block.number, position=pos, name=ev.code, challenge_id=cid,
                run_id=getattr(ev, "run_id", None), body=ev.to_json()))
            if isinstance(ev, P.RunRegistered):
                if conn.execute(select(runs.c.run_id).where(runs.c.run_id == ev.run_id)).first() is None:
                    conn.execute(runs.insert().values(
                        run_id=ev.run_id, miner=ev.miner, spec_digest=ev.spec_digest, mode=ev.mode,
                        declared_steps=ev.declared_steps, endpoint=ev.endpoint, initial_hash=ev.initial_hash,
                        schedule_commitment=ev.schedule_commitment, dataset_hash=ev.dataset_hash,
                        registered_block=ev.block, slashed=0))
            elif isinstance(ev, P.ChallengeIssued):
                run = conn.execute(select(runs.c.miner).where(runs.c.run_id == ev.run_id)).first()
                own = run is not None and run.miner == self.account
                seated = self.account in ev.committee
                stage, status = lifecycle.issued_stage(own, seated, ev.round)
                conn.execute(challenges.insert().values(
                    challenge_id=ev.challenge_id, run_id=ev.run_id, idx=ev.index, step=ev.step, root=ev.root,
                    size=ev.size, mode=ev.mode, endpoint=ev.endpoint, issued_block=ev.block,
                    opening_deadline=ev.opening_deadline, commit_deadline=ev.commit_deadline,
                    reveal_deadline=ev.reveal_deadline, escalate_deadline=ev.escalate_deadline, stage=stage,
                    status=status, round=ev.round, first_id=ev.first, committee=json.dumps(list(ev.committee)),
                    on_committee=seated, attempts=0, next_attempt_at=0.0, created_at=now, updated_at=now))
                relevant = True
                log_event(log, "challenge_issued", challenge_id=_hex(ev.challenge_id), step=ev.step,
                          round=ev.round, first=_hex(ev.first), committee=len(ev.committee), on_committee=seated,
                          commit_deadline=ev.commit_deadline, reveal_deadline=ev.reveal_deadline,
                          escalate_deadline=ev.escalate_deadline)
            elif isinstance(ev, P.OpeningSubmitted):
                job = self._job(conn, ev.challenge_id)
                if job is not None and job.stage == Stage.AWAITING_OPENING:
                    lazy = self.hooks.skips_work()
                    conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id).values(
                        opening_digest=ev.opening_digest, opening_uri=ev.uri, leaf=ev.leaf, leaf_hash=ev.leaf_hash,
                        opening_mirrors=json.dumps(list(ev.mirrors)), opening_block=ev.block,
                        stage=lifecycle.opening_stage(lazy), updated_at=now))
                    self._log_stage(conn, ev.challenge_id, Stage.AWAITING_OPENING, job.created_at, now,
                                    f"opening on chain at block {ev.block}"
                                    + (f" ({len(ev.mirrors)} mirror(s))" if ev.mirrors else "")
                                    + (f"; {self.hooks.fault} fault: no fetch, no replay" if lazy else ""))
                    relevant = True
            elif isinstance(ev, P.WitnessCommitted) and ev.verifier == self.account:
                journal.confirm_tx(conn, ev.challenge_id, self.account, "commit", ev.block)
                self._advance(conn, ev.challenge_id, Stage.COMMIT, Stage.REVEAL, now, f"commit in block {ev.block}")
                relevant = self._confirmed_commit = True
            elif isinstance(ev, P.WitnessRevealed) and ev.verifier == self.account:
                journal.confirm_tx(conn, ev.challenge_id, self.account, "reveal", ev.block)
                self._advance(conn, ev.challenge_id, Stage.REVEAL, Stage.REVEALED, now, f"reveal in block {ev.block}")
                relevant = True
            elif isinstance(ev, P.RevealRejected) and ev.verifier == self.account:
                journal.fail_tx(conn, ev.challenge_id, self.account, "reveal", ev.reason)
                log_event(log, "reveal_rejected", level=logging.ERROR, challenge_id=_hex(ev.challenge_id),
                          reason=ev.reason)
            elif isinstance(ev, P.ChallengeResolved):
                relevant |= self._resolved(conn, ev, now)
            elif isinstance(ev, P.MinerSlashed):
                conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id)
                             .values(miner_slashed=ev.amount, updated_at=now))
                conn.execute(update(runs).where(runs.c.run_id == ev.run_id)
                             .values(slashed=runs.c.slashed + ev.amount))
            elif isinstance(ev, P.VerifierOutlier) and ev.verifier == self.account:
                conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id)
                             .values(outlier=True, updated_at=now))
            elif isinstance(ev, ChallengeEscalated):
                ours = ev.verifier == self.account
                if ours:
                    journal.confirm_tx(conn, ev.challenge_id, self.account, "escalate", ev.block)
                    conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id)
                                 .values(escalation="escalated", updated_at=now))
                    staked = True
                    self._stake_event(conn, ev, now)
                log_event(log, "challenge_escalated", challenge_id=_hex(ev.challenge_id), verifier=ev.verifier,
                          stake=ev.stake, disputes=ev.disputes, ours=ours, block=ev.block)
            elif isinstance(ev, P.RunSettled):
                log_event(log, "run_settled", run_id=_hex(ev.run_id), miner=ev.miner,
                          stake_released=ev.stake_released, escrow_released=ev.escrow_released,
                          escrow_burned=ev.escrow_burned, unresolved=ev.unresolved, block=ev.block)
            elif ev.code in stake.STAKE_EVENTS and getattr(ev, "verifier", None) == self.account:
                staked = True  # not `relevant`: the kill point "event_ingested" is a challenge's
                self._stake_event(conn, ev, now)
            elif isinstance(ev, P.RemarkIgnored):
                count_ignored(conn, ev.reason if ev.reason in IGNORE_REASONS else "other")
                log_event(log, "remark_ignored", block=ev.block, position=ev.position, origin=ev.origin,
                          reason=ev.reason, detail=ev.detail)
            elif isinstance(ev, BlockWorkFailed):
                # The determinism alarm of the follower: the protocol failed on its own work at
                # this block. It was undone and the node goes on; every honest node records the
                # same event, so a node that records it alone computes differently.
                count_block_fault(conn, ev.stage)
                log_event(log, "block_work_failed", level=logging.ERROR, block=ev.block, stage=ev.stage,
                          subject=ev.subject, error_type=ev.error_type,
                          detail="protocol work failed inside the protocol: undone and recorded, the node goes on")
            elif isinstance(ev, P.CallRefused) and ev.refusal == P.ProtocolError.code:
                count_ignored(conn, "apply_fault")
                log_event(log, "call_failed", level=logging.ERROR, block=ev.block, origin=ev.origin, call=ev.call,
                          reason=ev.reason)
            elif isinstance(ev, P.CallRefused) and ev.origin == self.account:
                # The refusal does not name the challenge; the deadlines settle the tx's fate.
                log_event(log, "call_refused", level=logging.WARNING, call=ev.call, refusal=ev.refusal,
                          reason=ev.reason, block=ev.block)
                if ev.call == EscalateChallenge.NAME:
                    log_event(log, "escalation_refused", level=logging.ERROR, refusal=ev.refusal, reason=ev.reason,
                              block=ev.block, detail="the chain refused this node's escalation; it is not sent "
                                                     "again once its window closes")
                if ev.call == BondVerifier.NAME:
                    # Sending it again would be refused again: wait for a restart or a reconnect.
                    stake.clear_bond(conn)
                    self._bond_due = False
                    log_event(log, "bond_refused", level=logging.ERROR, refusal=ev.refusal, reason=ev.reason,
                              detail="the node will not bond again before a restart or a reconnect")
        assert self.view is not None
        mine = self._stake_of(self.view.state)
        if staked or mine != self._stake_saved:
            # seats reserve and free collateral at issuance and resolution, not only at stake events
            stake.save_stake(conn, self.account, self.view.state, target=self.bond_target())
            self._stake_saved = mine
        return relevant

    def _stake_of(self, state: ProtocolState) -> tuple[Any, ...]:
        """What the stake panel shows of the chain's state for this account (changed: save it)."""
        a = self.account
        return (state.vbonds.get(a, 0), state.reserved.get(a, 0), state.paid.get(a, 0), state.slashed.get(a, 0),
                tuple(map(tuple, state.unbonding.get(a, []))))

    def _stake_event(self, conn: Connection, ev: P.Event, now: float) -> None:
        """A bond, unbonding, release or penalty of this node's account."""
        stake.record_event(conn, ev)
        if isinstance(ev, VerifierBonded):
            stake.clear_bond(conn)
            log_event(log, "bond_confirmed", account=self.account, amount=ev.amount, bond=ev.bond, block=ev.block)
        elif isinstance(ev, VerifierUnbonding):
            log_event(log, "bond_unbonding", account=self.account, amount=ev.amount, bond=ev.bond,
                      release_block=ev.release_block)
        elif isinstance(ev, BondReleased):
            log_event(log, "bond_released", account=self.account, amount=ev.amount, block=ev.block)
        elif isinstance(ev, VerifierPenalized):
            conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id).values(
                penalty=func.coalesce(challenges.c.penalty, 0) + ev.amount, penalty_why=ev.why, updated_at=now))
            log_event(log, "verifier_penalized", level=logging.WARNING, challenge_id=_hex(ev.challenge_id),
                      amount=ev.amount, why=ev.why, block=ev.block)
        elif isinstance(ev, VerifierPaid):
            log_event(log, "verifier_paid", challenge_id=_hex(ev.challenge_id), amount=ev.amount, why=ev.why,
                      block=ev.block)
        elif isinstance(ev, EscalationSettled):
            outcome = "forfeited" if ev.forfeited else "returned"
            conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id)
                         .values(escalation=outcome, updated_at=now))
            log_event(log, "escalation_settled", level=logging.WARNING if ev.forfeited else logging.INFO,
                      challenge_id=_hex(ev.challenge_id), returned=ev.returned, forfeited=ev.forfeited,
                      block=ev.block)

    def _resolved(self, conn: Connection, ev: P.ChallengeResolved, now: float) -> bool:
        job = self._job(conn, ev.challenge_id)
        if job is None:
            return False
        assert self.view is not None
        ch = self.view.state.challenges.get(ev.challenge_id)
        revealed = ch is not None and self.account in ch.reveals
        in_winning = None
        if revealed and ev.winning_value is not None:
            # The winning cluster is one witness PAIR: a reveal whose value half equals the
            # winning value but whose proof half differs (a lazy copy of H(leaf t)) is an outlier.
            in_winning = self.account not in ev.outliers
        winning = ev.winning_value.hex() if isinstance(ev.winning_value, bytes) else (
            None if ev.winning_value is None else str(ev.winning_value))
        stage = lifecycle.resolved_stage(job.stage)
        stopped = stage != Stage.DONE
        values: dict[str, Any] = {}
        again = None
        if ev.rechallenge is not None:
            # an escalated round jumps to the dispute round: the view holds the next round already
            nxt = self.view.state.challenges.get(ev.rechallenge)
            rnd = nxt.round if nxt is not None else ev.round + 1
            how = "escalated to the dispute round" if ch is not None and ch.escalations else "re-challenged"
            again = f"{how} as {ev.rechallenge.hex()[:16]} (round {rnd})"
            values.update(rechallenge=ev.rechallenge,
                          status=f"{job.status}; {again}" if stopped and job.status else again)
        conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id).values(
            verdict=ev.verdict, verdict_reason=ev.reason, resolved_block=ev.block, winning_value=winning,
            in_winning_cluster=in_winning, outlier=self.account in ev.outliers, stage=stage, updated_at=now,
            **values))
        conn.execute(update(txs).where(and_(txs.c.challenge_id == ev.challenge_id, txs.c.verifier == self.account,
                                            txs.c.state.in_(("unstarted", "in_progress", "unconfirmed"))))
                     .values(state="failed", last_error="the challenge resolved first", updated_at=now))
        if not stopped:
            self._log_stage(conn, ev.challenge_id, RESOLUTION, job.updated_at, now,
                            f"{ev.verdict}: {ev.reason}" + (f"; {again}" if again else ""))
        log_event(log, "challenge_resolved", challenge_id=_hex(ev.challenge_id), verdict=ev.verdict,
                  reason=ev.reason, round=ev.round, rechallenge=_hex(ev.rechallenge),
                  in_winning_cluster=in_winning, outlier=self.account in ev.outliers)
        for path in self._paths(ev.challenge_id):
            path.unlink(missing_ok=True)
            path.with_name(path.name + ".part").unlink(missing_ok=True)
        return True

    # --- database helpers ----------------------------------------------------------------------
    @staticmethod
    def _job(conn: Connection, cid: bytes):
        return conn.execute(select(challenges).where(challenges.c.challenge_id == cid)).first()

    @staticmethod
    def _log_stage(conn: Connection, cid: bytes, stage: str, started: float, finished: float | None,
                   detail: str | None = None) -> None:
        conn.execute(stage_log.insert().values(challenge_id=cid, stage=stage, started_at=started,
                                               finished_at=finished, detail=(detail or "")[:4000] or None))

    def _advance(self, conn: Connection, cid: bytes, frm: str, to: str, now: float, detail: str) -> None:
        job = self._job(conn, cid)
        if job is None or job.stage != frm:
            return
        conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid, challenges.c.stage == frm))
                     .values(stage=to, updated_at=now))
        self._log_stage(conn, cid, frm, job.updated_at, now, detail)

    def _set(self, cid: bytes, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(challenges.c.challenge_id == cid)
                         .values(updated_at=time.time(), **values))

    def _jobs(self, stages: tuple[Stage, ...]) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(challenges).where(challenges.c.stage.in_(stages))
                                     .order_by(challenges.c.commit_deadline, challenges.c.challenge_id)))

    def _facts(self, job) -> ChainFacts:
        with self.engine.connect() as conn:
            run = conn.execute(select(runs).where(runs.c.run_id == job.run_id)).one()
        return ChainFacts(expected_digest=bytes(job.opening_digest), run_id=bytes(job.run_id), step=job.step,
                          spec_digest=bytes(run.spec_digest), dataset_hash=bytes(run.dataset_hash),
                          schedule_commitment=bytes(run.schedule_commitment),
                          initial_hash=bytes(run.initial_hash), root=bytes(job.root), size=job.size)

    @staticmethod
    def _mirrors(job) -> tuple[str, ...]:
        try:
            mirrors = json.loads(job.opening_mirrors or "[]")
        except ValueError:
            return ()
        return tuple(m for m in mirrors if isinstance(m, str))

    def _paths(self, cid: bytes) -> tuple[Path, Path]:
        return (self.openings.path / f"{cid.hex()}.opening", self.openings.path / "leaves" / f"{cid.hex()}.cbor")

    # --- the pipeline ---------------------------------------------------------------------------
    def _work_jobs(self) -> list[Any]:
        """Jobs at a work stage with their run's miner, earliest commit deadline first."""
        with self.engine.connect() as conn:
            return list(conn.execute(
                select(challenges, runs.c.miner).select_from(
                    challenges.outerjoin(runs, runs.c.run_id == challenges.c.run_id))
                .where(challenges.c.stage.in_(WORK_STAGES))
                .order_by(challenges.c.commit_deadline, challenges.c.challenge_id)))

    def _owners(self, job) -> tuple[str, ...]:
        """Who a job's work counts against: the run's miner and the prover server it is fetched from,
        one key per server whatever the URL's spelling (node.fetch.endpoint_owners), with the
        addresses its name last resolved to."""
        try:
            url = job.opening_uri if urlsplit(job.opening_uri or "").netloc else job.endpoint
        except ValueError:  # an unparsable URL: the fetch refuses it; it still counts once, by miner
            url = ""
        return (f"miner:{job.miner}", *endpoint_owners(url or "", self.policy.egress.slots.known))

    def _miner_store(self, job):
        """The openings store as this job's miner sees it: its share, counted over its challenges' files."""
        with self.engine.connect() as conn:
            cids = conn.execute(select(challenges.c.challenge_id).select_from(
                challenges.join(runs, runs.c.run_id == challenges.c.run_id)).where(runs.c.miner == job.miner)).scalars()
            return self.openings.for_miner(f"miner:{job.miner}", [bytes(c).hex() for c in cids])

    def schedule(self) -> None:
        """Start the next piece of work of jobs that have none running, round-robin across miners.

        A miner with `max_jobs_per_miner` jobs running (or abandoned and not yet ended) waits; so
        does an endpoint. Each piece of work gets its budget from the blocks left in the commit window.
        """
        ready = []
        for job in self._work_jobs():
            cid = bytes(job.challenge_id)
            if cid in self.tasks or self.replays.running(cid):
                continue
            act = lifecycle.due(lifecycle.JobState.of(job), self.head, time.time())
            if isinstance(act, lifecycle.Miss):
                self._miss(job, act.reason)
            elif isinstance(act, lifecycle.Ready):
                ready.append(job)
            elif act is not None:  # the witness: _witness makes the choice (a test fault's comes first)
                self._witness(job)
                self._send_wake.set()
        threads_free = self.cfg.schedule.stage_threads - len(self.tasks)
        replays_free = self.replays.free()
        for job in round_robin(ready, key=lambda j: str(j.miner), after=self._rr_last):
            if threads_free <= 0 and replays_free <= 0:
                break
            stage = Stage(job.stage)
            if (replays_free if stage == Stage.REPLAY else threads_free) <= 0:
                continue
            here = stage != Stage.REPLAY or self.cluster or self._paths(bytes(job.challenge_id))[0].exists()
            moved = lifecycle.placement(stage, opening_here=here, cluster=self.cluster)
            if moved is not None:  # fetched by a cluster worker before this node switched to its local pool
                self._set(bytes(job.challenge_id), stage=moved.to, status=moved.reason)
                continue
            owners = self._owners(job)
            if not self.in_flight.admits(owners):
                continue
            budget = self.budgets.budget(stage, head=self.head, commit_deadline=job.commit_deadline,
                                         clock=self.clock)
            act = lifecycle.start(lifecycle.JobState.of(job), self.head, budget)
            if isinstance(act, lifecycle.Miss):
                self._miss(job, act.reason)
                continue
            if isinstance(act, lifecycle.Advance):  # fetches that failed and may have passed: it stands
                self._refuse_fetch(job, act.reason or "")
                continue
            if stage == Stage.REPLAY:
                self._start_replay(job, owners, budget)
                replays_free -= 1
            else:
                self._start_stage(job, stage, owners, budget)
                threads_free -= 1
            self.in_flight.add(owners)
            self._rr_last = str(job.miner)

    def _start_stage(self, job, stage: Stage, owners: tuple[str, ...], budget: float) -> None:
        cid = bytes(job.challenge_id)
        deadline = time.monotonic() + budget
        opening_path, leaves_path = self._paths(cid)
        part = None
        if stage == Stage.FETCH:
            # Each request of this fetch stays inside the budget, and the stream stops when it ends.
            policy = replace(self.policy, connect_timeout_s=min(self.policy.connect_timeout_s, budget),
                             read_timeout_s=min(self.policy.read_timeout_s, budget),
                             total_timeout_s=min(self.policy.total_timeout_s, budget))
            part = opening_path.with_name(opening_path.name + ".part")
            fut = _run_on_thread(
                "pot-fetch", stage_fetch, uri=job.opening_uri, endpoint=job.endpoint, run_id=bytes(job.run_id),
                dest=opening_path, leaves_dest=leaves_path, max_opening_bytes=self.cfg.fetch.max_opening_bytes,
                max_leaves_bytes=self.cfg.fetch.max_leaves_bytes, policy=policy,
                stop=lambda: self.stop.is_set() or time.monotonic() > deadline, facts=self._facts(job),
                store=self._miner_store(job), manifest_only=self.cluster, mirrors=self._mirrors(job),
                owner=f"miner:{job.miner}")
        elif stage == Stage.VALIDATE:
            fut = _run_on_thread("pot-validate", stage_validate, opening_path, self._facts(job),
                                 max_bytes=self.cfg.fetch.max_opening_bytes)
        else:
            fut = _run_on_thread("pot-losschecks", stage_losschecks, leaves_path, root=bytes(job.root),
                                 size=job.size, config=self.loss_config)
        self.tasks[cid] = _Task(stage, fut, owners, time.time(), deadline, budget, part)

    def _start_replay(self, job, owners: tuple[str, ...], budget: float) -> None:
        cid = bytes(job.challenge_id)
        remote = None
        if self.cluster:
            from node.cluster import RemoteOpening, fallback_resources, replay_resources

            spec = self.cluster_specs.get(cid)
            size = job.opening_bytes or 0
            res = replay_resources(spec, size) if spec is not None else fallback_resources(size)
            remote = RemoteOpening(job.opening_uri, job.endpoint, self.policy, res, mirrors=self._mirrors(job))
        self.replays.start(cid, self._paths(cid)[0], self._facts(job), max_bytes=self.cfg.fetch.max_opening_bytes,
                           timeout_s=budget, remote=remote)
        self.replay_owners[cid] = owners
        self._set(cid, status="replaying", attempts=job.attempts + 1)
        log_event(log, "replay_started", challenge_id=cid.hex(), step=job.step, budget_s=round(budget, 1))

    def _miss(self, job, why: str) -> None:
        cid = bytes(job.challenge_id)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(challenges.c.challenge_id == cid)
                         .values(stage=Stage.MISSED, status=why, updated_at=now))
            self._log_stage(conn, cid, job.stage, job.updated_at, now, why)
        self.stage_failures.pop(cid, None)
        self.fetch_retries.pop(cid, None)
        log_event(log, "challenge_missed", level=logging.WARNING, challenge_id=cid.hex(), stage=job.stage, reason=why)

    def collect(self) -> None:
        """Persist the results of finished stage threads and replay processes; end overrun work."""
        now = time.monotonic()
        for cid, task in list(self.tasks.items()):
            if task.future.done():
                del self.tasks[cid]
                self.in_flight.remove(task.owners)
                self._finished(cid, task)
            elif now > task.deadline:
                # A thread cannot be killed: the job moves on without it, and its owners keep the
                # slot until it ends (a fetch sees its `stop` at the next chunk or read timeout).
                del self.tasks[cid]
                self.abandoned.append((cid, task))
                self._overran(cid, task)
        for item in list(self.abandoned):
            cid, task = item
            if task.future.done():
                self.abandoned.remove(item)
                self.in_flight.remove(task.owners)
                if task.part is not None:
                    task.part.unlink(missing_ok=True)
                log_event(log, "abandoned_work_ended", challenge_id=cid.hex(), stage=task.stage,
                          overran_s=round(time.monotonic() - task.deadline, 1))
        for cid, msg in self.replays.poll():
            self.in_flight.remove(self.replay_owners.pop(cid, ()))
            self._persist_replay(cid, msg)

    def _finished(self, cid: bytes, task: _Task) -> None:
        stage = task.stage
        exc = task.future.exception()
        if exc is None:
            self.stage_failures.pop(cid, None)
            outcome = task.future.result()
            if not (outcome.stage == Stage.FETCH and not outcome.ok and outcome.data.get("retryable")
                    and self._retry_fetch(cid, outcome)):
                self.fetch_retries.pop(cid, None)
                self._persist(cid, outcome)
            return
        if isinstance(exc, FetchStopped):
            if self.stop.is_set():
                return  # shutting down: the job stays at fetch and resumes from its partial file
            self._overran(cid, task)  # its budget ran out between two passes of the loop
            if task.part is not None:
                task.part.unlink(missing_ok=True)
            return
        if is_input_error(exc):
            # The opening, spec or leaf list is bad: that ends this job's stage, once, never a retry.
            self.stage_failures.pop(cid, None)
            why = f"{stage} refused the input: {describe_error(exc)}"
            log_event(log, "stage_input_refused", level=logging.WARNING, challenge_id=cid.hex(), stage=stage,
                      error=describe_error(exc))
            self._persist(cid, self._refusal(stage, task.started_at, lifecycle.input_refusal(stage), why))
            return
        if isinstance(exc, OpeningsFull):
            # The node's own disk, not the miner's fault nor a bug: wait for room until the window closes.
            log_event(log, "openings_full", level=logging.WARNING, challenge_id=cid.hex(), error=str(exc)[:300])
            delay = lifecycle.STAGE_BACKOFF.delay(lifecycle.DISK_FULL_ATTEMPT)
            self._set(cid, next_attempt_at=time.time() + delay, status=str(exc)[:2000])
            return
        # A bug or a local fault (disk, memory): retry with backoff, a bounded number of times.
        failures = self.stage_failures[cid] = self.stage_failures.get(cid, 0) + 1
        error = describe_error(exc, 2000)
        log_event(log, "stage_error", level=logging.ERROR, challenge_id=cid.hex(), stage=stage, error=error,
                  attempt=failures, exc_info=exc)
        act = lifecycle.after_error(stage, failures, error, now=time.time(),
                                    jitter=lifecycle.STAGE_BACKOFF.rng.random(), limits=self.limits)
        if isinstance(act, lifecycle.RetryAt):
            self._set(cid, next_attempt_at=act.at, status=act.reason)
        else:
            self._miss_at(cid, stage, act.reason)

    def _miss_at(self, cid: bytes, stage: Stage, why: str) -> None:
        """Miss the job if it is still at `stage` (its work may have been moved on from)."""
        with self.engine.connect() as conn:
            job = self._job(conn, cid)
        if job is not None and job.stage == stage:
            self._miss(job, why)

    @staticmethod
    def _refusal(stage: Stage, started: float, refusal_class: str | None, why: str) -> StageOutcome:
        """The outcome of a stage that refused its input (`refusal_class`), or of loss checks that
        could not run (None: a finding; the replay goes on)."""
        if refusal_class is None:
            return StageOutcome(stage, started, time.time(), data={"ok": False, "error": why, "findings": []})
        return StageOutcome(stage, started, time.time(), ok=False, refusal_class=refusal_class, reason=why)

    def _retry_fetch(self, cid: bytes, o: StageOutcome) -> bool:
        """A fetch that failed for a reason that may pass: keep the job at fetch and try again after
        a backoff, if a retry would still get a useful budget (the commit margin kept); the failure
        is kept with the job, to be refused with if no retry serves. False: no room, refuse now."""
        with self.engine.connect() as conn:
            job = self._job(conn, cid)
        if job is None or job.stage != Stage.FETCH:
            return False
        attempt = self.fetch_retries.get(cid, 0)
        delay = self.budgets.retry_delay(head=self.head, commit_deadline=job.commit_deadline, clock=self.clock,
                                         attempt=attempt, backoff=lifecycle.FETCH_RETRY_BACKOFF,
                                         min_s=self.policy.connect_timeout_s)
        if delay is None:
            return False
        self.fetch_retries[cid] = attempt + 1
        act = lifecycle.fetch_retry(attempt, delay, o.reason, now=time.time())
        self._set(cid, next_attempt_at=act.at, refusal_class=o.refusal_class, refusal_reason=o.reason,
                  status=act.reason)
        with self.engine.begin() as conn:
            self._log_stage(conn, cid, Stage.FETCH, o.started_at, o.finished_at,
                            f"failed, retried in {delay:.1f} s: {o.reason}")
        log_event(log, "fetch_retry", level=logging.WARNING, challenge_id=cid.hex(), attempt=attempt + 1,
                  retry_in_s=round(delay, 2), reason=(o.reason or "")[:300])
        return True

    def _refuse_fetch(self, job, why: str) -> None:
        """The refusal a job's failed fetches leave, once no retry has room: committed like any other."""
        cid = bytes(job.challenge_id)
        self.fetch_retries.pop(cid, None)
        now = time.time()
        self._persist(cid, StageOutcome(Stage.FETCH, now, now, ok=False, refusal_class=job.refusal_class,
                                        reason=why[:4000]))

    def _overran(self, cid: bytes, task: _Task) -> None:
        """Work past its budget: a fetch refuses the opening as unavailable (the prover did not
        deliver in time); a validation is missed (nothing can be said of the opening); unfinished
        loss checks are a finding and the replay goes ahead."""
        stage, budget = task.stage, task.budget_s
        self.stage_failures.pop(cid, None)
        log_event(log, "stage_overran", level=logging.WARNING, challenge_id=cid.hex(), stage=stage,
                  budget_s=round(budget, 1))
        act = lifecycle.after_overrun(stage, budget)
        if isinstance(act, lifecycle.Miss):
            self._miss_at(cid, stage, act.reason)
        else:
            self._persist(cid, self._refusal(stage, task.started_at, act.refusal_class, act.reason or ""))

    def _persist(self, cid: bytes, o: StageOutcome) -> None:
        nxt = lifecycle.next_stage(o.stage, o.ok, cluster=self.cluster)
        values: dict[str, Any] = {}
        detail = o.reason
        if o.stage == Stage.FETCH and o.ok:
            # a failure kept from an earlier attempt (retried) is no longer the job's
            values.update(opening_path=str(self._paths(cid)[0]), opening_bytes=o.data.get("bytes"),
                          opening_source=o.data.get("url"), refusal_class=None, refusal_reason=None)
            detail = f"{o.data.get('bytes')} bytes from {o.data.get('url')}" + (
                f" after {len(o.data['tried'])} failed address(es): {'; '.join(o.data['tried'])}"
                if o.data.get("tried") else "") + (
                f"; leaves: {o.data['leaves_error']}" if "leaves_error" in o.data else "")
            if self.cluster:
                # the manifest only: a cluster worker fetches and validates the whole opening
                values["opening_path"] = None
                if o.data.get("spec") is not None:
                    self.cluster_specs[cid] = o.data["spec"]
                detail = (f"manifest of {o.data.get('bytes')} bytes checked at {o.data.get('url')}; "
                          f"the cluster fetches it") + (
                    f"; leaves: {o.data['leaves_error']}" if "leaves_error" in o.data else "")
        if o.stage == Stage.LOSSCHECKS:
            values["loss_checks"] = json.dumps(o.data, sort_keys=True)
            detail = "ok" if o.data.get("ok") else json.dumps(o.data.get("findings") or o.data.get("error"))
        if not o.ok:
            values.update(refusal_class=o.refusal_class, refusal_reason=o.reason)
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid, challenges.c.stage == o.stage))
                         .values(stage=nxt, updated_at=time.time(), **values))
            self._log_stage(conn, cid, o.stage, o.started_at, o.finished_at, detail)
        log_event(log, f"stage_{o.stage}", challenge_id=cid.hex(), ok=o.ok, refusal_class=o.refusal_class,
                  reason=o.reason, seconds=round(o.finished_at - o.started_at, 3))
        if o.stage in (Stage.FETCH, Stage.VALIDATE):
            self._maybe_kill({Stage.FETCH: "fetched", Stage.VALIDATE: "validated"}[o.stage])

    def _persist_replay(self, cid: bytes, msg: dict[str, Any]) -> None:
        now = time.time()
        if msg.get("ok"):
            self.cluster_specs.pop(cid, None)
        with self.engine.connect() as conn:
            job = self._job(conn, cid)
        if job is None or job.stage != Stage.REPLAY:
            return
        if not msg.get("ok"):
            # The process died or hung: not the opening's fault as far as we know. Retry, then give up.
            act = lifecycle.after_replay_failure(job.attempts, bool(msg.get("timeout")),
                                                 msg.get("reason", "replay failed"), now=now,
                                                 jitter=lifecycle.STAGE_BACKOFF.rng.random(), limits=self.limits)
            if isinstance(act, lifecycle.Miss):
                self._miss(job, act.reason)
            else:
                self._set(cid, status=act.reason, next_attempt_at=act.at)
            log_event(log, "replay_failed", level=logging.ERROR, challenge_id=cid.hex(), reason=msg.get("reason"))
            return
        r = msg.get("result")
        values: dict[str, Any] = {"stage": Stage.WITNESS, "updated_at": now, "status": None}
        if r is None and msg.get("refusal_class"):
            # a cluster worker's fetch or validation refused the opening: the refusal rule decides
            values.update(refusal_class=msg["refusal_class"], refusal_reason=msg.get("reason"))
            detail = f"{msg.get('refused_at')} on the cluster refused the opening: {msg.get('reason')}"
        elif r is None:
            values.update(refusal_class="replay_failed", refusal_reason=msg.get("reason"))
            detail = msg.get("reason")
        else:
            values.update(replay_leaf=r["leaf"], replay_state_digest=r["state_digest"], replay_loss_bits=r["loss_bits"],
                          norm_bucket=r["norm_bucket"], matches_leaf=bool(msg.get("matches")),
                          replay_proof_hash=r.get("proof_hash"))
            detail = "matches leaf t" if msg.get("matches") else msg.get("reason")
        if msg.get("url"):
            values["opening_source"] = msg["url"]
        if "worker" in msg:
            detail = f"{detail} (on {msg['worker']}: {msg.get('timings')})"
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid, challenges.c.stage == Stage.REPLAY))
                         .values(**values))
            self._log_stage(conn, cid, Stage.REPLAY, msg.get("started_at", job.updated_at), msg.get("finished_at", now),
                            detail)
        log_event(log, "stage_replay", challenge_id=cid.hex(), matches_leaf=msg.get("matches"),
                  reason=msg.get("reason") or None, worker=msg.get("worker"), timings=msg.get("timings"))
        self._maybe_kill("replayed")

    def _witness(self, job) -> None:
        """Choose the witness pair (replay, refusal rule, or a test fault) and journal it before any send."""
        cid = bytes(job.challenge_id)
        started = time.time()
        ch = self.view.state.challenges.get(cid) if self.view is not None else None
        forced = self.hooks.witness(challenge_id=cid, account=self.account, leaf_hash=bytes(job.leaf_hash or b""),
                                    declared_bucket=ch.declared_bucket if ch is not None else None)
        fault = "none" if forced is None else self.hooks.fault
        if forced is not None:
            value_hash, proof_hash, bucket = forced.value_hash, forced.proof_hash, forced.norm_bucket
        elif job.refusal_class:
            (value_hash, proof_hash), bucket = refused_pair(cid), REFUSED_BUCKET
        elif job.replay_proof_hash is None:
            # Replayed by a node older than the witness pair: the proof half needs the replay again.
            self._set(cid, stage=Stage.REPLAY, status="replayed without the proof hash; replaying again")
            return
        else:
            from commitments.leaves import witness_value_hash

            value_hash, proof_hash = witness_value_hash(bytes(job.replay_leaf)), bytes(job.replay_proof_hash)
            bucket = job.norm_bucket
        entry, inserted = journal.check_and_insert_witness(
            self.engine, challenge_id=cid, verifier=self.account, value_hash=value_hash, norm_bucket=bucket,
            salt=new_salt(), proof_hash=proof_hash, origin=self.account)
        # A repeat with another value: the journal recorded and logged the conflict; the
        # journaled entry is still the one this node commits to and sends.
        conflict = not inserted and journal.differs(entry, value_hash, bucket, proof_hash)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid, challenges.c.stage == Stage.WITNESS))
                         .values(stage=Stage.COMMIT, value_hash=entry.value_hash, norm_bucket=entry.norm_bucket,
                                 proof_hash=entry.proof_hash, fault=None if fault == "none" else fault,
                                 updated_at=now))
            self._log_stage(conn, cid, Stage.WITNESS, started, now,
                            f"value {entry.value_hash.hex()[:16]} proof {(_hex(entry.proof_hash) or '-')[:16]}"
                            f" bucket {entry.norm_bucket}"
                            + ("" if inserted else " (already journaled)")
                            + (f"; DETERMINISM CONFLICT: recomputed value {value_hash.hex()[:16]} proof "
                               f"{proof_hash.hex()[:16]} bucket {bucket}" if conflict else ""))
        log_event(log, "witness_journaled", challenge_id=cid.hex(), value_hash=entry.value_hash.hex(),
                  proof_hash=_hex(entry.proof_hash), norm_bucket=entry.norm_bucket, inserted=inserted,
                  conflict=conflict, refusal_class=job.refusal_class, fault=fault)
        self._maybe_kill("journaled")

    # --- transactions ---------------------------------------------------------------------------
    def _sender_loop(self) -> None:
        """Send journaled commits and reveals on a connection of its own, woken by the main loop
        (a new head, a new witness) or every loop interval: never behind a fetch, a replay or ingest."""
        transport: Transport | None = None
        failures = 0
        while not self.stop.is_set():
            self._send_wake.wait(self.cfg.node.loop_interval_s)
            self._send_wake.clear()
            if self.stop.is_set():
                break
            try:
                if transport is None:
                    transport = connect_transport(self.cfg, self.secrets)
                self.send_txs(transport, transport.finalized_head())
                failures = 0
            except Exception as exc:  # the sender never dies: a broken connection is rebuilt
                failures += 1
                delay = lifecycle.SEND_BACKOFF.delay(failures)
                log_event(log, "sender_error", level=logging.ERROR, error=describe_error(exc, 2000),
                          retry_in_s=round(delay, 2), exc_info=True)
                if isinstance(exc, TransportError) and transport is not None:
                    try:
                        transport.close()
                    except Exception:  # a broken connection may fail to close; it is dropped either way
                        pass
                    transport = None
                self.stop.wait(delay)
        if transport is not None:
            try:
                transport.close()
            except Exception:
                pass

    def send_txs(self, transport: Transport, head: int) -> None:
        """One pass over the jobs at commit or reveal, then the journaled escalations: send what is
        due inside its window."""
        self._send_commits_and_reveals(transport, head)
        self._send_escalations(transport, head)

    def _send_escalations(self, transport: Transport, head: int) -> None:
        """Journaled escalate_challenge calls not yet on chain: each is sent (again after
        resend_after_blocks) while it can land in its round's escalation window, and fails once
        the window has closed. The job itself stays where it is: the round resolves regardless."""
        with self.engine.connect() as conn:
            rows = list(conn.execute(
                select(challenges).select_from(txs.join(challenges, challenges.c.challenge_id == txs.c.challenge_id))
                .where(txs.c.kind == "escalate", txs.c.verifier == self.account,
                       txs.c.state.in_(("unstarted", "in_progress", "unconfirmed")))
                .order_by(challenges.c.escalate_deadline, txs.c.id)))
        for job in rows:
            if self.stop.is_set():
                return
            cid = bytes(job.challenge_id)
            tx = journal.get_tx(self.engine, cid, self.account, "escalate")
            if tx is None or tx.state in ("confirmed", "failed"):
                continue
            view = self.view
            ch = view.state.challenges.get(cid) if view is not None else None
            if ch is not None and self.account in ch.escalations:
                continue  # the ingest of its block confirms it
            if job.escalate_deadline is None or head >= job.escalate_deadline:
                with self.engine.begin() as conn:
                    journal.set_tx_state(conn, tx.id, "failed", last_error="the escalation window closed")
                    conn.execute(update(challenges).where(challenges.c.challenge_id == cid)
                                 .values(escalation="missed", updated_at=time.time()))
                log_event(log, "escalation_missed", level=logging.WARNING, challenge_id=cid.hex(), head=head,
                          escalate_deadline=job.escalate_deadline,
                          detail="the escalation was not on chain when its window closed")
                continue
            if head < job.reveal_deadline:
                continue  # escalations open after the reveal window
            due = (tx.state == "unstarted" or tx.id not in self.sent_here
                   or head - (tx.sent_block or 0) >= self.cfg.chain.resend_after_blocks)
            if due:
                timeout = Budgets.send_budget(head=head, deadline=job.escalate_deadline, clock=self.clock,
                                              cap_s=self.cfg.chain.submit_timeout_s)
                self._send(transport, head, job, tx, timeout)

    def _send_commits_and_reveals(self, transport: Transport, head: int) -> None:
        """The jobs at commit or reveal: send what is due inside its window."""
        for job in self._jobs((Stage.COMMIT, Stage.REVEAL)):
            if self.stop.is_set():
                return
            cid = bytes(job.challenge_id)
            kind = job.stage
            tx = journal.get_tx(self.engine, cid, self.account, kind)
            ev = lifecycle.SendPass(head, "none") if tx is None else lifecycle.SendPass(
                head, tx.state, str(tx.last_error), tx.origin, self.account,
                commit_on_chain=kind == "commit" and tx.state != "confirmed" and self._commit_on_chain(cid),
                resend_due=tx.state == "unstarted" or tx.id not in self.sent_here
                or head - (tx.sent_block or 0) >= self.cfg.chain.resend_after_blocks)
            for act in lifecycle.send_decision(lifecycle.JobState.of(job), ev, time.time()):
                if isinstance(act, lifecycle.FailTx) and tx is not None:
                    with self.engine.begin() as conn:
                        journal.set_tx_state(conn, tx.id, "failed", last_error=act.reason)
                elif isinstance(act, lifecycle.Miss):
                    self._miss(job, act.reason)
                elif isinstance(act, lifecycle.SendTx) and tx is not None:
                    deadline = job.commit_deadline if kind == "commit" else job.reveal_deadline
                    timeout = Budgets.send_budget(head=head, deadline=deadline, clock=self.clock,
                                                  cap_s=self.cfg.chain.submit_timeout_s)
                    self._send(transport, head, job, tx, timeout)

    def _commit_on_chain(self, cid: bytes) -> bool:
        # Read from the sender thread: the main loop may swap or drop the view meanwhile; a stale
        # answer costs at most one resend of the same bytes, or one pass of waiting.
        view = self.view
        if view is None:
            return False
        ch = view.state.challenges.get(cid)
        return ch is not None and self.account in ch.commitments

    def _send(self, transport: Transport, head: int, job, tx: journal.TxRecord, timeout: float) -> None:
        cid = bytes(job.challenge_id)
        journal.mark_in_progress(self.engine, tx.id, head)
        self.sent_here.add(tx.id)
        try:
            receipt = transport.submit_payloads([tx.payload], wait=False, timeout=max(1.0, timeout))
        except TransportError as exc:
            journal.mark_send_error(self.engine, tx.id, str(exc))
            self._set(cid, next_attempt_at=time.time() + lifecycle.SEND_BACKOFF.delay(tx.sends + 1))
            log_event(log, "tx_send_failed", level=logging.WARNING, challenge_id=cid.hex(), kind=tx.kind,
                      error=str(exc))
            return
        self._maybe_kill(f"{tx.kind}_sent")
        journal.mark_unconfirmed(self.engine, tx.id, receipt.tx_hash)
        log_event(log, "tx_sent", challenge_id=cid.hex(), kind=tx.kind, sends=tx.sends + 1, head=head,
                  tx_hash=_hex(receipt.tx_hash))


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT ask the loop to finish its pass and shut down cleanly."""
    def handler(signum, _frame) -> None:
        log_event(log, "signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


__all__ = ["StartupError", "VerifierNode", "connect_transport", "install_signal_handlers"]
