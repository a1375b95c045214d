"""The trainer on a dev chain: registers, commits roots, answers a challenge; verifiers judge it."""

from __future__ import annotations

import pytest

from chain.calls import CommitWitness, RevealWitnessValue
from chain.dev import DevTransport
from chain.protocol import ProtocolParams, RunRegistered
from chain.view import ChainView
from challenges.opening import load_opening, validate_opening
from challenges.replay import replay
from challenges.verdict import FRAUD, HONEST
from challenges.witness import new_salt, witness_commitment
from commitments import merkle
from commitments.dataset import Dataset
from commitments.transcript import verify_transcript
from miner.trainer import Trainer, TrainerError
from tests.miner.helpers import corpus, tiny_spec, walk

STEPS = 4
CHALLENGED = 3
PARAMS = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=3, challenge_delay=1,
                        quorum_min_reveals=2, forced_challenge_steps=(CHALLENGED,))
VERIFIERS = ("v1", "v2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("data"))


def chain(path):
    miner = DevTransport(path, "miner", sealing="instant")
    miner.record_params(PARAMS)
    return miner


def seal_until(trainer, miner, cond, limit=40):
    for _ in range(limit):
        if cond():
            return
        miner.seal()
        trainer.poll()
    raise AssertionError("condition not reached")


def witness(path, trainer, miner):
    """Two verifiers fetch the opening, validate it against the chain, replay, commit and reveal."""
    view = ChainView(miner, PARAMS)
    view.sync()
    (reg,) = [e for e in view.of(RunRegistered)
              if e.run_id == trainer.run_id]
    (opened,) = [e for e in view.events if type(e).__name__ == "OpeningSubmitted"]
    (issued,) = [e for e in view.events if type(e).__name__ == "ChallengeIssued"]
    cid = opened.challenge_id
    assert opened.uri.endswith("/openings/" + opened.opening_digest.hex())
    op = load_opening(trainer.store.opening_path(opened.opening_digest))
    v = validate_opening(op, expected_digest=opened.opening_digest, run_id=reg.run_id, step=issued.step,
                         spec_digest=reg.spec_digest, dataset_hash=reg.dataset_hash,
                         schedule_commitment=reg.schedule_commitment, initial_hash=reg.initial_hash,
                         root=issued.root, size=issued.size)
    result = replay(v)
    salts = {}
    for name in VERIFIERS:
        t = DevTransport(path, name, sealing="instant")
        salts[name] = new_salt()
        t.submit([CommitWitness(challenge_id=cid, commitment=witness_commitment(
            cid, result.value_hash, result.norm_bucket, salts[name], name))])
    seal_until(trainer, miner, lambda: miner.finalized_head() > issued.commit_deadline)
    for name in VERIFIERS:
        DevTransport(path, name, sealing="instant").submit([RevealWitnessValue(
            challenge_id=cid, value_hash=result.value_hash, norm_bucket=result.norm_bucket, salt=salts[name])])
    return result


@pytest.mark.parametrize("fault", [None, CHALLENGED], ids=["honest", "substituted-batch"])
def test_run_on_dev_chain(tmp_path, data, fault):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    logs: list[str] = []
    tr = Trainer(spec, ds, tmp_path / "run", miner, keep_every=2, root_every=2, substitute_batch_at=fault,
                 progress=False, log=logs.append, endpoint="http://miner.example:8760/")
    tr.prepare()
    tr.register()
    tr.train()
    tr.submit_root()
    view = ChainView(miner, PARAMS)
    view.sync()
    run = view.state.runs[tr.run_id]
    assert run.miner == "miner" and run.endpoint == "http://miner.example:8760"
    assert (run.root, run.size) == (merkle.root(tr.store.leaves), STEPS + 1)
    roots = [e for e in view.events if type(e).__name__ == "CheckpointRootUpdated"]
    assert [e.size for e in roots] == [3, 5]  # root_every=2: after steps 2 and 4
    assert not [e for e in view.events if type(e).__name__ == "CallRefused"]

    seal_until(tr, miner, lambda: tr.answered)
    assert list(tr.issued.values()) == [CHALLENGED]
    result = witness(tmp_path / "chain.db", tr, miner)
    seal_until(tr, miner, lambda: tr.resolved)
    assert tr.poll() is True
    (verdict,) = tr.resolved.values()
    if fault is None:
        assert result.matches_leaf and verdict == HONEST
    else:
        assert not result.matches_leaf and verdict == FRAUD
    report = verify_transcript(tmp_path / "run" / "transcript.cbor")
    assert report.ok and report.records == 1 + 1 + STEPS + 2 + 1 + 1  # root, commitment, steps, roots, opening, verdict
    assert any("opened step 3" in line for line in logs)
    tr.close()


def test_resume_after_a_crash(tmp_path, data):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    first = Trainer(spec, ds, tmp_path / "run", None, keep_every=3, progress=False)
    first.prepare()
    first.train(steps=2)
    run_id = first.run_id
    first.close()  # as if the process died: state 2 is not kept (keep_every=3), leaves 0..2 are
    again = Trainer(spec, ds, tmp_path / "run", None, keep_every=3, progress=False, log=lambda m: None)
    again.prepare()
    assert again.run_id == run_id and again.state.step == 2
    again.train()
    assert again.store.leaves == walk(spec, data).leaves
    assert verify_transcript(tmp_path / "run" / "transcript.cbor").ok
    again.close()
    other = Trainer(tiny_spec(STEPS + 1), ds, tmp_path / "run", None, progress=False)
    with pytest.raises(TrainerError, match="another spec"):
        other.prepare()


def test_bad_arguments(tmp_path, data):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    with pytest.raises(TrainerError, match="outside steps 1..4"):
        Trainer(spec, ds, tmp_path / "r", None, substitute_batch_at=9)
    with pytest.raises(TrainerError, match="samples hold 9 tokens"):
        Trainer(spec, Dataset.open(data, 9), tmp_path / "r", None)
    tr = Trainer(spec, ds, tmp_path / "r", None, progress=False)
    tr.prepare()
    with pytest.raises(TrainerError, match="no chain transport"):
        tr.register()
    tr.close()


def test_cross_architecture_run_declares_the_norm_bucket(tmp_path, data):
    from oracle.norm_bucket import norm_bucket

    spec = tiny_spec(STEPS, profile="torch-native", hardware={"device": "cpu", "threads": 1})
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    tr = Trainer(spec, ds, tmp_path / "run", miner, keep_every=STEPS, progress=False, log=lambda m: None)
    tr.run(follow=False)
    seal_until(tr, miner, lambda: tr.answered)
    tr.poll()  # the block holding the answer
    (declared,) = [e for e in tr.view.events if type(e).__name__ == "NormBucketDeclared"]
    (issued,) = [e for e in tr.view.events if type(e).__name__ == "ChallengeIssued"]
    assert issued.mode == "bucket" and issued.step == CHALLENGED
    # States 2 and 3 were not kept (keep_every=4): the bucket comes from regenerated states.
    assert tr.store.kept_steps() == [0, STEPS]
    w = walk(spec, data)
    assert declared.bucket == norm_bucket(w.states[CHALLENGED - 1], w.states[CHALLENGED])
    tr.close()


def test_resume_on_chain_continues_the_root(tmp_path, data):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    first = Trainer(spec, ds, tmp_path / "run", miner, root_every=2, progress=False, log=lambda m: None)
    first.prepare()
    first.register()
    first.train(steps=3)  # root of size 3 went on chain after step 2; then the process "dies"
    first.close()
    again = Trainer(spec, ds, tmp_path / "run", miner, root_every=2, progress=False, log=lambda m: None)
    again.prepare()
    again.register()  # identical registration: a no-op on chain
    assert again.submitted_size == 3
    again.train()
    again.submit_root()
    view = ChainView(miner, PARAMS)
    view.sync()
    assert not [e for e in view.events if type(e).__name__ == "CallRefused"]
    assert [e.size for e in view.events if type(e).__name__ == "CheckpointRootUpdated"] == [3, 5]
    assert view.state.runs[again.run_id].root == merkle.root(walk(spec, data).leaves)
    again.close()


def test_registration_refused_is_named(tmp_path, data):
    from chain.calls import StartTrainingCommitment

    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    tr = Trainer(spec, ds, tmp_path / "run", miner, progress=False, submit_timeout=5)
    tr.prepare()
    # Another account takes the run id first (e.g. by copying it from the mempool).
    DevTransport(tmp_path / "chain.db", "thief", sealing="instant").submit([StartTrainingCommitment(
        run_id=tr.run_id, initial_hash=bytes(32), schedule_commitment=bytes(32), dataset_hash=bytes(32),
        spec=spec.to_cbor(), declared_steps=STEPS, endpoint="")])
    with pytest.raises(TrainerError, match="was not registered: .*already registered"):
        tr.register()
    tr.close()
