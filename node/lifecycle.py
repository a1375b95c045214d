"""A challenge's life in this node as a pure state machine: `step(state, event, now, limits)` gives
the job's next state and the actions the daemon's driver runs. No I/O, no clock, no randomness:
the time is `now`, a full-jitter draw comes in the event as `jitter` in [0, 1), and what only the
driver can measure (the stage budget from the block clock, the fetch retry's room) comes in the
event too.

The rules are today's daemon's (node/daemon.py), each decision function naming the method it
stands for; the daemon calls these same functions, so the two cannot disagree:

    issued -> awaiting_opening -> fetch -> validate -> losschecks -> replay -> witness -> commit
    -> reveal -> revealed -> done; skipped (own run, not seated); missed (a window closed first,
    or the node's own failures ran out of attempts).

A failure of the input (a parser raised, a fetch refused) is a refusal: the job goes on to the
witness with a refusal class. A failure that may pass (a fetch's transient error, the node's own
bug or disk, a replay process that died) is retried with backoff a bounded number of times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from challenges.refused import fetch_refusal_class
from commitments.retry import Backoff
from node.stages import NEXT_STAGE, STOPPED, WORK_STAGES, Stage

# Replay attempts (a process that died or hung, not a timeout) before the job is missed.
MAX_REPLAY_ATTEMPTS = 3
# Retry delays, full jitter (commitments.retry): a stage thread or replay that failed; between
# fetches of one opening that failed for a reason that may pass; a tx the chain connection did not take.
STAGE_BACKOFF = Backoff(1.0, 5.0)
FETCH_RETRY_BACKOFF = Backoff(1.0, 20.0)
SEND_BACKOFF = Backoff(0.5, 3.0)
# The backoff attempt a full openings store waits as (VerifierNode._finished).
DISK_FULL_ATTEMPT = 3


def jittered(backoff: Backoff, attempt: int, jitter: float) -> float:
    """`backoff.delay(attempt)` with the uniform draw given: `Random.uniform(0, w)` is `w * random()`."""
    return backoff.window(attempt) * jitter


@dataclass(frozen=True)
class Limits:
    """The configuration the rules read: `[schedule] stage_attempts`, the replay backend (a cluster
    worker fetches and validates the opening itself), and a test fault that skips all work."""

    stage_attempts: int = 3
    max_replay_attempts: int = MAX_REPLAY_ATTEMPTS
    cluster: bool = False
    skips_work: bool = False


@dataclass(frozen=True)
class JobState:
    """The fields of a `challenges` row (and the daemon's memory of it) that decide what comes next."""

    stage: Stage
    commit_deadline: int
    reveal_deadline: int
    attempts: int = 0  # replays started (challenges.attempts)
    next_attempt_at: float = 0.0
    refusal_class: str | None = None
    refusal_reason: str | None = None
    has_proof_hash: bool = True  # a replay result carries the proof half (older nodes' did not)
    stage_failures: int = 0  # VerifierNode.stage_failures: errors in a row of this node's own
    fetch_retries: int = 0  # VerifierNode.fetch_retries: fetch failures that may pass, retried
    running: bool = False  # stage work or a replay is running (VerifierNode.tasks, replays.running)
    status: str | None = None

    @classmethod
    def of(cls, row, *, stage_failures: int = 0, fetch_retries: int = 0, running: bool = False) -> JobState:
        """The state of a `challenges` row (node.db), with what the daemon keeps of it in memory."""
        return cls(Stage(row.stage), row.commit_deadline, row.reveal_deadline, attempts=row.attempts,
                   next_attempt_at=row.next_attempt_at, refusal_class=row.refusal_class,
                   refusal_reason=row.refusal_reason, has_proof_hash=row.replay_proof_hash is not None,
                   stage_failures=stage_failures, fetch_retries=fetch_retries, running=running,
                   status=row.status)

    @property
    def over(self) -> bool:
        return self.stage in STOPPED


# --- events: what the daemon observes ------------------------------------------------------------
class Outcome(StrEnum):
    OK = "ok"
    REFUSED = "refused"  # the stage refused the input (StageOutcome ok=False, or a cluster refusal)
    RETRYABLE = "retryable"  # a fetch failure that may pass (StageOutcome.data["retryable"])
    INPUT_ERROR = "input_error"  # a parser raised (scheduler.is_input_error)
    TRANSIENT = "transient"  # a bug or a local fault; a replay process that died
    DISK_FULL = "disk_full"  # the openings store is full (fetch.OpeningsFull)
    OVERRAN = "overran"  # past its budget (a replay: the pool's timeout)
    STOPPED = "stopped"  # a fetch that saw the node's stop: it resumes from its partial file


@dataclass(frozen=True)
class Issued:
    own_run: bool
    seated: bool
    commit_deadline: int
    reveal_deadline: int


@dataclass(frozen=True)
class OpeningOnChain:
    pass


@dataclass(frozen=True)
class Tick:
    """A schedule pass: the finalized head, and the budget the job's stage would get if started now
    (Budgets.budget); `opening_here`: the opening file is on this machine (for a local replay)."""

    head: int
    budget: float
    opening_here: bool = True


@dataclass(frozen=True)
class WorkFinished:
    stage: Stage
    outcome: Outcome
    refusal_class: str | None = None
    reason: str = ""
    retry_delay: float | None = None  # RETRYABLE: Budgets.retry_delay (None: no retry has room)
    jitter: float = 1.0
    budget_s: float = 0.0  # OVERRAN: the budget it ran past


@dataclass(frozen=True)
class WitnessJournaled:
    pass


@dataclass(frozen=True)
class SendPass:
    """The sender's pass over a job at commit or reveal: the journaled tx's state ("none": no tx
    for this account), whether it was journaled for this account, whether the commit is on chain
    already, and whether a send is due (unstarted, not sent by this process, or resend_after_blocks)."""

    head: int
    tx_state: str = "unstarted"
    tx_error: str = ""
    origin: str = ""  # the account the tx was journaled for
    account: str = ""  # the account this node signs as
    commit_on_chain: bool = False
    resend_due: bool = True


@dataclass(frozen=True)
class SendFailed:
    sends: int  # sends before this one (TxRecord.sends)
    jitter: float = 1.0


@dataclass(frozen=True)
class CommitConfirmed:
    pass


@dataclass(frozen=True)
class RevealConfirmed:
    pass


@dataclass(frozen=True)
class Resolved:
    pass


@dataclass(frozen=True)
class Stop:
    pass


Event = (
    Issued
    | OpeningOnChain
    | Tick
    | WorkFinished
    | WitnessJournaled
    | SendPass
    | SendFailed
    | CommitConfirmed
    | RevealConfirmed
    | Resolved
    | Stop
)


# --- actions: what the driver does ---------------------------------------------------------------
@dataclass(frozen=True)
class StartWork:
    stage: Stage
    budget: float


@dataclass(frozen=True)
class Advance:
    """Record the stage's outcome and move the job to `to` (a refusal class goes with it)."""

    frm: Stage
    to: Stage
    refusal_class: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class RetryAt:
    at: float
    reason: str


@dataclass(frozen=True)
class Miss:
    reason: str


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class JournalWitness:
    pass


@dataclass(frozen=True)
class Ready:
    """Not an action: schedule's first pass found the job ready for its stage's work."""


@dataclass(frozen=True)
class SendTx:
    kind: Stage  # COMMIT or REVEAL


@dataclass(frozen=True)
class FailTx:
    """Mark the journaled tx failed (its window closed); a Miss follows."""

    reason: str


@dataclass(frozen=True)
class MarkDone:
    pass


@dataclass(frozen=True)
class GiveBackAttempt:
    """A replay the stop ended does not count against the replay attempts."""


Action = (
    StartWork
    | Advance
    | RetryAt
    | Miss
    | Skip
    | JournalWitness
    | SendTx
    | FailTx
    | MarkDone
    | GiveBackAttempt
)


# --- the rules, one per daemon decision ----------------------------------------------------------
def issued_stage(own_run: bool, seated: bool, round_: int) -> tuple[Stage, str | None]:
    """VerifierNode._apply_events, ChallengeIssued: the job's first stage and status."""
    if own_run:
        return Stage.SKIPPED, "our own run: a miner cannot witness its challenge"
    if not seated:
        return Stage.SKIPPED, f"not on this challenge's committee (round {round_})"
    return Stage.AWAITING_OPENING, None


def opening_stage(skips_work: bool) -> Stage:
    """VerifierNode._apply_events, OpeningSubmitted: a lazy test fault goes straight to the witness."""
    return Stage.WITNESS if skips_work else Stage.FETCH


def resolved_stage(stage: Stage) -> Stage:
    """VerifierNode._resolved: a resolved job is done unless it was skipped or missed."""
    return stage if stage in (Stage.SKIPPED, Stage.MISSED) else Stage.DONE


def next_stage(stage: Stage, ok: bool, *, cluster: bool) -> Stage:
    """VerifierNode._persist: the stage after a thread stage's outcome. A refusal goes to the
    witness; a fetch on a cluster checked the manifest only, and the worker validates."""
    if not ok:
        return Stage.WITNESS
    if stage == Stage.FETCH and cluster:
        return Stage.LOSSCHECKS
    return NEXT_STAGE[stage]


def due(state: JobState, head: int, now: float) -> Miss | JournalWitness | Advance | Ready | None:
    """VerifierNode.schedule, first pass over a job with no work running: None when it is not due
    (a retry's time not come); a miss once the commit window closed; at the witness, the journal
    (VerifierNode._witness: a replay without the proof half, from an older node, is replayed
    again); else Ready for its stage's work."""
    if state.running or now < state.next_attempt_at:
        return None
    if head >= state.commit_deadline:
        return Miss("the commit window closed before a witness value was ready")
    if state.stage == Stage.WITNESS:
        if not state.refusal_class and not state.has_proof_hash:
            return Advance(
                Stage.WITNESS, Stage.REPLAY, reason="replayed without the proof hash; replaying again"
            )
        return JournalWitness()
    return Ready()


def placement(stage: Stage, *, opening_here: bool, cluster: bool) -> Advance | None:
    """VerifierNode.schedule, second pass, before the job's owners are asked for room: a replay for
    the local pool whose opening a cluster worker fetched (it is not here) is fetched again."""
    if stage == Stage.REPLAY and not cluster and not opening_here:
        return Advance(
            stage,
            Stage.FETCH,
            reason="the opening was fetched on the cluster; fetching it for the local pool",
        )
    return None


def start(state: JobState, head: int, budget: float) -> Miss | Advance | StartWork:
    """VerifierNode.schedule, second pass, once the job's miner and endpoint have room: start the
    stage with `budget`, unless too little of the window is left (a fetch retried until now then
    refuses with the failure kept, any other stage is missed)."""
    stage = state.stage
    if budget <= 0 and stage == Stage.FETCH and state.refusal_class:
        return Advance(
            stage,
            Stage.WITNESS,
            state.refusal_class,
            f"{state.refusal_reason} (retried until the commit window's last safe moment)",
        )
    if budget <= 0:
        return Miss(
            f"{state.commit_deadline - head} block(s) left in the commit window: too late to start {stage}"
        )
    return StartWork(stage, budget)


def input_refusal(stage: Stage) -> str | None:
    """VerifierNode._finished: the refusal class of a parser's error at `stage` (None at the loss
    checks: the leaf list only feeds the secondary checks, a finding, and the replay goes on)."""
    if stage == Stage.LOSSCHECKS:
        return None
    return fetch_refusal_class("bad_uri") if stage == Stage.FETCH else "malformed"


def after_error(
    stage: Stage, failures: int, error: str, *, now: float, jitter: float, limits: Limits
) -> Miss | RetryAt:
    """VerifierNode._finished: a bug or a local fault, the `failures`-th in a row: retried with
    backoff until `[schedule] stage_attempts`, then the job is missed with the error."""
    if failures >= limits.stage_attempts:
        return Miss(f"{stage} failed {failures} times; last: {error}"[:2000])
    return RetryAt(now + jittered(STAGE_BACKOFF, failures, jitter), f"{stage} failed: {error}"[:2000])


def after_replay_failure(
    attempts: int, timeout: bool, reason: str, *, now: float, jitter: float, limits: Limits
) -> Miss | RetryAt:
    """VerifierNode._persist_replay: a replay whose process died or hung. Past its budget, or
    after `max_replay_attempts` attempts started, the job is missed; else it is retried."""
    if timeout or attempts >= limits.max_replay_attempts:
        return Miss(reason)
    return RetryAt(
        now + jittered(STAGE_BACKOFF, attempts, jitter), f"replay attempt {attempts} failed: {reason}"[:2000]
    )


def fetch_retry(retries: int, delay: float, reason: str | None, *, now: float) -> RetryAt:
    """VerifierNode._retry_fetch: retry `retries + 1` of a fetch that failed for a reason that may
    pass, after `delay` (Budgets.retry_delay: the backoff cut to the latest safe moment)."""
    why = f"fetch attempt {retries + 1} failed, retrying in {delay:.1f} s: {reason}"
    return RetryAt(now + delay, why[:2000])


def after_overrun(stage: Stage, budget_s: float) -> Advance | Miss:
    """VerifierNode._overran: a fetch past its budget refuses the opening as unavailable; loss
    checks past theirs are a finding and the replay goes on; any other stage is missed."""
    if stage == Stage.FETCH:
        return Advance(
            stage,
            Stage.WITNESS,
            fetch_refusal_class("unreachable"),
            f"the opening did not arrive within the fetch budget of {budget_s:.1f} s",
        )
    if stage == Stage.LOSSCHECKS:
        return Advance(stage, Stage.REPLAY, reason=f"the loss checks did not finish within {budget_s:.1f} s")
    return Miss(f"{stage} did not finish within its budget of {budget_s:.1f} s")


def send_decision(state: JobState, ev: SendPass, now: float) -> list[Action]:
    """VerifierNode._send_commits_and_reveals: what the sender does with a job at commit or reveal."""
    kind = state.stage
    if ev.tx_state == "none":
        return [Miss(f"no journaled {kind} tx for this account")]
    if ev.tx_state == "confirmed":
        return []
    if ev.tx_state == "failed":
        return [Miss(f"{kind} failed: {ev.tx_error}")]
    if ev.origin != ev.account:
        return [Miss(f"the {kind} was journaled for {ev.origin!r}; this node signs as {ev.account!r}")]
    if kind == Stage.COMMIT and ev.commit_on_chain:
        return []  # the ingest of its block confirms it
    if kind == Stage.COMMIT and ev.head >= state.commit_deadline:
        return [FailTx("the commit window closed"), Miss("the commit window closed")]
    if kind == Stage.REVEAL:
        if ev.head < state.commit_deadline:
            return []  # reveals open after the commit window
        if ev.head >= state.reveal_deadline:
            return [FailTx("the reveal window closed"), Miss("the reveal window closed")]
    if ev.resend_due and now >= state.next_attempt_at:
        return [SendTx(kind)]
    return []


# --- the machine ---------------------------------------------------------------------------------
def issue(ev: Issued, round_: int = 0) -> tuple[JobState, list[Action]]:
    """The job an issued challenge makes."""
    stage, status = issued_stage(ev.own_run, ev.seated, round_)
    state = JobState(stage, ev.commit_deadline, ev.reveal_deadline, status=status)
    return state, ([Skip(status or "")] if stage == Stage.SKIPPED else [])


def _apply(state: JobState, act: Action) -> JobState:
    """The state after the driver ran `act`."""
    if isinstance(act, Miss):
        return replace(
            state, stage=Stage.MISSED, status=act.reason, running=False, stage_failures=0, fetch_retries=0
        )
    if isinstance(act, RetryAt):
        return replace(state, next_attempt_at=act.at, status=act.reason, running=False)
    if isinstance(act, Advance):
        values: dict = {"stage": act.to, "running": False}
        if act.frm == Stage.FETCH and act.to != Stage.FETCH:
            values["fetch_retries"] = 0
        if act.to == Stage.WITNESS and act.refusal_class is not None:
            values.update(refusal_class=act.refusal_class, refusal_reason=act.reason)
        elif act.frm == Stage.FETCH and act.to in (Stage.VALIDATE, Stage.LOSSCHECKS):
            values.update(refusal_class=None, refusal_reason=None)  # a kept failure is no longer the job's
        elif act.frm == Stage.REPLAY and act.to == Stage.WITNESS:
            values["has_proof_hash"] = True  # this node's replay results carry the proof half
        return replace(state, **values)
    if isinstance(act, StartWork):
        attempts = state.attempts + 1 if act.stage == Stage.REPLAY else state.attempts
        return replace(state, running=True, attempts=attempts)
    return state  # JournalWitness: the journal's answer is the WitnessJournaled event


def _run(state: JobState, acts: list[Action]) -> tuple[JobState, list[Action]]:
    for act in acts:
        state = _apply(state, act)
    return state, acts


def step(
    state: JobState, event: Event, now: float, limits: Limits = Limits()
) -> tuple[JobState, list[Action]]:
    """The job's next state and the driver's actions for `event` at wall-clock time `now`."""
    if state.over:
        return state, []  # a stopped job moves no further (a resolution of skipped/missed keeps it)
    if isinstance(event, Stop):
        if state.running and state.stage == Stage.REPLAY and state.attempts > 0:
            return replace(state, running=False, attempts=state.attempts - 1), [GiveBackAttempt()]
        return replace(state, running=False), []
    if isinstance(event, Resolved):
        return replace(state, stage=resolved_stage(state.stage), running=False), [MarkDone()]
    if isinstance(event, OpeningOnChain):
        if state.stage != Stage.AWAITING_OPENING:
            return state, []
        nxt = opening_stage(limits.skips_work)
        return _run(state, [Advance(Stage.AWAITING_OPENING, nxt)])
    if isinstance(event, Tick):
        if state.stage not in WORK_STAGES:
            return state, []
        first = due(state, event.head, now)
        if not isinstance(first, Ready):
            return _run(state, [] if first is None else [first])
        moved = placement(state.stage, opening_here=event.opening_here, cluster=limits.cluster)
        return _run(state, [moved or start(state, event.head, event.budget)])
    if isinstance(event, WitnessJournaled):
        if state.stage != Stage.WITNESS:
            return state, []
        return _run(state, [Advance(Stage.WITNESS, Stage.COMMIT)])
    if isinstance(event, WorkFinished):
        return _finished(state, event, now, limits)
    if isinstance(event, SendPass):
        if state.stage not in (Stage.COMMIT, Stage.REVEAL):
            return state, []
        return _run(state, send_decision(state, event, now))
    if isinstance(event, SendFailed):
        if state.stage not in (Stage.COMMIT, Stage.REVEAL):
            return state, []
        at = now + jittered(SEND_BACKOFF, event.sends + 1, event.jitter)
        return replace(state, next_attempt_at=at), [RetryAt(at, "send failed")]
    if isinstance(event, CommitConfirmed):
        if state.stage != Stage.COMMIT:
            return state, []
        return _run(state, [Advance(Stage.COMMIT, Stage.REVEAL)])
    if isinstance(event, RevealConfirmed):
        if state.stage != Stage.REVEAL:
            return state, []
        return _run(state, [Advance(Stage.REVEAL, Stage.REVEALED)])
    raise TypeError(f"not a lifecycle event: {event!r}")


def _finished(state: JobState, ev: WorkFinished, now: float, limits: Limits) -> tuple[JobState, list[Action]]:
    """VerifierNode._finished / _persist_replay / _overran: a stage's work ended."""
    if not state.running or ev.stage != state.stage:
        return state, []  # work the job moved on from (abandoned, or persisted already)
    stage, out = ev.stage, ev.outcome
    ok_state = replace(state, stage_failures=0)
    if stage == Stage.REPLAY:
        if out == Outcome.OK:
            return _run(state, [Advance(stage, Stage.WITNESS)])
        if out in (Outcome.REFUSED, Outcome.INPUT_ERROR):
            return _run(
                state, [Advance(stage, Stage.WITNESS, ev.refusal_class or "replay_failed", ev.reason)]
            )
        over = out == Outcome.OVERRAN
        act = after_replay_failure(state.attempts, over, ev.reason, now=now, jitter=ev.jitter, limits=limits)
        return _run(state, [act])
    if out == Outcome.OK:
        return _run(ok_state, [Advance(stage, next_stage(stage, True, cluster=limits.cluster))])
    if out == Outcome.REFUSED:
        return _run(ok_state, [Advance(stage, Stage.WITNESS, ev.refusal_class, ev.reason)])
    if out == Outcome.RETRYABLE:
        # VerifierNode._retry_fetch: only a fetch is retried, while a retry has room; else it stands
        if stage != Stage.FETCH or ev.retry_delay is None:
            return _run(ok_state, [Advance(stage, Stage.WITNESS, ev.refusal_class, ev.reason)])
        kept = replace(ok_state, fetch_retries=state.fetch_retries + 1, refusal_class=ev.refusal_class,
                       refusal_reason=ev.reason)
        return _run(kept, [fetch_retry(state.fetch_retries, ev.retry_delay, ev.reason, now=now)])
    if out == Outcome.INPUT_ERROR:
        cls = input_refusal(stage)
        to = Stage.WITNESS if cls is not None else next_stage(stage, True, cluster=limits.cluster)
        return _run(ok_state, [Advance(stage, to, cls, f"{stage} refused the input: {ev.reason}")])
    if out == Outcome.STOPPED:
        return replace(state, running=False), []  # shutting down: it resumes from its partial file
    if out == Outcome.OVERRAN:
        return _run(ok_state, [after_overrun(stage, ev.budget_s)])
    if out == Outcome.DISK_FULL:
        return _run(state, [RetryAt(now + jittered(STAGE_BACKOFF, DISK_FULL_ATTEMPT, ev.jitter), ev.reason)])
    failures = state.stage_failures + 1
    act = after_error(stage, failures, ev.reason, now=now, jitter=ev.jitter, limits=limits)
    return _run(replace(state, stage_failures=failures), [act])


__all__ = [
    "DISK_FULL_ATTEMPT",
    "FETCH_RETRY_BACKOFF",
    "MAX_REPLAY_ATTEMPTS",
    "SEND_BACKOFF",
    "STAGE_BACKOFF",
    "Action",
    "Advance",
    "CommitConfirmed",
    "Event",
    "FailTx",
    "GiveBackAttempt",
    "Issued",
    "JobState",
    "JournalWitness",
    "Limits",
    "MarkDone",
    "Miss",
    "OpeningOnChain",
    "Outcome",
    "Ready",
    "Resolved",
    "RetryAt",
    "RevealConfirmed",
    "SendFailed",
    "SendPass",
    "SendTx",
    "Skip",
    "StartWork",
    "Stop",
    "Tick",
    "WitnessJournaled",
    "WorkFinished",
    "after_error",
    "after_overrun",
    "after_replay_failure",
    "due",
    "fetch_retry",
    "input_refusal",
    "issue",
    "issued_stage",
    "jittered",
    "next_stage",
    "opening_stage",
    "placement",
    "resolved_stage",
    "send_decision",
    "start",
    "step",
]
