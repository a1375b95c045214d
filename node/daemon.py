"""The verifier daemon: follow finalized blocks, run each challenge's pipeline, commit and reveal.

One loop owns the database: it ingests blocks (events, jobs and the cursor in one transaction per
block), hands stage work to threads (fetch, validate, loss checks) and to replay processes, and
sends journaled txs. A watchdog rebuilds the chain connection when blocks stop arriving.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Connection, Engine

from chain import protocol as P
from chain.protocol import ProtocolState, SnapshotError
from chain.transport import Block, Transport, TransportError
from chain.view import ChainView
from challenges.losschecks import LossCheckConfig
from challenges.refused import REFUSED_BUCKET, refused_value_hash
from challenges.witness import new_salt
from commitments.files import make_private_dir
from commitments.retry import Backoff
from node import journal
from node.config import NodeConfig, Secrets
from node.db import chain_cursor, chain_events, challenges, runs, stage_log, txs
from node.fetch import FetchPolicy
from node.logs import log_event
from node.pipeline import ChainFacts, ReplayPool, StageOutcome, stage_fetch, stage_losschecks, stage_validate
from node.stages import NEXT_STAGE, RESOLUTION, WORK_STAGES, Stage

log = logging.getLogger("node.daemon")

MAX_REPLAY_ATTEMPTS = 3
# Retry delays, full jitter (commitments.retry): the main loop after an error, a stage thread or
# replay that failed, a tx the chain connection did not take.
LOOP_BACKOFF = Backoff(0.5, 30.0)
STAGE_BACKOFF = Backoff(1.0, 5.0)
SEND_BACKOFF = Backoff(0.5, 3.0)


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
                 stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.secrets = secrets
        self.engine = engine
        self.params = cfg.protocol.params()
        self.stop = stop or threading.Event()
        self.data_dir = cfg.data_dir
        make_private_dir(self.data_dir)  # 0700 when new: it holds the database and downloads
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
        self.threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pot-stage")
        self.tasks: dict[bytes, tuple[str, Future]] = {}
        self.replays = ReplayPool(cfg.replay.workers, cfg.replay.timeout_s)
        self.sent_here: set[int] = set()  # tx ids this process has sent (others: maybe sent before a crash)
        self.last_block_at = time.monotonic()
        self.failures = 0
        self._confirmed_commit = False
        self.stage_failures: dict[bytes, int] = {}  # stage thread errors in a row, per job (retry backoff)

    # --- start-up -----------------------------------------------------------------------------
    def start(self) -> None:
        """Connect and load the view; refuses a chain or parameters the database does not match."""
        self.transport = connect_transport(self.cfg, self.secrets)
        self.account = self.transport.account
        recorded = self.transport.protocol_params()
        if recorded is not None and recorded != self.params:
            raise StartupError(
                f"the chain records protocol parameters {recorded.to_dict()}, this node's [protocol] section "
                f"gives {self.params.to_dict()}; they must be equal")
        self.view = self._load_view()
        with self.engine.connect() as conn:  # downloads left by challenges that are over
            self.openings.prune({bytes(r[0]).hex() for r in conn.execute(
                select(challenges.c.challenge_id).where(challenges.c.stage.in_(WORK_STAGES)))})
        log_event(log, "node_started", account=self.account, chain=self.cfg.chain.url, cursor=self.view.cursor,
                  database=self.engine.url.render_as_string(hide_password=True), fault=self.cfg.node.fault)

    def _load_view(self) -> ChainView:
        assert self.transport is not None
        with self.engine.connect() as conn:
            row = conn.execute(select(chain_cursor).where(chain_cursor.c.id == 1)).first()
        if row is None:
            start = self.cfg.chain.start_block
            return ChainView(self.transport, self.params, cursor=start, keep_events=False)
        try:
            state = ProtocolState.from_cbor(bytes(row.snapshot))
        except SnapshotError as exc:
            raise StartupError(f"the database's protocol snapshot is unusable: {exc}") from None
        if row.block_hash is not None:
            head = self.transport.finalized_head()
            if head < row.block:
                raise StartupError(f"the database follows this chain up to block {row.block}, but the chain's "
                                   f"finalized head is {head}: a different or reset chain")
            if self.transport.block(row.block).hash != bytes(row.block_hash):
                raise StartupError(f"block {row.block} of this chain differs from the one in the database: "
                                   f"the database belongs to another chain")
        try:
            view = ChainView(self.transport, self.params, cursor=row.block, state=state, keep_events=False)
        except SnapshotError:
            raise StartupError("the database was built with other protocol parameters than [protocol] gives") from None
        view.cursor_hash = bytes(row.block_hash) if row.block_hash is not None else None
        return view

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
        self.last_block_at = time.monotonic()

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        self.start()
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
        """One pass: ingest new blocks, move jobs, send txs, watch the connection."""
        self.ingest()
        self.collect()
        self.schedule()
        self.send_txs()
        if time.monotonic() - self.last_block_at > self.cfg.chain.watchdog_s:
            self._reconnect(f"no new finalized block for {self.cfg.chain.watchdog_s:g} s")

    def shutdown(self) -> None:
        self.stop.set()
        self.threads.shutdown(wait=True, cancel_futures=True)
        self.replays.shutdown()
        if self.transport is not None:
            try:
                self.transport.close()
            except Exception:
                pass
        log_event(log, "node_stopped", account=self.account)

    def _maybe_kill(self, point: str) -> None:
        """Test fault: die like a power cut right after `point` became durable."""
        if self.cfg.node.fault_kill_at == point:
            log_event(log, "fault_kill", level=logging.WARNING, point=point)
            for h in logging.getLogger().handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)

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
                    self._save_cursor(conn, block)
            except BaseException:
                self.view = None  # its state ran ahead of the database: rebuild from the cursor
                raise
            self.last_block_at = time.monotonic()
            n += 1
            if relevant:
                self._maybe_kill("event_ingested")
            if self._confirmed_commit:
                self._maybe_kill("commit_confirmed")
        return n

    def _save_cursor(self, conn: Connection, block: Block) -> None:
        assert self.view is not None
        values = dict(block=block.number, block_hash=block.hash, snapshot=self.view.state.to_cbor(),
                      updated_at=time.time())
        if conn.execute(update(chain_cursor).where(chain_cursor.c.id == 1).values(**values)).rowcount == 0:
            conn.execute(chain_cursor.insert().values(id=1, **values))

    def _apply_events(self, conn: Connection, block: Block, events: list[P.Event]) -> bool:
        """Record a block's events and turn them into job changes. True if one concerned our jobs."""
        relevant = False
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
                conn.execute(challenges.insert().values(
                    challenge_id=ev.challenge_id, run_id=ev.run_id, idx=ev.index, step=ev.step, root=ev.root,
                    size=ev.size, mode=ev.mode, endpoint=ev.endpoint, issued_block=ev.block,
                    opening_deadline=ev.opening_deadline, commit_deadline=ev.commit_deadline,
                    reveal_deadline=ev.reveal_deadline, stage=Stage.SKIPPED if own else Stage.AWAITING_OPENING,
                    status="our own run: a miner cannot witness its challenge" if own else None,
                    attempts=0, next_attempt_at=0.0, created_at=now, updated_at=now))
                relevant = True
                log_event(log, "challenge_issued", challenge_id=_hex(ev.challenge_id), step=ev.step,
                          commit_deadline=ev.commit_deadline, reveal_deadline=ev.reveal_deadline)
            elif isinstance(ev, P.OpeningSubmitted):
                job = self._job(conn, ev.challenge_id)
                if job is not None and job.stage == Stage.AWAITING_OPENING:
                    conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id).values(
                        opening_digest=ev.opening_digest, opening_uri=ev.uri, leaf=ev.leaf, leaf_hash=ev.leaf_hash,
                        opening_block=ev.block, stage=Stage.FETCH, updated_at=now))
                    self._log_stage(conn, ev.challenge_id, Stage.AWAITING_OPENING, job.created_at, now,
                                    f"opening on chain at block {ev.block}")
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
            elif isinstance(ev, P.CallRefused) and ev.origin == self.account:
                # The refusal does not name the challenge; the deadlines settle the tx's fate.
                log_event(log, "call_refused", level=logging.WARNING, call=ev.call, refusal=ev.refusal,
                          reason=ev.reason, block=ev.block)
        return relevant

    def _resolved(self, conn: Connection, ev: P.ChallengeResolved, now: float) -> bool:
        job = self._job(conn, ev.challenge_id)
        if job is None:
            return False
        assert self.view is not None
        ch = self.view.state.challenges.get(ev.challenge_id)
        revealed = ch is not None and self.account in ch.reveals
        in_winning = None
        if revealed and ev.winning_value is not None:
            value_hash, bucket = ch.reveals[self.account]
            in_winning = (value_hash if ev.mode == "value" else bucket) == ev.winning_value
        winning = ev.winning_value.hex() if isinstance(ev.winning_value, bytes) else (
            None if ev.winning_value is None else str(ev.winning_value))
        stage = job.stage if job.stage in (Stage.SKIPPED, Stage.MISSED) else Stage.DONE
        conn.execute(update(challenges).where(challenges.c.challenge_id == ev.challenge_id).values(
            verdict=ev.verdict, verdict_reason=ev.reason, resolved_block=ev.block, winning_value=winning,
            in_winning_cluster=in_winning, outlier=self.account in ev.outliers, stage=stage, updated_at=now))
        conn.execute(update(txs).where(and_(txs.c.challenge_id == ev.challenge_id, txs.c.verifier == self.account,
                                            txs.c.state.in_(("unstarted", "in_progress", "unconfirmed"))))
                     .values(state="failed", last_error="the challenge resolved first", updated_at=now))
        if job.stage not in (Stage.SKIPPED, Stage.MISSED):
            self._log_stage(conn, ev.challenge_id, RESOLUTION, job.updated_at, now, f"{ev.verdict}: {ev.reason}")
        log_event(log, "challenge_resolved", challenge_id=_hex(ev.challenge_id), verdict=ev.verdict,
                  reason=ev.reason, in_winning_cluster=in_winning, outlier=self.account in ev.outliers)
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

    def _paths(self, cid: bytes) -> tuple[Path, Path]:
        return (self.openings.path / f"{cid.hex()}.opening", self.openings.path / "leaves" / f"{cid.hex()}.cbor")

    # --- the pipeline ---------------------------------------------------------------------------
    def schedule(self) -> None:
        """Start the next piece of work of every job that has none running."""
        for job in self._jobs(WORK_STAGES):
            cid = bytes(job.challenge_id)
            if cid in self.tasks or self.replays.running(cid) or time.time() < job.next_attempt_at:
                continue
            if self.head >= job.commit_deadline:
                self._miss(job, "the commit window closed before a witness value was ready")
                continue
            opening_path, leaves_path = self._paths(cid)
            if job.stage == Stage.FETCH:
                self._submit(cid, Stage.FETCH, stage_fetch, uri=job.opening_uri, endpoint=job.endpoint,
                             run_id=bytes(job.run_id), dest=opening_path, leaves_dest=leaves_path,
                             max_opening_bytes=self.cfg.fetch.max_opening_bytes,
                             max_leaves_bytes=self.cfg.fetch.max_leaves_bytes, policy=self.policy,
                             stop=self.stop.is_set, facts=self._facts(job), store=self.openings)
            elif job.stage == Stage.VALIDATE:
                self._submit(cid, Stage.VALIDATE, stage_validate, opening_path, self._facts(job),
                             max_bytes=self.cfg.fetch.max_opening_bytes)
            elif job.stage == Stage.LOSSCHECKS:
                self._submit(cid, Stage.LOSSCHECKS, stage_losschecks, leaves_path, root=bytes(job.root), size=job.size,
                             config=self.loss_config)
            elif job.stage == Stage.REPLAY:
                if self.replays.free() > 0:
                    self.replays.start(cid, opening_path, self._facts(job), max_bytes=self.cfg.fetch.max_opening_bytes)
                    self._set(cid, status="replaying", attempts=job.attempts + 1)
                    log_event(log, "replay_started", challenge_id=cid.hex(), step=job.step)
            elif job.stage == Stage.WITNESS:
                self._witness(job)

    def _submit(self, cid: bytes, stage: Stage, fn, *args: Any, **kw: Any) -> None:
        self.tasks[cid] = (stage, self.threads.submit(fn, *args, **kw))

    def _miss(self, job, why: str) -> None:
        cid = bytes(job.challenge_id)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(challenges.c.challenge_id == cid)
                         .values(stage=Stage.MISSED, status=why, updated_at=now))
            self._log_stage(conn, cid, job.stage, job.updated_at, now, why)
        log_event(log, "challenge_missed", level=logging.WARNING, challenge_id=cid.hex(), stage=job.stage, reason=why)

    def collect(self) -> None:
        """Persist the results of finished stage threads and replay processes."""
        for cid, (stage, fut) in list(self.tasks.items()):
            if not fut.done():
                continue
            del self.tasks[cid]
            try:
                outcome: StageOutcome = fut.result()
            except Exception as exc:  # a bug or an odd file: retry the stage later, with backoff
                log_event(log, "stage_error", level=logging.ERROR, challenge_id=cid.hex(), stage=stage,
                          error=f"{type(exc).__name__}: {exc}")
                failures = self.stage_failures[cid] = self.stage_failures.get(cid, 0) + 1
                self._set(cid, next_attempt_at=time.time() + STAGE_BACKOFF.delay(failures),
                          status=f"{stage} failed: {type(exc).__name__}: {exc}"[:2000])
                continue
            self.stage_failures.pop(cid, None)
            self._persist(cid, outcome)
        for cid, msg in self.replays.poll():
            self._persist_replay(cid, msg)

    def _persist(self, cid: bytes, o: StageOutcome) -> None:
        nxt = NEXT_STAGE[o.stage]
        values: dict[str, Any] = {}
        detail = o.reason
        if o.stage == Stage.FETCH and o.ok:
            values.update(opening_path=str(self._paths(cid)[0]), opening_bytes=o.data.get("bytes"))
            detail = f"{o.data.get('bytes')} bytes from {o.data.get('url')}" + (
                f"; leaves: {o.data['leaves_error']}" if "leaves_error" in o.data else "")
        if o.stage == Stage.LOSSCHECKS:
            values["loss_checks"] = json.dumps(o.data, sort_keys=True)
            detail = "ok" if o.data.get("ok") else json.dumps(o.data.get("findings") or o.data.get("error"))
        if not o.ok:
            nxt = Stage.WITNESS
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
        with self.engine.connect() as conn:
            job = self._job(conn, cid)
        if job is None or job.stage != Stage.REPLAY:
            return
        if not msg.get("ok"):
            # The process died or hung: not the opening's fault as far as we know. Retry, then give up.
            if msg.get("timeout") or job.attempts >= MAX_REPLAY_ATTEMPTS:
                self._miss(job, msg.get("reason", "replay failed"))
            else:
                self._set(cid, status=f"replay attempt {job.attempts} failed: {msg.get('reason')}"[:2000],
                          next_attempt_at=now + STAGE_BACKOFF.delay(job.attempts))
            log_event(log, "replay_failed", level=logging.ERROR, challenge_id=cid.hex(), reason=msg.get("reason"))
            return
        r = msg.get("result")
        values: dict[str, Any] = {"stage": Stage.WITNESS, "updated_at": now, "status": None}
        if r is None:
            values.update(refusal_class="replay_failed", refusal_reason=msg.get("reason"))
            detail = msg.get("reason")
        else:
            values.update(replay_leaf=r["leaf"], replay_state_digest=r["state_digest"], replay_loss_bits=r["loss_bits"],
                          norm_bucket=r["norm_bucket"], matches_leaf=bool(msg.get("matches")))
            detail = "matches leaf t" if msg.get("matches") else msg.get("reason")
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid, challenges.c.stage == Stage.REPLAY))
                         .values(**values))
            self._log_stage(conn, cid, Stage.REPLAY, msg.get("started_at", job.updated_at), msg.get("finished_at", now),
                            detail)
        log_event(log, "stage_replay", challenge_id=cid.hex(), matches_leaf=msg.get("matches"),
                  reason=msg.get("reason") or None)
        self._maybe_kill("replayed")

    def _witness(self, job) -> None:
        """Choose the value (replay, refusal rule, or the test fault) and journal it before any send."""
        cid = bytes(job.challenge_id)
        started = time.time()
        fault = self.cfg.node.fault
        if fault == "noise":
            value_hash, bucket = os.urandom(32), random.randint(-(2**31) + 1, 2**31 - 1)
        elif job.refusal_class:
            value_hash, bucket = refused_value_hash(cid, job.refusal_class), REFUSED_BUCKET
        else:
            from commitments.leaves import witness_value_hash

            value_hash = witness_value_hash(bytes(job.replay_leaf))
            bucket = job.norm_bucket
        entry, inserted = journal.check_and_insert_witness(
            self.engine, challenge_id=cid, verifier=self.account, value_hash=value_hash, norm_bucket=bucket,
            salt=new_salt(), origin=self.account)
        # A repeat with another value: the journal recorded and logged the conflict; the
        # journaled entry is still the one this node commits to and sends.
        conflict = not inserted and journal.differs(entry, value_hash, bucket)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(update(challenges).where(and_(challenges.c.challenge_id == cid, challenges.c.stage == Stage.WITNESS))
                         .values(stage=Stage.COMMIT, value_hash=entry.value_hash, norm_bucket=entry.norm_bucket,
                                 fault=None if fault == "none" else fault, updated_at=now))
            self._log_stage(conn, cid, Stage.WITNESS, started, now,
                            f"value {entry.value_hash.hex()[:16]} bucket {entry.norm_bucket}"
                            + ("" if inserted else " (already journaled)")
                            + (f"; DETERMINISM CONFLICT: recomputed value {value_hash.hex()[:16]} bucket {bucket}"
                               if conflict else ""))
        log_event(log, "witness_journaled", challenge_id=cid.hex(), value_hash=entry.value_hash.hex(),
                  norm_bucket=entry.norm_bucket, inserted=inserted, conflict=conflict,
                  refusal_class=job.refusal_class, fault=fault)
        self._maybe_kill("journaled")

    # --- transactions ---------------------------------------------------------------------------
    def send_txs(self) -> None:
        for job in self._jobs((Stage.COMMIT, Stage.REVEAL)):
            cid = bytes(job.challenge_id)
            kind = job.stage
            tx = journal.get_tx(self.engine, cid, self.account, kind)
            if tx is None:
                self._miss(job, f"no journaled {kind} tx for this account")
                continue
            if tx.state == "confirmed":
                continue
            if tx.state == "failed":
                self._miss(job, f"{kind} failed: {tx.last_error}")
                continue
            if tx.origin != self.account:
                self._miss(job, f"the {kind} was journaled for {tx.origin!r}; this node signs as {self.account!r}")
                continue
            if kind == "commit" and self._commit_on_chain(cid):
                continue  # the ingest of its block confirms it
            if kind == "commit" and self.head >= job.commit_deadline:
                self._fail_tx(job, tx, "the commit window closed")
                continue
            if kind == "reveal":
                if self.head < job.commit_deadline:
                    continue  # reveals open after the commit window
                if self.head >= job.reveal_deadline:
                    self._fail_tx(job, tx, "the reveal window closed")
                    continue
            due = (tx.state == "unstarted" or tx.id not in self.sent_here
                   or self.head - (tx.sent_block or 0) >= self.cfg.chain.resend_after_blocks)
            if due and time.time() >= job.next_attempt_at:
                self._send(job, tx)

    def _commit_on_chain(self, cid: bytes) -> bool:
        assert self.view is not None
        ch = self.view.state.challenges.get(cid)
        return ch is not None and self.account in ch.commitments

    def _fail_tx(self, job, tx: journal.TxRecord, why: str) -> None:
        with self.engine.begin() as conn:
            journal.set_tx_state(conn, tx.id, "failed", last_error=why)
        self._miss(job, why)

    def _send(self, job, tx: journal.TxRecord) -> None:
        assert self.transport is not None
        cid = bytes(job.challenge_id)
        journal.mark_in_progress(self.engine, tx.id, self.head)
        self.sent_here.add(tx.id)
        try:
            receipt = self.transport.submit_payloads([tx.payload], wait=False, timeout=self.cfg.chain.submit_timeout_s)
        except TransportError as exc:
            journal.mark_send_error(self.engine, tx.id, str(exc))
            self._set(cid, next_attempt_at=time.time() + SEND_BACKOFF.delay(tx.sends + 1))
            log_event(log, "tx_send_failed", level=logging.WARNING, challenge_id=cid.hex(), kind=tx.kind,
                      error=str(exc))
            return
        self._maybe_kill(f"{tx.kind}_sent")
        journal.mark_unconfirmed(self.engine, tx.id, receipt.tx_hash)
        log_event(log, "tx_sent", challenge_id=cid.hex(), kind=tx.kind, sends=tx.sends + 1, head=self.head,
                  tx_hash=_hex(receipt.tx_hash))


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT ask the loop to finish its pass and shut down cleanly."""
    def handler(signum, _frame) -> None:
        log_event(log, "signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


__all__ = ["StartupError", "VerifierNode", "connect_transport", "install_signal_handlers"]
