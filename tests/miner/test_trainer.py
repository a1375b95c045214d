"""The trainer on a dev chain: registers its own run id, commits roots, answers every round of its
challenges; bonded verifiers judge them."""

from __future__ import annotations

import pytest

from chain.calls import derive_run_id
from chain.dev import DevTransport
from chain.protocol import ProtocolParams, RunRegistered
from chain.view import ChainView
from challenges.opening import load_opening, validate_opening
from challenges.replay import replay
from challenges.verdict import FRAUD, HONEST, INCONCLUSIVE
from commitments import merkle
from commitments.dataset import Dataset
from commitments.transcript import verify_transcript
from miner.trainer import OFFLINE_ACCOUNT, Trainer, TrainerError
from tests.miner.helpers import bond_verifiers, corpus, tiny_spec, walk, witness_calls

STEPS = 4
CHALLENGED = 3
PARAMS = ProtocolParams(commit_window=4, reveal_window=4, opening_deadline=3, challenge_delay=1,
                        challenges_per_run=1, quorum_min_reveals=2, forced_challenge_steps=(CHALLENGED,))
VERIFIERS = ("v1", "v2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("data"))


def chain(path, params=PARAMS, verifiers=VERIFIERS):
    """An instant dev chain with the test's parameters, its verifiers bonded before any challenge."""
    miner = DevTransport(path, "miner", sealing="instant")
    miner.record_params(params)
    bond_verifiers(path, verifiers)
    return miner


def seal_until(trainer, miner, cond, limit=40):
    for _ in range(limit):
        if cond():
            return
        miner.seal()
        trainer.poll()
    raise AssertionError("condition not reached")


def witness(path, trainer, miner):
    """Two verifiers fetch the opening, validate it against the chain, replay, commit and reveal the
    witness pair (H(recomputed leaf t), the state proof of the recomputed post-state)."""
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
    assert set(issued.committee) == set(VERIFIERS)  # bonded before the challenge: both sit on it
    calls = {name: witness_calls(cid, name, result) for name in VERIFIERS}
    for name in VERIFIERS:
        DevTransport(path, name, sealing="instant").submit([calls[name][0]])
    seal_until(trainer, miner, lambda: miner.finalized_head() > issued.commit_deadline)
    for name in VERIFIERS:
        DevTransport(path, name, sealing="instant").submit([calls[name][1]])
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
    assert tr.run_id == derive_run_id("miner", tr.nonce) and len(tr.nonce) == 16
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
    assert (
        report.ok and report.records == 1 + 1 + STEPS + 2 + 1 + 1
    )  # root, commitment, steps, roots, opening, verdict
    assert any("opened step 3" in line for line in logs)
    assert tr.final_verdicts() == tr.resolved
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
    assert again.nonce == first.nonce and run_id == derive_run_id(OFFLINE_ACCOUNT, first.nonce)
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
    with pytest.raises(TrainerError, match="at most 4"):
        Trainer(spec, ds, tmp_path / "m", None, mirrors=[f"http://m{i}.example" for i in range(5)])
    with pytest.raises(TrainerError, match="base URL"):
        Trainer(spec, ds, tmp_path / "m", None, mirrors=["ftp://m.example"])
    with pytest.raises(TrainerError, match="listed twice"):
        Trainer(spec, ds, tmp_path / "m", None, mirrors=["http://m.example/", "http://m.example"])
    with pytest.raises(TrainerError, match="too long"):
        Trainer(spec, ds, tmp_path / "m", None, mirrors=["http://m.example/" + "x" * 500])
    with pytest.raises(TrainerError, match="the endpoint is too long"):
        Trainer(spec, ds, tmp_path / "m", None, endpoint="http://m.example/" + "x" * 500)
    with pytest.raises(TrainerError, match="signs as"):
        Trainer(spec, ds, tmp_path / "m", DevTransport(tmp_path / "c.db", "miner"), account="other")


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


def test_a_copied_registration_is_refused_and_the_owner_registers(tmp_path, data):
    from chain.calls import StartTrainingCommitment

    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    tr = Trainer(spec, ds, tmp_path / "run", miner, progress=False, submit_timeout=5)
    tr.prepare()
    # Another account copies the registration out of the pool, nonce and all: the run id is not its own.
    thief = DevTransport(tmp_path / "chain.db", "thief", sealing="instant")
    thief.submit([tr.registration()])
    view = ChainView(miner, PARAMS)
    view.sync()
    (refusal,) = [e for e in view.events if type(e).__name__ == "CallRefused"]
    assert (refusal.origin, refusal.refusal) == ("thief", "RunIdNotOwned")
    assert tr.run_id not in view.state.runs
    tr.register()
    assert tr.view.state.runs[tr.run_id].miner == "miner"
    tr.close()
    # A run id registered by its owner with other commitments is not this run's.
    other = Trainer(spec, ds, tmp_path / "run2", miner, progress=False, submit_timeout=5)
    other.prepare()
    fields = {**other.registration().to_wire(), "endpoint": "http://elsewhere.example"}
    miner.submit(
        [StartTrainingCommitment(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})]
    )
    with pytest.raises(
        TrainerError, match="was not registered: .*already registered with different commitments"
    ):
        other.register()
    other.close()


def test_a_run_directory_keeps_its_account(tmp_path, data):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    first = Trainer(spec, ds, tmp_path / "run", miner, progress=False, log=lambda m: None)
    first.prepare()
    first.close()
    other = Trainer(
        spec, ds, tmp_path / "run", DevTransport(tmp_path / "chain.db", "someone-else"), progress=False
    )
    with pytest.raises(TrainerError, match="belongs to account 'miner'.*signs as 'someone-else'"):
        other.prepare()


def test_every_round_of_a_rechallenged_step_is_opened(tmp_path, data):
    """Two verifiers bond and never witness: round 1 is inconclusive and re-challenged under a new
    id, round 2 too, and round 3 (the dispute round) is left unresolved. (With no bonded verifier a
    run is never challenged: a challenge waits for seats.) The trainer opens each round with the
    same file, within each round's deadline."""
    params = ProtocolParams(commit_window=2, reveal_window=2, opening_deadline=3, challenge_delay=1,
                            challenges_per_run=1, max_rounds=3, quorum_min_reveals=2,
                            forced_challenge_steps=(CHALLENGED,))
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db", params, verifiers=("v1", "v2"))
    logs: list[str] = []
    tr = Trainer(spec, ds, tmp_path / "run", miner, keep_every=2, progress=False, log=logs.append)
    tr.run(follow=False)
    seal_until(tr, miner, tr.all_resolved, limit=80)
    view = ChainView(miner, params)
    view.sync()
    issued = [e for e in view.events if type(e).__name__ == "ChallengeIssued"]
    opened = {e.challenge_id: e for e in view.events if type(e).__name__ == "OpeningSubmitted"}
    resolved = {e.challenge_id: e for e in view.events if type(e).__name__ == "ChallengeResolved"}
    assert [e.round for e in issued] == [1, 2, 3] and {e.step for e in issued} == {CHALLENGED}
    assert len({e.challenge_id for e in issued}) == 3
    assert [e.first for e in issued] == [None, issued[0].challenge_id, issued[0].challenge_id]
    for e in issued:
        assert e.challenge_id in opened and opened[e.challenge_id].block <= e.opening_deadline
        assert resolved[e.challenge_id].verdict == INCONCLUSIVE
    assert [resolved[e.challenge_id].rechallenge for e in issued] == [issued[1].challenge_id,
                                                                      issued[2].challenge_id, None]
    assert len({o.opening_digest for o in opened.values()}) == 1  # one file serves every round
    assert set(tr.answered) == {e.challenge_id for e in issued}
    assert tr.final_verdicts() == {issued[0].challenge_id: INCONCLUSIVE}
    assert not [e for e in view.events if type(e).__name__ == "CallRefused"]
    assert any("round 2" in line for line in logs)
    tr.close()


def test_openings_name_the_mirrors(tmp_path, data):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    tr = Trainer(spec, ds, tmp_path / "run", miner, progress=False, log=lambda m: None,
                 endpoint="http://miner.example:8760", mirrors=["https://cdn.example/run-a/", "http://10.1.2.3:9000"])
    tr.run(follow=False)
    seal_until(tr, miner, lambda: tr.answered)
    tr.poll()
    (opened,) = [e for e in tr.view.events if type(e).__name__ == "OpeningSubmitted"]
    path = f"/openings/{opened.opening_digest.hex()}"
    assert opened.uri == "http://miner.example:8760" + path
    assert opened.mirrors == ("https://cdn.example/run-a" + path, "http://10.1.2.3:9000" + path)
    tr.close()


def test_a_restarted_trainer_does_not_reopen_what_is_opened(tmp_path, data):
    spec = tiny_spec(STEPS)
    ds = Dataset.open(data, spec.sample_len)
    miner = chain(tmp_path / "chain.db")
    first = Trainer(spec, ds, tmp_path / "run", miner, progress=False, log=lambda m: None)
    first.run(follow=False)
    seal_until(first, miner, lambda: first.answered)
    first.close()
    again = Trainer(spec, ds, tmp_path / "run", miner, progress=False, log=lambda m: None)
    again.run(follow=False)  # the identical registration again, and the roots it has sent
    again.poll()
    assert again.answered == first.answered and not again.failed
    view = ChainView(miner, PARAMS)
    view.sync()
    assert len([e for e in view.events if type(e).__name__ == "OpeningSubmitted"]) == 1
    assert not [e for e in view.events if type(e).__name__ == "CallRefused"]
    again.close()
