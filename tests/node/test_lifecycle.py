"""node.lifecycle, the pure core of a challenge's life: random event sequences keep its invariants
(Hypothesis), and each transition is pinned by an example, with the daemon's own messages."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import lifecycle as L
from node.stages import STOPPED, WORK_STAGES, Stage

COMMIT_DL, REVEAL_DL = 20, 30
LIMITS = L.Limits(stage_attempts=3)


def fresh(stage: Stage = Stage.AWAITING_OPENING, **kw) -> L.JobState:
    return L.JobState(stage, COMMIT_DL, REVEAL_DL, **kw)


# --- random sequences ------------------------------------------------------------------------------
jitters = st.floats(0.0, 0.999)
ticks = st.builds(
    L.Tick,
    head=st.integers(0, COMMIT_DL - 1),
    budget=st.sampled_from([-1.0, 0.0, 0.5, 30.0, 30.0]),
    opening_here=st.booleans() | st.just(True),
)
# stage None: the stage the job is at when the event comes (work that finished is mostly the job's own)
own_work = st.builds(
    L.WorkFinished,
    stage=st.none(),
    outcome=st.sampled_from(list(L.Outcome)),
    reason=st.just("boom"),
    retry_delay=st.none() | st.just(1.0),
    jitter=jitters,
)
any_work = st.builds(
    L.WorkFinished,
    stage=st.sampled_from(WORK_STAGES),
    outcome=st.sampled_from(list(L.Outcome)),
    refusal_class=st.sampled_from([None, "unavailable", "malformed", "invalid"]),
    reason=st.sampled_from(["", "boom"]),
    retry_delay=st.none() | st.floats(0.0, 20.0),
    jitter=jitters,
    budget_s=st.floats(0.0, 60.0),
)
sends = st.builds(
    L.SendPass,
    head=st.integers(0, 35),
    tx_state=st.sampled_from(["none", "unstarted", "in_progress", "unconfirmed", "confirmed", "failed"])
    | st.just("unstarted"),
    origin=st.sampled_from(["me", "me", "other"]),
    account=st.just("me"),
    commit_on_chain=st.booleans(),
    resend_due=st.booleans(),
)
# (weight, events): a resolution or a stop ends or pauses the job, so they are rare and sequences get far
late = st.builds(L.Tick, head=st.integers(COMMIT_DL, 35), budget=st.sampled_from([0.0, 30.0]))
WEIGHTED = [
    (2, st.builds(L.OpeningOnChain)),
    (6, ticks),
    (1, late),
    (6, own_work),
    (1, any_work),
    (2, st.builds(L.WitnessJournaled)),
    (2, sends),
    (1, st.builds(L.SendFailed, sends=st.integers(0, 5), jitter=jitters)),
    (1, st.builds(L.CommitConfirmed)),
    (1, st.builds(L.RevealConfirmed)),
    (1, st.builds(L.Stop)),
    (1, st.builds(L.Resolved)),
]
noise = st.sampled_from([k for k, (w, _) in enumerate(WEIGHTED) for _ in range(w)]).flatmap(
    lambda k: WEIGHTED[k][1]
)


@dataclass(frozen=True)
class Natural:
    """Stands for the event a real driver would most likely report next, given the job's state."""

    outcome: L.Outcome
    head: int
    budget: float
    flip: bool


naturals = st.builds(
    Natural,
    outcome=st.sampled_from([*L.Outcome, *[L.Outcome.OK] * 8]),
    head=st.integers(0, COMMIT_DL - 1) | st.sampled_from([19, 20, 21, 29, 30, 31]),
    budget=st.sampled_from([0.0, 30.0, 30.0, 30.0]),
    flip=st.booleans(),
)
events = st.one_of(naturals, noise)


def natural(state: L.JobState, n: Natural, asked: bool):
    if state.running:
        return L.WorkFinished(
            state.stage,
            n.outcome,
            "unavailable",
            "boom",
            retry_delay=1.0 if n.flip else None,
            jitter=0.5,
            budget_s=3.0,
        )
    if state.stage == Stage.AWAITING_OPENING:
        return L.OpeningOnChain()
    if state.stage == Stage.WITNESS and asked:
        return L.WitnessJournaled()
    head = n.head
    if state.stage in WORK_STAGES:
        return L.Tick(head, n.budget, opening_here=n.flip or n.head % 2 == 0)
    if state.stage == Stage.COMMIT:
        return L.CommitConfirmed() if n.flip else L.SendPass(head)
    if state.stage == Stage.REVEAL:
        return (
            L.RevealConfirmed()
            if n.flip
            else L.SendPass(n.head + (COMMIT_DL if n.head < COMMIT_DL // 2 else 0))
        )
    return L.Resolved()


limits = st.builds(
    L.Limits,
    stage_attempts=st.integers(1, 4),
    max_replay_attempts=st.integers(1, 4),
    cluster=st.booleans(),
    skips_work=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    own=st.booleans(),
    seated=st.booleans() | st.just(True),
    lim=limits,
    start=st.none() | st.sampled_from([*WORK_STAGES, Stage.COMMIT, Stage.REVEAL]),
    seq=st.lists(st.tuples(events, st.floats(0.0, 3.0)), min_size=10, max_size=80),
)
def test_random_sequences_keep_the_invariants(own, seated, lim, start, seq):
    state, acts = L.issue(L.Issued(own, seated, COMMIT_DL, REVEAL_DL))
    assert (state.stage == Stage.SKIPPED) == (own or not seated)
    if start is not None:  # a job the node resumes at a later stage
        state = fresh(start)
    now = 0.0
    seen = (state.stage in (Stage.COMMIT, Stage.REVEAL), state.stage == Stage.REVEAL)
    asked = False
    for ev, dt in seq:
        now += dt
        if isinstance(ev, Natural):
            ev = natural(state, ev, asked)
        if isinstance(ev, L.WorkFinished) and ev.stage is None:
            ev = replace(ev, stage=state.stage)
        before = state
        state, acts = L.step(state, ev, now, lim)
        seen = check(before, ev, now, state, acts, lim, seen)
        asked = L.JournalWitness() in acts


def check(
    before: L.JobState, ev, now: float, state: L.JobState, acts: list, lim: L.Limits, seen: tuple[bool, bool]
) -> tuple[bool, bool]:
    """The invariants of one transition; `seen`: (a witness was journaled, a commit was confirmed)."""
    journaled, commit_confirmed = seen
    # a stopped job moves no further and asks for nothing
    if before.over:
        assert state == before and acts == []
        return seen
    for act in acts:
        if isinstance(act, L.Advance):
            assert act.frm == before.stage
            journaled |= act.frm == Stage.WITNESS and act.to == Stage.COMMIT
            commit_confirmed |= act.frm == Stage.COMMIT and act.to == Stage.REVEAL
        if isinstance(act, L.SendTx):
            assert act.kind == before.stage
            # a witness is journaled before any commit; a reveal only after a confirmed commit
            assert journaled
            assert act.kind == Stage.COMMIT or commit_confirmed
            assert act.kind == Stage.COMMIT or ev.head >= COMMIT_DL  # reveals open after the commit window
            # ... when it is due, and not before the backoff of a failed send
            assert isinstance(ev, L.SendPass) and ev.resend_due and now >= before.next_attempt_at
        if isinstance(act, L.StartWork):
            assert not before.running and act.budget > 0 and act.stage in WORK_STAGES
            assert act.stage != Stage.WITNESS
    # the actions and the new state say the same
    assert any(isinstance(a, L.Miss) for a in acts) == (state.stage == Stage.MISSED)
    assert any(isinstance(a, L.MarkDone) for a in acts) == (state.stage == Stage.DONE)
    # retries are bounded by the configured attempts
    assert state.stage_failures < lim.stage_attempts or state.stage == Stage.MISSED
    assert state.attempts <= lim.max_replay_attempts
    # every deadline ends the job: a work stage whose commit window closed, once it is due
    if (
        isinstance(ev, L.Tick)
        and before.stage in WORK_STAGES
        and not before.running
        and now >= before.next_attempt_at
        and ev.head >= COMMIT_DL
    ):
        assert state.stage == Stage.MISSED
    # ... and a commit or reveal whose window closed
    if (
        isinstance(ev, L.SendPass)
        and ev.tx_state != "confirmed"
        and not (before.stage == Stage.COMMIT and ev.commit_on_chain)
    ):
        if before.stage == Stage.COMMIT and ev.head >= COMMIT_DL:
            assert state.stage == Stage.MISSED
        if before.stage == Stage.REVEAL and ev.head >= REVEAL_DL:
            assert state.stage == Stage.MISSED
    # stop leaves the job resumable: the same stage, nothing running, no attempt used up
    if isinstance(ev, L.Stop):
        assert state.stage == before.stage and not state.running and state.attempts <= before.attempts
        assert state.stage not in STOPPED
        # a replay the stop ended runs again without counting against the replay attempts
        if before.running and before.stage == Stage.REPLAY and before.attempts > 0:
            assert state.attempts == before.attempts - 1
    if state.stage == Stage.COMMIT:
        assert journaled
    return journaled, commit_confirmed


def alphabet(state: L.JobState) -> list:
    """Every event the exhaustive walk tries from `state` (work that finished: the job's own stage)."""
    evs: list = [
        L.OpeningOnChain(),
        L.WitnessJournaled(),
        L.SendFailed(0, 0.5),
        L.CommitConfirmed(),
        L.RevealConfirmed(),
        L.Resolved(),
        L.Stop(),
    ]
    evs += [
        L.Tick(h, b, here)
        for h in (0, COMMIT_DL - 1, COMMIT_DL)
        for b in (0.0, 30.0)
        for here in (True, False)
    ]
    evs += [
        L.WorkFinished(state.stage, o, "unavailable", "boom", retry_delay=d, jitter=0.5, budget_s=3.0)
        for o in L.Outcome
        for d in (None, 1.0)
    ]
    evs += [
        L.SendPass(h, tx, commit_on_chain=c, resend_due=d)
        for h in (5, COMMIT_DL, REVEAL_DL)
        for tx in ("unstarted", "confirmed", "none")
        for c in (False, True)
        for d in (False, True)
    ]
    return evs


@pytest.mark.parametrize(
    "lim",
    [
        L.Limits(stage_attempts=1, max_replay_attempts=2),
        L.Limits(stage_attempts=2, max_replay_attempts=1, cluster=True),
    ],
    ids=str,
)
def test_every_reachable_state_keeps_the_invariants(lim):
    """Breadth first over every state reachable from an issued job, each event of the alphabet from
    each, with time passing (10 s, past every backoff) as one more event."""
    start, _ = L.issue(L.Issued(False, True, COMMIT_DL, REVEAL_DL))
    frontier = [(start, 0.0, (False, False))]
    visited = {frontier[0]}
    stages: set[Stage] = set()
    while frontier:
        nxt = []
        for state, now, seen in frontier:
            for ev in [*alphabet(state), None]:
                if ev is None:  # time passes; capped so that the walk ends
                    node = (state, min(now + 10.0, 40.0), seen)
                else:
                    new, acts = L.step(state, ev, now, lim)
                    node = (new, now, check(state, ev, now, new, acts, lim, seen))
                if node not in visited:
                    visited.add(node)
                    nxt.append(node)
                    stages.add(node[0].stage)
        frontier = nxt
    expected = {*WORK_STAGES, Stage.COMMIT, Stage.REVEAL, Stage.REVEALED, Stage.DONE, Stage.MISSED}
    assert stages >= expected - ({Stage.VALIDATE} if lim.cluster else set())  # a cluster worker validates
    assert len(visited) > 100


# --- examples: one per transition --------------------------------------------------------------------
def test_issued_seated_awaits_the_opening_and_others_are_skipped():
    assert L.issue(L.Issued(False, True, 1, 2))[0].stage == Stage.AWAITING_OPENING
    s, acts = L.issue(L.Issued(True, True, 1, 2))
    assert s.stage == Stage.SKIPPED and acts == [L.Skip("our own run: a miner cannot witness its challenge")]
    assert L.issued_stage(False, False, 2) == (Stage.SKIPPED, "not on this challenge's committee (round 2)")


def test_opening_goes_to_fetch_or_straight_to_the_witness_for_a_lazy_fault():
    s, acts = L.step(fresh(), L.OpeningOnChain(), 0.0)
    assert s.stage == Stage.FETCH and acts == [L.Advance(Stage.AWAITING_OPENING, Stage.FETCH)]
    s, _ = L.step(fresh(), L.OpeningOnChain(), 0.0, L.Limits(skips_work=True))
    assert s.stage == Stage.WITNESS
    assert L.step(fresh(Stage.FETCH), L.OpeningOnChain(), 0.0)[1] == []


def test_tick_starts_the_stage_with_its_budget_and_waits_while_it_runs():
    s, acts = L.step(fresh(Stage.FETCH), L.Tick(head=5, budget=12.5), 0.0)
    assert acts == [L.StartWork(Stage.FETCH, 12.5)] and s.running
    assert L.step(s, L.Tick(head=6, budget=12.5), 1.0) == (s, [])


def test_tick_waits_for_the_retry_time_then_misses_a_closed_window():
    s = fresh(Stage.VALIDATE, next_attempt_at=100.0)
    assert L.step(s, L.Tick(head=COMMIT_DL, budget=1.0), 99.0) == (s, [])
    s2, acts = L.step(s, L.Tick(head=COMMIT_DL, budget=1.0), 100.0)
    assert s2.stage == Stage.MISSED and acts == [
        L.Miss("the commit window closed before a witness value was ready")
    ]


def test_too_late_to_start_is_missed_and_a_retried_fetch_refuses_with_its_kept_failure():
    s, acts = L.step(fresh(Stage.VALIDATE), L.Tick(head=18, budget=0.0), 0.0)
    assert acts == [L.Miss("2 block(s) left in the commit window: too late to start validate")]
    kept = fresh(Stage.FETCH, refusal_class="unavailable", refusal_reason="dns: timeout")
    s, acts = L.step(kept, L.Tick(head=18, budget=0.0), 0.0)
    assert s.stage == Stage.WITNESS and s.refusal_class == "unavailable"
    assert acts == [
        L.Advance(
            Stage.FETCH,
            Stage.WITNESS,
            "unavailable",
            "dns: timeout (retried until the commit window's last safe moment)",
        )
    ]


def test_a_local_replay_without_the_file_fetches_again():
    s, acts = L.step(fresh(Stage.REPLAY), L.Tick(head=1, budget=5.0, opening_here=False), 0.0)
    assert s.stage == Stage.FETCH and isinstance(acts[0], L.Advance)
    s, acts = L.step(
        fresh(Stage.REPLAY), L.Tick(head=1, budget=5.0, opening_here=False), 0.0, L.Limits(cluster=True)
    )
    assert acts == [L.StartWork(Stage.REPLAY, 5.0)] and s.attempts == 1


@pytest.mark.parametrize(
    ("stage", "cluster", "to"),
    [
        (Stage.FETCH, False, Stage.VALIDATE),
        (Stage.FETCH, True, Stage.LOSSCHECKS),
        (Stage.VALIDATE, False, Stage.LOSSCHECKS),
        (Stage.LOSSCHECKS, False, Stage.REPLAY),
    ],
)
def test_ok_moves_to_the_next_stage(stage, cluster, to):
    s = fresh(
        stage, running=True, stage_failures=2, refusal_class="unavailable" if stage == Stage.FETCH else None
    )
    s2, acts = L.step(s, L.WorkFinished(stage, L.Outcome.OK), 0.0, L.Limits(cluster=cluster))
    assert s2.stage == to and acts == [L.Advance(stage, to)] and s2.stage_failures == 0
    assert s2.refusal_class is None  # a failure kept from a retried fetch is no longer the job's


def test_input_errors_refuse_once_and_at_losschecks_are_a_finding():
    s, acts = L.step(
        fresh(Stage.VALIDATE, running=True),
        L.WorkFinished(Stage.VALIDATE, L.Outcome.INPUT_ERROR, reason="ValueError: x"),
        0.0,
    )
    assert s.stage == Stage.WITNESS and s.refusal_class == "malformed"
    assert acts[0].reason == "validate refused the input: ValueError: x"
    s, _ = L.step(fresh(Stage.FETCH, running=True), L.WorkFinished(Stage.FETCH, L.Outcome.INPUT_ERROR), 0.0)
    assert s.refusal_class == "unavailable"
    s, _ = L.step(
        fresh(Stage.LOSSCHECKS, running=True), L.WorkFinished(Stage.LOSSCHECKS, L.Outcome.INPUT_ERROR), 0.0
    )
    assert s.stage == Stage.REPLAY and s.refusal_class is None


def test_retryable_fetch_retries_while_there_is_room_then_the_failure_stands():
    s = fresh(Stage.FETCH, running=True)
    ev = L.WorkFinished(Stage.FETCH, L.Outcome.RETRYABLE, "unavailable", "http 503", retry_delay=2.5)
    s, acts = L.step(s, ev, 10.0)
    assert s.stage == Stage.FETCH and s.fetch_retries == 1 and s.refusal_class == "unavailable"
    assert acts == [L.RetryAt(12.5, "fetch attempt 1 failed, retrying in 2.5 s: http 503")]
    s, acts = L.step(replace(s, running=True), replace(ev, retry_delay=None), 13.0)
    assert s.stage == Stage.WITNESS and s.fetch_retries == 0
    assert acts == [L.Advance(Stage.FETCH, Stage.WITNESS, "unavailable", "http 503")]


def test_only_a_fetch_is_retried():
    ev = L.WorkFinished(Stage.VALIDATE, L.Outcome.RETRYABLE, "invalid", "x", retry_delay=1.0)
    s, _ = L.step(fresh(Stage.VALIDATE, running=True), ev, 0.0)
    assert s.stage == Stage.WITNESS and s.refusal_class == "invalid"


def test_own_errors_retry_with_backoff_until_stage_attempts_then_miss():
    s = fresh(Stage.VALIDATE, running=True)
    ev = L.WorkFinished(Stage.VALIDATE, L.Outcome.TRANSIENT, reason="OSError: disk", jitter=0.5)
    s, acts = L.step(s, ev, 0.0, LIMITS)
    assert acts == [L.RetryAt(L.STAGE_BACKOFF.window(1) * 0.5, "validate failed: OSError: disk")]
    s, _ = L.step(replace(s, running=True), ev, 0.0, LIMITS)
    assert s.stage_failures == 2 and s.stage == Stage.VALIDATE
    s, acts = L.step(replace(s, running=True), ev, 0.0, LIMITS)
    assert s.stage == Stage.MISSED and acts == [L.Miss("validate failed 3 times; last: OSError: disk")]


def test_overrun_refuses_a_fetch_finds_at_losschecks_and_misses_a_validation():
    s, acts = L.step(
        fresh(Stage.FETCH, running=True), L.WorkFinished(Stage.FETCH, L.Outcome.OVERRAN, budget_s=4.0), 0.0
    )
    assert s.stage == Stage.WITNESS and s.refusal_class == "unavailable"
    assert acts[0].reason == "the opening did not arrive within the fetch budget of 4.0 s"
    s, _ = L.step(
        fresh(Stage.LOSSCHECKS, running=True), L.WorkFinished(Stage.LOSSCHECKS, L.Outcome.OVERRAN), 0.0
    )
    assert s.stage == Stage.REPLAY
    s, acts = L.step(
        fresh(Stage.VALIDATE, running=True),
        L.WorkFinished(Stage.VALIDATE, L.Outcome.OVERRAN, budget_s=2.0),
        0.0,
    )
    assert acts == [L.Miss("validate did not finish within its budget of 2.0 s")]


def test_a_full_store_waits_and_a_stopped_fetch_resumes():
    s, acts = L.step(
        fresh(Stage.FETCH, running=True, stage_failures=1),
        L.WorkFinished(Stage.FETCH, L.Outcome.DISK_FULL, reason="full", jitter=0.5),
        1.0,
    )
    assert acts == [L.RetryAt(1.0 + L.STAGE_BACKOFF.window(L.DISK_FULL_ATTEMPT) * 0.5, "full")]
    assert s.stage_failures == 1  # neither the input's fault nor a bug: not counted
    s, acts = L.step(fresh(Stage.FETCH, running=True), L.WorkFinished(Stage.FETCH, L.Outcome.STOPPED), 0.0)
    assert s.stage == Stage.FETCH and not s.running and acts == []


def test_replay_failures_retry_up_to_the_replay_attempts_and_a_timeout_misses():
    s = fresh(Stage.REPLAY)
    for attempt in (1, 2):
        s, acts = L.step(s, L.Tick(head=1, budget=9.0), s.next_attempt_at)
        assert s.attempts == attempt
        s, acts = L.step(s, L.WorkFinished(Stage.REPLAY, L.Outcome.TRANSIENT, reason="died", jitter=0.0), 5.0)
        assert acts == [L.RetryAt(5.0, f"replay attempt {attempt} failed: died")]
    s, _ = L.step(s, L.Tick(head=1, budget=9.0), 5.0)
    s, acts = L.step(s, L.WorkFinished(Stage.REPLAY, L.Outcome.TRANSIENT, reason="died"), 5.0)
    assert s.stage == Stage.MISSED and acts == [L.Miss("died")]
    s, acts = L.step(
        fresh(Stage.REPLAY, running=True, attempts=1),
        L.WorkFinished(Stage.REPLAY, L.Outcome.OVERRAN, reason="timeout"),
        0.0,
    )
    assert acts == [L.Miss("timeout")]


def test_replay_result_or_refusal_goes_to_the_witness():
    s, _ = L.step(
        fresh(Stage.REPLAY, running=True, has_proof_hash=False),
        L.WorkFinished(Stage.REPLAY, L.Outcome.OK),
        0.0,
    )
    assert s.stage == Stage.WITNESS and s.has_proof_hash and s.refusal_class is None
    s, _ = L.step(fresh(Stage.REPLAY, running=True), L.WorkFinished(Stage.REPLAY, L.Outcome.REFUSED), 0.0)
    assert s.refusal_class == "replay_failed"


def test_witness_is_journaled_then_committed_and_an_old_replay_is_redone():
    s, acts = L.step(fresh(Stage.WITNESS), L.Tick(head=1, budget=1.0), 0.0)
    assert acts == [L.JournalWitness()] and s.stage == Stage.WITNESS
    s, acts = L.step(s, L.WitnessJournaled(), 0.0)
    assert s.stage == Stage.COMMIT and acts == [L.Advance(Stage.WITNESS, Stage.COMMIT)]
    s, acts = L.step(fresh(Stage.WITNESS, has_proof_hash=False), L.Tick(head=1, budget=1.0), 0.0)
    assert s.stage == Stage.REPLAY and acts[0].reason == "replayed without the proof hash; replaying again"


def test_commit_and_reveal_are_sent_in_their_windows():
    c = fresh(Stage.COMMIT)
    assert L.step(c, L.SendPass(head=5), 0.0)[1] == [L.SendTx(Stage.COMMIT)]
    assert L.step(c, L.SendPass(head=5, commit_on_chain=True), 0.0)[1] == []
    assert L.step(c, L.SendPass(head=5, resend_due=False), 0.0)[1] == []
    s, acts = L.step(c, L.SendPass(head=COMMIT_DL), 0.0)
    assert s.stage == Stage.MISSED and acts == [
        L.FailTx("the commit window closed"),
        L.Miss("the commit window closed"),
    ]
    r, _ = L.step(c, L.CommitConfirmed(), 0.0)
    assert r.stage == Stage.REVEAL
    assert L.step(r, L.SendPass(head=COMMIT_DL - 1), 0.0)[1] == []  # reveals open after the commit window
    assert L.step(r, L.SendPass(head=COMMIT_DL), 0.0)[1] == [L.SendTx(Stage.REVEAL)]
    assert L.step(r, L.SendPass(head=REVEAL_DL), 0.0)[0].stage == Stage.MISSED
    assert L.step(r, L.RevealConfirmed(), 0.0)[0].stage == Stage.REVEALED


def test_sender_misses_a_missing_failed_or_foreign_tx_and_backs_off_a_failed_send():
    c = fresh(Stage.COMMIT)
    assert L.step(c, L.SendPass(head=1, tx_state="none"), 0.0)[1] == [
        L.Miss("no journaled commit tx for this account")
    ]
    assert L.step(c, L.SendPass(head=1, tx_state="failed", tx_error="x"), 0.0)[1] == [
        L.Miss("commit failed: x")
    ]
    assert L.step(c, L.SendPass(head=1, origin="a", account="b"), 0.0)[1] == [
        L.Miss("the commit was journaled for 'a'; this node signs as 'b'")
    ]
    s, acts = L.step(c, L.SendFailed(sends=0, jitter=0.5), 10.0)
    assert s.next_attempt_at == 10.0 + L.SEND_BACKOFF.window(1) * 0.5
    assert L.step(s, L.SendPass(head=1), 10.0)[1] == []  # not before the backoff


def test_resolution_ends_the_job_but_keeps_skipped_and_missed():
    for stage in (Stage.AWAITING_OPENING, Stage.FETCH, Stage.REVEALED):
        assert L.step(fresh(stage), L.Resolved(), 0.0) == (fresh(Stage.DONE), [L.MarkDone()])
    for stage in STOPPED:
        assert L.step(fresh(stage), L.Resolved(), 0.0) == (fresh(stage), [])
        assert L.resolved_stage(stage) == (Stage.DONE if stage == Stage.DONE else stage)


def test_stop_gives_a_running_replay_its_attempt_back():
    s, acts = L.step(fresh(Stage.REPLAY, running=True, attempts=2), L.Stop(), 0.0)
    assert s.attempts == 1 and not s.running and acts == [L.GiveBackAttempt()]
    s, acts = L.step(fresh(Stage.VALIDATE, running=True), L.Stop(), 0.0)
    assert s.stage == Stage.VALIDATE and not s.running and acts == []


def test_work_the_job_moved_on_from_is_ignored():
    s = fresh(Stage.VALIDATE)
    assert L.step(s, L.WorkFinished(Stage.VALIDATE, L.Outcome.OK), 0.0) == (s, [])
    s = fresh(Stage.LOSSCHECKS, running=True)
    assert L.step(s, L.WorkFinished(Stage.VALIDATE, L.Outcome.OK), 0.0) == (s, [])
