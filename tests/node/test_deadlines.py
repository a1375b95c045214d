"""Deadlines and fairness, tried as an attacker would: a prover that serves a byte at a time, one
miner's many slow jobs beside another's honest one, a poison manifest, and a replay past its
budget. The policy pieces (budgets, block clock, round-robin, the cap) are checked on their own.
"""

from __future__ import annotations

import struct
import time

import pytest
import sqlalchemy as sa

from chain import protocol as P
from chain.calls import CommitWitness, RevealWitnessValue
from chain.protocol import ProtocolParams
from challenges.opening import MAGIC, build_opening
from node.db import challenges, open_database, stage_log
from node.pipeline import ChainFacts, ReplayPool
from node.scheduler import BlockClock, Budgets, InFlight, describe_error, is_input_error, round_robin
from tests.node.harness import Network, chain_calls, in_process_node

# --- the policy on its own ------------------------------------------------------------------------


def test_round_robin_serves_every_miner_before_anyones_second_job():
    jobs = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("c", 2)]
    order = round_robin(jobs, key=lambda j: j[0])
    assert order == [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("c", 2), ("a", 3)]
    # The next pass starts after the miner served last, so no miner is always first.
    assert [j[0] for j in round_robin(jobs, key=lambda j: j[0], after="a")][:3] == ["b", "c", "a"]
    assert [j[0] for j in round_robin(jobs, key=lambda j: j[0], after="c")][:3] == ["a", "b", "c"]
    assert round_robin([], key=lambda j: j) == []


def test_in_flight_caps_each_owner():
    f = InFlight(2)
    a, b = ("miner:a", "endpoint:h:1"), ("miner:b", "endpoint:h:2")
    f.add(a)
    f.add(a)
    assert not f.admits(a) and f.admits(b)
    assert not f.admits(("miner:c", "endpoint:h:1")), "an endpoint is capped like a miner"
    f.remove(a)
    assert f.admits(a) and f.count("miner:a") == 1


def test_block_clock_watches_the_head_move_not_the_catch_up():
    c = BlockClock(6.0)
    assert c.seconds_per_block == 6.0  # nothing seen yet: the configured time
    c.observe(1000, 0.0)  # a node far behind reads the head; ingesting old blocks does not count
    c.observe(1000, 0.4)
    assert c.seconds_per_block == 6.0
    for i in range(1, 30):
        c.observe(1000 + i, 0.5 * i)
    assert abs(c.seconds_per_block - 0.5) < 1e-9
    c.observe(1031, 0.5 * 29 + 2.0)  # one slow block moves the average, it does not replace it
    assert 0.5 < c.seconds_per_block < 1.0
    assert c.seconds(-3) == 0.0


def test_budgets_come_from_the_blocks_left_and_the_caps():
    clock = BlockClock(2.0)
    b = Budgets(margin_blocks=2, fetch_share=0.5, fetch_max_s=900, validate_max_s=30, losschecks_max_s=60,
                replay_max_s=100)
    assert b.budget("fetch", head=10, commit_deadline=22, clock=clock) == 10.0  # (22-10-2) * 2 s * 0.5
    assert b.budget("replay", head=10, commit_deadline=22, clock=clock) == 20.0
    assert b.budget("validate", head=10, commit_deadline=22, clock=clock) == 20.0
    assert b.budget("replay", head=10, commit_deadline=200, clock=clock) == 100  # the cap
    assert b.budget("fetch", head=20, commit_deadline=22, clock=clock) == 0.0  # only the margin is left
    assert Budgets.send_budget(head=10, deadline=13, clock=clock, cap_s=60) == 6.0
    assert Budgets.send_budget(head=10, deadline=100, clock=clock, cap_s=60) == 60


def test_untrusted_input_errors_are_told_from_bugs():
    for exc in (ValueError("x"), TypeError("x"), KeyError("x"), IndexError("x"), OverflowError("x"),
                RecursionError("x"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), struct.error("x"),
                type("SafetensorError", (Exception,), {})("x")):
        assert is_input_error(exc), exc
    for exc in (AttributeError("x"), NameError("x"), AssertionError("x"), OSError("disk"), MemoryError()):
        assert not is_input_error(exc), exc
    assert describe_error(ValueError("y" * 10_000)) == "ValueError: " + "y" * 300

    class Unprintable(ValueError):
        def __str__(self) -> str:
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    assert describe_error(Unprintable()) == "Unprintable: (message not printable)"


def test_a_replay_past_its_budget_is_killed_and_its_worker_replaced(tmp_path):
    from tests.miner.helpers import corpus, tiny_spec, walk

    w = walk(tiny_spec(4, "mlp"), corpus(tmp_path))
    run_id = b"\x07" * 32
    data = build_opening(spec=w.spec, run_id=run_id, step=3, pre_state=w.states[2], dataset=w.dataset,
                         schedule=w.schedule, leaves=w.leaves)
    path = tmp_path / "o.opening"
    path.write_bytes(data)
    from challenges.opening import load_opening
    from commitments import merkle

    facts = ChainFacts(
        expected_digest=load_opening(data).digest,
        run_id=run_id,
        step=3,
        spec_digest=w.spec.digest(),
        dataset_hash=w.dataset.dataset_hash,
        schedule_commitment=w.schedule.commitment,
        initial_hash=w.states[0].digest(),
        root=merkle.root(w.leaves),
        size=len(w.leaves),
    )
    pool = ReplayPool(1, 600.0)
    try:
        def run(key: bytes, budget: float | None) -> tuple[dict, float]:
            started = time.monotonic()
            pool.start(key, path, facts, max_bytes=1 << 30, timeout_s=budget)
            while True:
                done = pool.poll()
                if done:
                    assert done[0][0] == key
                    return done[0][1], time.monotonic() - started
                time.sleep(0.005)

        for key in (b"w" * 32, b"a" * 32):  # the worker starts (imports) and replays, within the pool's cap
            msg, _ = run(key, None)
            assert msg["ok"] and msg["matches"], msg
        replay_s = msg["finished_at"] - msg["started_at"]
        worker = pool._workers[0].proc
        msg, _ = run(b"l" * 32, replay_s / 20)  # the same replay, on a warm worker, with a 20th of its time
        assert msg == {"ok": False, "timeout": True, "reason": msg["reason"]} and "budget" in msg["reason"]
        assert not worker.is_alive(), "the worker of an overrun replay must be killed"
        assert pool.free() == 1 and pool._workers[0].proc is not worker and pool._workers[0].proc.is_alive()
    finally:
        pool.shutdown()


# --- the daemon's dispatch, on its real database ----------------------------------------------------


@pytest.fixture
def node(tmp_path):
    n, engine = in_process_node(tmp_path, tmp_path / "c.db", "[schedule]\nstage_attempts = 2\n")
    n.head = 100
    yield n
    n.shutdown()
    engine.dispose()


def _add_job(node, cid: bytes, stage: str, miner: str) -> None:
    from node.db import runs

    now = time.time()
    with node.engine.begin() as c:
        c.execute(
            runs.insert().values(
                run_id=cid,
                miner=miner,
                spec_digest=b"s" * 32,
                mode="value",
                declared_steps=4,
                endpoint=f"http://{miner}.example:80",
                initial_hash=b"i" * 32,
                schedule_commitment=b"c" * 32,
                dataset_hash=b"d" * 32,
                registered_block=1,
                slashed=0,
            )
        )
        c.execute(challenges.insert().values(
            challenge_id=cid, run_id=cid, idx=0, step=3, root=b"r" * 32, size=5, mode="value",
            endpoint=f"http://{miner}.example:80", issued_block=90, opening_deadline=100, commit_deadline=200,
            reveal_deadline=210, stage=stage, opening_uri=f"http://{miner}.example:80/o", attempts=0,
            next_attempt_at=0.0, created_at=now, updated_at=now))


def _run(node, cid: bytes, stage: str, fn, budget: float = 60.0) -> None:
    """Hand `fn` to the daemon as the stage's work, as schedule() does, with `budget` seconds."""
    from node.daemon import _run_on_thread, _Task
    from node.stages import Stage

    job = next(j for j in node._work_jobs() if bytes(j.challenge_id) == cid)
    owners = node._owners(job)
    node.tasks[cid] = _Task(
        Stage(stage), _run_on_thread("t", fn), owners, time.time(), time.monotonic() + budget, budget
    )
    node.in_flight.add(owners)


def _collect_until(node, pred, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "the daemon did not settle the job"
        node.collect()
        time.sleep(0.02)


def _job(node, cid: bytes):
    with node.engine.connect() as c:
        return c.execute(sa.select(challenges).where(challenges.c.challenge_id == cid)).one()


def _raise(exc: BaseException):
    def fn():
        raise exc
    return fn


def test_an_input_error_refuses_its_job_once_and_a_bug_is_retried_a_bounded_number_of_times(node):
    bad, buggy, other = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    for cid, miner in ((bad, "a"), (buggy, "b"), (other, "c")):
        _add_job(node, cid, "validate", miner)
    # A parser's ValueError on the opening (e.g. an integer too long to print): one refusal.
    _run(
        node,
        bad,
        "validate",
        _raise(ValueError("Exceeds the limit (4300 digits) for integer string conversion")),
    )
    _collect_until(node, lambda: bad not in node.tasks)
    job = _job(node, bad)
    assert (job.stage, job.refusal_class) == ("witness", "malformed") and "ValueError" in job.refusal_reason
    # A bug: retried with backoff, then the job ends with the error as its reason.
    _run(node, buggy, "validate", _raise(AttributeError("'NoneType' object has no attribute 'x'")))
    _collect_until(node, lambda: buggy not in node.tasks)
    job = _job(node, buggy)
    assert (
        job.stage == "validate" and job.next_attempt_at > time.time() - 1 and "AttributeError" in job.status
    )
    _run(node, buggy, "validate", _raise(AttributeError("'NoneType' object has no attribute 'x'")))
    _collect_until(node, lambda: buggy not in node.tasks)
    job = _job(node, buggy)
    assert job.stage == "missed" and "failed 2 times" in job.status and "AttributeError" in job.status
    assert _job(node, other).stage == "validate", "another job was touched"
    assert node.in_flight.count("miner:a") == node.in_flight.count("endpoint:a.example:80") == 0


def test_work_past_its_budget_ends_its_job_as_the_stage_requires(node):
    import threading

    release = threading.Event()
    jobs = {b"\x11" * 32: "fetch", b"\x12" * 32: "validate", b"\x13" * 32: "losschecks"}
    for cid, stage in jobs.items():
        _add_job(node, cid, stage, f"m{cid[0]}")
        _run(node, cid, stage, release.wait, budget=0.2)  # a stall: the work never returns by itself
    _collect_until(node, lambda: not node.tasks)
    fetch, validate, losschecks = (_job(node, cid) for cid in jobs)
    # The prover did not deliver in time: refused as unavailable, committed like any refusal.
    assert (fetch.stage, fetch.refusal_class) == (
        "witness",
        "unavailable",
    ) and "fetch budget" in fetch.refusal_reason
    # Nothing can be said of an opening whose validation did not finish: missed.
    assert validate.stage == "missed" and "budget" in validate.status
    # The loss checks only flag: the replay goes ahead with a finding.
    assert losschecks.stage == "replay" and "did not finish" in losschecks.loss_checks
    # The abandoned threads still count for their miners until they end.
    assert len(node.abandoned) == 3 and node.in_flight.count("miner:m17") == 1
    assert node.in_flight.count("endpoint:m17.example:80") == 1
    release.set()
    _collect_until(node, lambda: not node.abandoned)
    assert node.in_flight.count("miner:m17") == 0


# --- on a live dev chain --------------------------------------------------------------------------

# Four steps keep the walk and the replay short; the windows leave room for a loaded machine.
STEPS, STEP = 4, 3


def _params(commit_window: int, reveal_window: int = 6, committee_size: int = 5) -> ProtocolParams:
    return ProtocolParams(commit_window=commit_window, reveal_window=reveal_window, opening_deadline=10,
                          challenge_delay=2, quorum_min_reveals=1, challenges_per_run=1,
                          forced_challenge_steps=(STEP,), committee_size=committee_size)


def _jobs(tmp_path, name: str) -> tuple[dict[bytes, object], dict[bytes, list]]:
    engine = open_database(f"sqlite:///{tmp_path / f'{name}-data' / 'node.db'}")
    try:
        with engine.connect() as c:
            jobs = {bytes(j.challenge_id): j for j in c.execute(sa.select(challenges))}
            logs: dict[bytes, list] = {}
            for r in c.execute(sa.select(stage_log).order_by(stage_log.c.id)):
                logs.setdefault(bytes(r.challenge_id), []).append(r)
    finally:
        engine.dispose()
    return jobs, logs


def _wait(pred, timeout: float, what: str, net: Network, name: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"{what} within {timeout} s\n{net.log(name)[-4000:]}")


@pytest.mark.slow
def test_slowloris_miner_delays_only_its_own_jobs(tmp_path):
    """Miner `slow` answers three challenges from a prover that sends a byte every 0.2 s; miner
    `honest` answers one normally. With two stage threads and one job per miner, the node still
    commits and reveals the honest challenge in time, before any of the slow ones is given up, and
    refuses a slow opening as unavailable once its fetch budget is spent (not after the fetch's
    own 3 x 300 s)."""
    # Protocol v3: a seat reserves verifier_stake of free bond. The node bonds four seat units and
    # each challenge seats one, so the four runs' challenges are open at once.
    params = _params(commit_window=40, committee_size=1)
    net = Network(tmp_path, params, interval=0.5)
    try:
        cfg = net.node_config("v1", schedule={"stage_threads": 2, "max_jobs_per_miner": 1, "fetch_share": 0.8,
                                              "block_time_s": 0.5}, bond=4 * params.verifier_stake)
        net.start_node("v1", cfg)
        slow_endpoint = net.slowloris_endpoint(0.2)
        slow = [net.start_run(steps=STEPS, nonce=bytes([i]) * 16, miner="slow", endpoint=slow_endpoint)
                for i in (1, 2, 3)]
        honest = net.start_run(steps=STEPS, miner="honest")
        for r in [*slow, honest]:
            assert r.opened.wait(120), "a miner never saw its challenge"
        view = net.wait_resolved(honest.challenge_id, 150)
        ch = view.state.challenges[honest.challenge_id]
        assert ch.verdict == "honest" and "v1" in ch.reveals

        def commit_block(cid: bytes) -> int | None:
            return next((b for b, _, c in chain_calls(net, "v1") if isinstance(c, CommitWitness)
                         and c.challenge_id == cid), None)

        honest_commit = commit_block(honest.challenge_id)
        assert honest_commit is not None and honest_commit <= ch.commit_deadline

        # The first slow job is refused once its fetch budget ran out; its refusal is revealed.
        jobs, logs = _wait(lambda: (lambda j, lg: (j, lg) if any(
            j[r.challenge_id].refusal_class for r in slow) else None)(*_jobs(tmp_path, "v1")),
            60, "no slow opening was refused", net, "v1")
        refused = [r for r in slow if jobs[r.challenge_id].refusal_class]
        first = refused[0].challenge_id
        assert jobs[first].refusal_class == "unavailable"
        fetch = next(r for r in logs[first] if r.stage == "fetch")
        assert "fetch budget" in fetch.detail and fetch.finished_at - fetch.started_at < 60
        assert honest_commit < commit_block(first), "the honest commit waited behind a slow fetch"
        # One job per miner: the slow miner's fetches never overlapped.
        spans = sorted((r.started_at, r.finished_at) for c in (s.challenge_id for s in slow)
                       for r in logs.get(c, []) if r.stage == "fetch")
        assert all(a[1] <= b[0] + 0.5 for a, b in zip(spans, spans[1:], strict=False)), spans
        view = net.wait_resolved(first, 120)
        assert "v1" in view.state.challenges[first].reveals
        assert any(
            isinstance(c, RevealWitnessValue) and c.challenge_id == first
            for _, _, c in chain_calls(net, "v1")
        )
        assert '"stage_overran"' in net.log("v1") and '"loop_error"' not in net.log("v1")
    finally:
        net.close()


@pytest.mark.slow
def test_a_poison_manifest_is_refused_once_not_retried(tmp_path):
    """The manifest is a 2,000-byte CBOR bignum (turning it into text once raised ValueError). The
    job is refused in one stage (the fetch's manifest check or the validation), committed and
    revealed; no stage runs twice and no stage error is retried."""
    manifest = b"\xc2\x59\x07\xd0" + b"\x01" * 2000
    poison = MAGIC + struct.pack(">I", len(manifest)) + manifest
    net = Network(tmp_path, _params(commit_window=20), interval=0.5)
    try:
        net.start_node("v1", net.node_config("v1", schedule={"block_time_s": 0.5}))
        run = net.start_run(steps=STEPS, opening=poison)
        assert run.opened.wait(120), "the miner never saw its challenge"
        view = net.wait_resolved(run.challenge_id, 120)
        assert "v1" in view.state.challenges[run.challenge_id].reveals
        jobs, logs = _jobs(tmp_path, "v1")
        job = jobs[run.challenge_id]
        assert job.refusal_class in ("malformed", "invalid"), job
        stages = [r.stage for r in logs[run.challenge_id]]
        assert len(stages) == len(set(stages)) and "replay" not in stages, stages
        log = net.log("v1")
        assert '"stage_error"' not in log and '"loop_error"' not in log
        assert any(e.challenge_id == run.challenge_id for e in view.of(P.WitnessRevealed))
    finally:
        net.close()


@pytest.mark.slow
def test_a_replay_past_its_budget_ends_as_missed_and_the_node_goes_on(tmp_path):
    """A replay budget below what a replay takes: the node kills the replay, records the job as
    missed with the reason, and keeps following the chain."""
    net = Network(tmp_path, _params(commit_window=20), interval=0.5)
    try:
        net.start_node("v1", net.node_config("v1", replay={"timeout_s": 0.5}, schedule={"block_time_s": 0.5}))
        run = net.start_run(steps=STEPS)
        assert run.opened.wait(120), "the miner never saw its challenge"
        jobs, logs = _wait(
            lambda: (
                lambda j, lg: (
                    (j, lg) if run.challenge_id in j and j[run.challenge_id].stage == "missed" else None
                )
            )(*_jobs(tmp_path, "v1")),
            90,
            "the replay was not cut at its budget",
            net,
            "v1",
        )
        job = jobs[run.challenge_id]
        assert "budget" in job.status and logs[run.challenge_id][-1].stage == "replay"
        assert '"loop_error"' not in net.log("v1")
    finally:
        net.close()
