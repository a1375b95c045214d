"""Replay: an honest opening recomputes leaf t exactly; a step trained on another batch does not."""

from __future__ import annotations

import pytest

from challenges.opening import load_opening, validate_opening
from challenges.replay import ReplayError, replay, verify_opening_file
from commitments import merkle
from commitments.leaves import witness_value_hash
from oracle.norm_bucket import norm_bucket
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk

BAD_STEP = 3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def gpt_run(data_dir):
    return walk(tiny_spec(3, kind="gpt"), data_dir)


@pytest.fixture(scope="module")
def faulty_run(data_dir):
    return walk(tiny_spec(4), data_dir, substitute_at=BAD_STEP)


def opening_file(run, t, tmp_path):
    from challenges.opening import build_opening

    data = build_opening(
        spec=run.spec,
        run_id=RUN_ID,
        step=t,
        pre_state=run.states[t - 1],
        dataset=run.dataset,
        schedule=run.schedule,
        leaves=run.leaves,
    )
    path = tmp_path / f"opening-{t}.bin"
    path.write_bytes(data)
    return path


def validated(run, t, tmp_path):
    op = load_opening(opening_file(run, t, tmp_path))
    return validate_opening(
        op,
        expected_digest=op.digest,
        run_id=RUN_ID,
        step=t,
        spec_digest=run.spec.digest(),
        dataset_hash=run.dataset.dataset_hash,
        schedule_commitment=run.schedule.commitment,
        initial_hash=run.states[0].digest(),
        root=merkle.root(run.leaves),
        size=len(run.leaves),
    )


def test_honest_gpt_step_matches_leaf(gpt_run, tmp_path):
    r = replay(validated(gpt_run, 2, tmp_path))
    assert r.matches_leaf
    assert r.leaf == gpt_run.leaves[2]
    assert r.state_digest == gpt_run.states[2].digest()
    assert r.value_hash == witness_value_hash(gpt_run.leaves[2])
    assert r.norm_bucket == norm_bucket(gpt_run.states[1], gpt_run.states[2])
    assert r.state.digest() == r.state_digest
    assert r.as_json()["matches_leaf"] is True


def test_substituted_batch_does_not_match(faulty_run, tmp_path):
    # The opening itself is valid (the schedule's batch, honest proofs and pre-state) ...
    v = validated(faulty_run, BAD_STEP, tmp_path)
    r = replay(v)
    # ... but replaying the schedule's batch does not give the leaf the miner committed.
    assert not r.matches_leaf
    assert r.state_digest != faulty_run.states[BAD_STEP].digest()
    assert r.value_hash != witness_value_hash(faulty_run.leaves[BAD_STEP])
    ok, reason, result = verify_opening_file(opening_file(faulty_run, BAD_STEP, tmp_path))
    assert not ok and result is not None
    assert reason.startswith(f"replayed leaf {BAD_STEP} differs: state digest")


def test_steps_around_the_fault_match(faulty_run, tmp_path):
    # The step before was honest; the step after starts from the committed (faulty) state and
    # is itself honest, so it replays exactly.
    for t in (BAD_STEP - 1, BAD_STEP + 1):
        ok, reason, result = verify_opening_file(opening_file(faulty_run, t, tmp_path))
        assert ok, reason
        assert result.leaf == faulty_run.leaves[t]


def test_verify_opening_file_against_chain_facts(gpt_run, tmp_path):
    path = opening_file(gpt_run, 1, tmp_path)
    ok, reason, result = verify_opening_file(path, initial_hash=gpt_run.states[0].digest(), run_id=RUN_ID,
                                             root=merkle.root(gpt_run.leaves))
    assert ok and reason == "" and result.matches_leaf
    ok, reason, result = verify_opening_file(path, initial_hash=b"\x09" * 32)
    assert not ok and result is None and "initial hash" in reason
    ok, reason, result = verify_opening_file(tmp_path / "missing.bin")
    assert not ok and "cannot read the opening" in reason
    ok, reason, _ = verify_opening_file(b"POTO1\n\x00")
    assert not ok and "truncated" in reason


def test_replay_needs_a_validated_opening():
    with pytest.raises(ReplayError, match="needs a ValidatedOpening"):
        replay("opening.bin")
