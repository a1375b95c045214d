"""Pipeline stages on real openings: validation refusals, loss checks on served leaves, warm replay
workers (match, mismatch, timeout)."""

from __future__ import annotations

import time

import pytest

from challenges.losschecks import LossCheckConfig
from challenges.opening import build_opening, encode_leaves, load_opening
from commitments import merkle
from commitments.leaves import witness_value_hash
from node.pipeline import ChainFacts, ReplayPool, stage_losschecks, stage_validate
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk

STEP = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    spec = tiny_spec(4)
    return {"honest": walk(spec, corpus(d)), "fraud": walk(spec, corpus(d), substitute_at=STEP), "dir": d}


def opening_file(runs, kind: str, name: str):
    w = runs[kind]
    data = build_opening(
        spec=w.spec,
        run_id=RUN_ID,
        step=STEP,
        pre_state=w.states[STEP - 1],
        dataset=w.dataset,
        schedule=w.schedule,
        leaves=w.leaves,
    )
    path = runs["dir"] / name
    path.write_bytes(data)
    return path, load_opening(data).digest


def facts(w, digest: bytes) -> ChainFacts:
    return ChainFacts(expected_digest=digest, run_id=RUN_ID, step=STEP, spec_digest=w.spec.digest(),
                      dataset_hash=w.dataset.dataset_hash, schedule_commitment=w.schedule.commitment,
                      initial_hash=w.states[0].digest(), root=merkle.root(w.leaves), size=len(w.leaves))


def test_validate_accepts_honest_and_names_each_refusal(runs):
    path, digest = opening_file(runs, "honest", "h.opening")
    w = runs["honest"]
    assert stage_validate(path, facts(w, digest), max_bytes=10**8).ok
    bad = stage_validate(path, facts(w, b"\x00" * 32), max_bytes=10**8)
    assert (bad.ok, bad.refusal_class) == (False, "invalid") and "opening digest" in bad.reason
    garbage = runs["dir"] / "garbage.opening"
    garbage.write_bytes(b"not an opening at all")
    bad = stage_validate(garbage, facts(w, digest), max_bytes=10**8)
    assert bad.refusal_class == "malformed" and "does not start with" in bad.reason
    small = stage_validate(path, facts(w, digest), max_bytes=100)
    assert small.refusal_class == "malformed"


def test_losschecks_on_served_leaves(runs, tmp_path):
    w = runs["honest"]
    leaves = tmp_path / "leaves.cbor"
    leaves.write_bytes(encode_leaves(w.leaves))
    out = stage_losschecks(leaves, root=merkle.root(w.leaves), size=len(w.leaves), config=LossCheckConfig())
    assert out.data["steps"] == len(w.leaves) - 1 and "findings" in out.data
    wrong = stage_losschecks(leaves, root=b"\x00" * 32, size=len(w.leaves), config=LossCheckConfig())
    assert wrong.data["ok"] is False and "committed root" in wrong.data["error"]
    missing = stage_losschecks(tmp_path / "none.cbor", root=b"\x00" * 32, size=2, config=LossCheckConfig())
    assert "did not serve" in missing.data["error"]


def _wait(pool: ReplayPool, n: int, timeout: float = 240):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += pool.poll()
        time.sleep(0.1)
    return dict(out)


H, F = b"h" * 32, b"f" * 32  # the pool's keys are challenge ids (the proof hash is keyed by them)


def test_replay_pool_matches_honest_and_catches_the_substituted_batch(runs):
    from challenges.replay import verify_opening_file
    from challenges.witness import state_proof

    hp, hd = opening_file(runs, "honest", "h2.opening")
    fp, fd = opening_file(runs, "fraud", "f.opening")
    pool = ReplayPool(2, timeout_s=300)
    try:
        pool.start(H, hp, facts(runs["honest"], hd), max_bytes=10**8)
        pool.start(F, fp, facts(runs["fraud"], fd), max_bytes=10**8)
        assert pool.free() == 0 and pool.running(H)
        done = _wait(pool, 2)
    finally:
        pool.shutdown()
    honest, fraud = done[H], done[F]
    assert honest["ok"] and honest["matches"]
    assert honest["result"]["value_hash"] == witness_value_hash(runs["honest"].leaves[STEP])
    # The pair's proof half: the keyed digest of the replayed post-state, for this challenge id.
    ok, _, here = verify_opening_file(hp, challenge_id=H, **facts(runs["honest"], hd).kwargs())
    assert ok and honest["result"]["proof_hash"] == here.proof_hash == state_proof(H, here.state.items())
    assert state_proof(F, here.state.items()) != here.proof_hash
    assert fraud["result"]["proof_hash"] not in (None, here.proof_hash)
    assert fraud["ok"] and not fraud["matches"] and "differs" in fraud["reason"]
    assert fraud["result"]["value_hash"] != witness_value_hash(runs["fraud"].leaves[STEP])
    # The honest recomputation of step t from the fraud run's pre-state is what honest nodes reveal.
    assert fraud["result"]["leaf"] != runs["fraud"].leaves[STEP]


def test_replay_pool_kills_a_replay_past_its_timeout(runs):
    hp, hd = opening_file(runs, "honest", "h3.opening")
    pool = ReplayPool(1, timeout_s=0.2)
    try:
        pool.start(H, hp, facts(runs["honest"], hd), max_bytes=10**8)
        done = _wait(pool, 1, timeout=30)
        assert done[H]["ok"] is False and done[H]["timeout"] is True
        assert pool.free() == 1  # a fresh worker replaced the killed one
    finally:
        pool.shutdown()


def test_warm_up_loads_what_validation_imports():
    # A fresh interpreter: the node's own imports leave torch and the oracle unloaded, and the
    # warm-up loads them (the first validation used to pay for it inside the stage's time).
    import json
    import subprocess
    import sys

    code = ("import json, sys; from node.pipeline import warm_up; "
            "mods = ('torch', 'oracle.state', 'challenges.opening', 'commitments.tensors'); "
            "before = [m in sys.modules for m in mods]; s = warm_up(); "
            "print(json.dumps([before, [m in sys.modules for m in mods], s]))")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    before, after, seconds = json.loads(out.stdout.strip().splitlines()[-1])
    assert before[0] is False  # importing the pipeline does not load torch ...
    assert after == [True, True, True, True] and seconds > 0  # ... the warm-up does


def test_start_warm_up_reports_when_done():
    from node.pipeline import start_warm_up

    seen = []
    start_warm_up(seen.append).join(60)
    assert len(seen) == 1 and seen[0] >= 0.0
