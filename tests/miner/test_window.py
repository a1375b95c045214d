"""The opening window: the registration declares the keep-every as the run's checkpoint_interval;
a keep-every whose regeneration would not fit in half the window is refused (naming --keep-every,
the window and the largest that fits) or lowered; measured step times lower it during training;
an opening regenerated from a kept state lands within the window on a dev chain that seals by
the clock; and every refusal of a sent call is printed with its code, with exit status 1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chain.dev import DevTransport
from chain.protocol import ChallengeIssued, ProtocolParams, RunRegistered
from chain.protocol.cost import opening_blocks
from chain.protocol.params import MAX_SIZING
from chain.view import ChainView
from commitments.dataset import Dataset
from miner.cli import report
from miner.trainer import Trainer, TrainerError
from miner.window import (
    FIT_SHARE,
    BlockTime,
    Fit,
    largest_declared,
    largest_within,
    measured_block_seconds,
    reference_pace,
)
from tests.miner.helpers import bond_verifiers, corpus, tiny_spec
from tests.miner.test_outcomes import _trained
from tests.miner.test_trainer import PARAMS, STEPS, chain

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def sealing(db: Path, interval: float):
    """`pot chain dev --interval` on `db`, in a process of its own: a sealer thread in this busy
    process (a training run, the other test worker) would seal at an uneven pace."""
    proc = subprocess.Popen([sys.executable, "-m", "pot", "chain", "dev", "--db", str(db), "--interval",
                             str(interval)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

# One step of tiny_spec's MLP is 4_718_592 FLOPs: at this reference rate it takes 1 s, and moving
# an opening takes next to nothing. With a block of 1 s and an opening_deadline of 11 blocks, the
# window of a small keep-every K is 11 blocks (4 K / 6 blocks at block_seconds 6 stays below), so
# K + (a microsecond) <= 5.5 s: the largest keep-every that fits is 5.
SLOW = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=11, challenge_delay=1,
                      challenges_per_run=1, quorum_min_reveals=2, forced_challenge_steps=(3,),
                      reference_flops=4_718_592, reference_bytes_per_s=MAX_SIZING)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("data"))


def _registered(view: ChainView, run_id: bytes) -> RunRegistered:
    view.sync()
    (reg,) = [e for e in view.of(RunRegistered) if e.run_id == run_id]
    return reg


def test_the_registration_declares_the_keep_every(tmp_path, data):
    spec = tiny_spec(STEPS + 2)
    miner = chain(tmp_path / "chain.db")
    tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=3,
                 progress=False, log=lambda m: None)
    tr.prepare()
    assert tr.registration().checkpoint_interval == 3 == tr.store.keep_every == tr.checkpoint_interval
    tr.register()
    reg = _registered(ChainView(miner, PARAMS), tr.run_id)
    assert reg.checkpoint_interval == 3
    assert reg.opening_blocks == opening_blocks(spec, PARAMS, 3) == tr.window_blocks
    assert tr.store.read_meta()["checkpoint_interval"] == 3
    tr.close()
    # A keep-every past the last step keeps no more than one equal to it: it declares the steps.
    other = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run2", miner, keep_every=1000,
                    progress=False, log=lambda m: None)
    other.prepare()
    assert other.registration().checkpoint_interval == spec.steps == other.store.keep_every
    other.close()


def test_a_keep_every_that_does_not_fit_is_refused_naming_the_largest_that_does(tmp_path, data):
    spec = tiny_spec(8)
    miner = chain(tmp_path / "chain.db", SLOW)
    (step, build) = reference_pace(spec, SLOW)
    assert step == 1.0 and build < 1e-6
    tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=8,
                 adapt_keep_every=False, block_seconds=1.0, progress=False, log=lambda m: None)
    with pytest.raises(TrainerError) as err:
        tr.prepare()
    msg = str(err.value)
    assert msg.startswith(
        "--keep-every 8 does not fit the run's opening window: regenerating a challenged step "
        "from a state kept every 8 steps takes about 8 s"
    ), msg
    assert "the opening window is 11 blocks of 1 s = 11 s (the block time given)" in msg
    assert "The largest keep-every that fits is 5: pass --keep-every 5, or --adapt-keep-every" in msg
    assert tr.store.read_meta() is None and len(tr.store) == 0  # nothing written, nothing sent
    assert not [e for e in ChainView(miner, SLOW).sync() if isinstance(e, RunRegistered)]
    tr.close()

    logs: list[str] = []
    tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=8,
                 block_seconds=1.0, progress=False, log=logs.append)
    tr.prepare()
    assert tr.store.keep_every == 5 == tr.checkpoint_interval
    assert any(
        m.startswith("--keep-every 8 lowered to 5 (--adapt-keep-every): regenerating") for m in logs
    ), logs
    tr.register()
    reg = _registered(ChainView(miner, SLOW), tr.run_id)
    assert (reg.checkpoint_interval, reg.opening_blocks) == (5, 11)
    tr.close()


def test_a_window_no_keep_every_fits_is_refused_even_when_adapting(tmp_path, data):
    spec = tiny_spec(8)
    miner = chain(tmp_path / "chain.db", SLOW)
    tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=4,
                 block_seconds=0.1, progress=False, log=lambda m: None)  # 11 blocks of 0.1 s: 1 step is 1 s
    with pytest.raises(TrainerError, match=r"--keep-every 4 does not fit the run's opening window, and no "
                                           r"keep-every does, not even 1: .*11 blocks of 0.1 s = 1.1 s"):
        tr.prepare()
    tr.close()


def test_the_largest_keep_every_that_fits_is_exact():
    spec = tiny_spec(10_000)
    block = BlockTime(1.0, "the block time given")
    for step, build in ((1.0, 0.0), (0.25, 0.5), (0.01, 3.0), (0.004, 0.0)):
        best = largest_declared(spec, SLOW, 10_000, block, step, build)
        fits = [
            k
            for k in range(1, 10_001)
            if Fit(k, opening_blocks(spec, SLOW, k), block, step, "", build).fits
            and opening_blocks(spec, SLOW, k) <= SLOW.max_replay_blocks
        ]
        assert best == (max(fits) if fits else None), (step, build)
    # a registered run's window is fixed: the keep-every only goes down to what fits it
    assert largest_within(20, 50, block, 1.0) == 10
    assert largest_within(20, 50, block, 100.0) == 1
    assert FIT_SHARE == 0.5


def test_measured_step_times_lower_the_keep_every_from_then_on(tmp_path, data):
    """A block time of 20 ms given, a reference so fast that any keep-every fits at start: once
    three steps are measured (milliseconds each on any CPU), a state every 12 steps no longer fits
    half of the 3-block window, and the trainer lowers the keep-every, keeps the state it is at and
    records the new keep-every; the declared interval stays 12."""
    fast = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=3, challenge_delay=1,
                          challenges_per_run=1, quorum_min_reveals=2, forced_challenge_steps=(3,),
                          reference_flops=MAX_SIZING, reference_bytes_per_s=MAX_SIZING)
    spec = tiny_spec(12)
    miner = chain(tmp_path / "chain.db", fast)
    logs: list[str] = []
    tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=12,
                 block_seconds=0.02, progress=False, log=logs.append)
    tr.prepare()
    assert tr.checkpoint_interval == 12 == tr.store.keep_every
    tr.register()
    tr.train()
    lowered = [m for m in logs if m.startswith("keep-every lowered from 12 to ")]
    assert len(lowered) >= 1 and " from step 3 on: " in lowered[0], logs
    assert "measured: the median of the last 3 steps" in lowered[0]
    first = int(lowered[0].split()[5])  # "keep-every lowered from 12 to N ..."
    k = tr.store.keep_every
    assert 1 <= k <= first < 12 and tr.store.read_meta()["keep_every"] == k
    kept = tr.store.kept_steps()
    assert 3 in kept  # kept when lowered: the next steps regenerate from it
    after = kept[kept.index(3):]
    assert all(b - a <= first for a, b in zip(after, after[1:], strict=False)), kept
    assert _registered(ChainView(miner, fast), tr.run_id).checkpoint_interval == 12
    tr.close()


def test_a_resumed_run_declares_what_it_declared_and_keeps_its_lowered_keep_every(tmp_path, data):
    spec = tiny_spec(8)
    miner = chain(tmp_path / "chain.db", SLOW)
    first = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=8,
                    block_seconds=1.0, progress=False, log=lambda m: None)
    first.prepare()
    first.register()
    first.train(3)
    first.close()
    logs: list[str] = []
    again = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=8,
                    block_seconds=1.0, progress=False, log=logs.append)
    again.prepare()
    assert again.registration() == first.registration() and again.checkpoint_interval == 5
    head = miner.finalized_head()
    again.register()  # the chain holds this very registration: it is not sent again
    assert again.store.keep_every == 5 and again.window_blocks == 11
    assert miner.finalized_head() == head, (
        "a restarted trainer sent its registration again (a second payment)"
    )
    assert any("already registered" in line for line in logs), logs
    again.close()


def test_the_block_time_is_measured_from_a_chain_sealing_by_the_clock(tmp_path):
    db = tmp_path / "chain.db"
    DevTransport(db, "miner", sealing="instant").record_params(PARAMS)
    reader = DevTransport(db, "reader")
    assert measured_block_seconds(reader) is None  # too few blocks to tell
    for _ in range(12):  # sealed on demand, a burst: no pace
        reader.seal()
    assert measured_block_seconds(reader) is None
    with sealing(db, 0.1):
        deadline = time.monotonic() + 30
        got = None
        while got is None and time.monotonic() < deadline:
            time.sleep(0.2)
            got = measured_block_seconds(reader)
    assert got is not None and 0.05 <= got <= 0.5, got
    # a chain that stopped sealing long ago shows no pace now
    assert measured_block_seconds(reader, now=time.time() + 3600) is None


def test_an_opening_after_regeneration_lands_within_the_window(tmp_path, data):
    """A dev chain sealing a block every 0.5 s; the miner keeps a state every 6 steps of 6 and step
    5 is challenged: its pre-state (after step 4) is regenerated from state 0, and the opening is
    on chain by the deadline of the window the declared interval gave the run. At the reference
    speed of these parameters a step takes 1 s, so that window is 8 x 6 blocks and one for moving
    the opening, 49 (24.5 s at the measured 0.5 s a block; half of it fits the 6 reference steps),
    where an interval of 1 would have had 9."""
    params = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=4, challenge_delay=1,
                            challenges_per_run=1, quorum_min_reveals=2, forced_challenge_steps=(5,),
                            block_seconds=1, replay_margin=8, reference_flops=4_718_592,
                            reference_bytes_per_s=MAX_SIZING)
    spec = tiny_spec(6)
    assert (opening_blocks(spec, params, 6), opening_blocks(spec, params, 1)) == (49, 9)
    db = tmp_path / "chain.db"
    miner = DevTransport(db, "miner", sealing="interval")
    miner.record_params(params)
    logs: list[str] = []
    with sealing(db, 0.5):
        bond_verifiers(db, ("v1", "v2"))
        while miner.finalized_head() < 10:  # enough blocks for the miner to measure the pace
            time.sleep(0.1)
        tr = Trainer(spec, Dataset.open(data, spec.sample_len), tmp_path / "run", miner, keep_every=6,
                     progress=False, log=logs.append, submit_timeout=30)
        tr.run(follow=False)
        assert tr.block is not None and tr.block.source == "the chain's measured block time"
        assert 0.25 <= tr.block.seconds <= 1.0, tr.block
        tr.follow(stop=lambda: bool(tr.answered or tr.failed or tr.refused), timeout=120)
    assert not tr.failed and not tr.refused and not tr.refusals, (tr.failed, tr.refused, logs)
    assert 4 not in tr.store.kept_steps()  # the pre-state was regenerated, not read
    view = ChainView(miner, params)
    view.sync()
    reg = _registered(view, tr.run_id)
    assert (reg.checkpoint_interval, reg.opening_blocks) == (6, 49)
    assert any(m.startswith("opening window: 49 blocks of ") for m in logs), logs
    (issued,) = [e for e in view.events if isinstance(e, ChallengeIssued)]
    (opened,) = [e for e in view.events if type(e).__name__ == "OpeningSubmitted"]
    assert issued.step == 5 and opened.challenge_id == issued.challenge_id
    assert issued.opening_deadline == issued.block + 49
    assert opened.block <= issued.opening_deadline
    assert not [e for e in view.events if type(e).__name__ == "CallRefused" and e.origin == "miner"]
    tr.close()


def test_a_late_opening_is_printed_with_its_code_and_fails_the_run(tmp_path, data, capsys):
    logs: list[str] = []
    tr, miner = _trained(tmp_path, data, logs)
    view = ChainView(DevTransport(tmp_path / "chain.db", "observer"), PARAMS)
    issued: list = []
    while not issued:
        miner.seal()
        issued = [e for e in view.sync() if isinstance(e, ChallengeIssued)]
    (ev,) = issued
    while miner.finalized_head() < ev.opening_deadline:  # the miner sleeps through its deadline
        miner.seal()
    with pytest.raises(TrainerError):
        tr.answer(ev)
    capsys.readouterr()
    assert report(tr, {}, tmp_path / "run") == 1
    text = capsys.readouterr()
    (line,) = [x for x in text.err.splitlines() if x.startswith("refused: ")]
    assert line.startswith(f"refused: open step {ev.step}: OpeningTooLate: the opening was due by block "
                           f"{ev.opening_deadline}; this is block "), line
    assert report(tr, {}, tmp_path / "run", as_json=True) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (r,) = summary["refusals"]
    assert (r["call"], r["refusal"]) == ("submit_opening", "OpeningTooLate") and r[
        "what"
    ] == f"open step {ev.step}"
    assert summary["checkpoint_interval"] == tr.checkpoint_interval == summary["keep_every"]
    tr.close()
