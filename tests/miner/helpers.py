"""Shared test material: tiny specs, the default corpus, and honest (or faulty) walks of a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commitments.dataset import Dataset, prepare_default_corpus, train_validation_split
from commitments.leaves import initial_leaf, loss_bits, step_leaf
from commitments.schedule import Schedule, derive_schedule
from commitments.spec import Spec
from miner.trainer import Trainer

RUN_ID = bytes(range(32))


def tiny_spec(steps: int = 6, kind: str = "mlp", **over: Any) -> Spec:
    """A spec small enough for a step in well under a second (MLP, or a 1-layer GPT)."""
    model: dict[str, Any] = {"kind": kind, "block_size": 16}
    if kind == "mlp":
        model["hidden"] = [32]
    else:
        model.update(n_layer=1, n_head=2, n_embd=32)
    d: dict[str, Any] = {"steps": steps, "model": model, "batch": {"batch_size": 4, "seq_len": 16},
                         "rng": {"seed": 7, "schedule_seed": 11}}
    for k, v in over.items():
        d[k] = v
    return Spec.from_dict(d)


def corpus(directory: Path) -> Path:
    path = directory / "corpus.npy"
    if not path.exists():
        prepare_default_corpus(path, max_bytes=200_000)
    return path


def schedule_for(spec: Spec, ds: Dataset) -> Schedule:
    train, _ = train_validation_split(ds.num_samples)
    return derive_schedule(spec.rng.schedule_seed, len(train), spec.steps, spec.batch.batch_size)


@dataclass
class Walk:
    spec: Spec
    dataset: Dataset
    schedule: Schedule
    states: list[Any]  # states[t] = state after step t
    leaves: list[bytes]


def walk(
    spec: Spec, corpus_path: Path, steps: int | None = None, *, substitute_at: int | None = None
) -> Walk:
    """Walk `steps` steps from the seed; step `substitute_at` trains on another batch (a fault)."""
    from oracle.step import init_state, step

    ds = Dataset.open(corpus_path, spec.sample_len)
    schedule = schedule_for(spec, ds)
    state = init_state(spec)
    states, leaves = [state], [initial_leaf(state.digest())]
    for t in range(1, (steps or spec.steps) + 1):
        idx = schedule.batch(t)
        if t == substitute_at:
            idx = [(i + 1) % ds.num_samples for i in idx]
        state, loss = step(state, ds.batch(idx), spec, t)
        states.append(state)
        leaves.append(step_leaf(t, state.digest(), loss_bits(loss)))
    return Walk(spec, ds, schedule, states, leaves)


def served_run(base: Path) -> tuple[Path, bytes, bytes, bytes, Any]:
    """Train a 3-step tiny run in base/run and store the opening of step 2 (challenged at index 4),
    as a prover serves it: (run folder, run id, opening digest, opening bytes, leaves)."""
    spec = tiny_spec(3)
    tr = Trainer(spec, Dataset.open(corpus(base), spec.sample_len), base / "run", None, progress=False)
    tr.prepare()
    tr.train()
    d, data = tr.opening_for(2, 4)
    tr.store.put_opening(d, data)
    tr.close()
    return base / "run", tr.run_id, d, data, tr.store.leaves


def witness_calls(challenge_id: bytes, verifier: str, result: Any, *, salt: bytes | None = None,
                  value_hash: bytes | None = None, proof_hash: bytes | None = None) -> tuple[Any, Any]:
    """(commit_witness, reveal_witness_value) of `verifier` for a replay `result`
    (challenges.replay.ReplayResult): the witness pair is H(recomputed leaf t) and the state proof
    of the recomputed post-state, unless `value_hash` / `proof_hash` stand in (a faulty verifier)."""
    from chain.calls import CommitWitness, RevealWitnessValue
    from challenges.witness import new_salt, state_proof, witness_commitment

    salt = salt if salt is not None else new_salt()
    value = result.value_hash if value_hash is None else value_hash
    proof = state_proof(challenge_id, result.state.items()) if proof_hash is None else proof_hash
    commitment = witness_commitment(challenge_id, value, result.norm_bucket, salt, verifier, proof_hash=proof)
    return (CommitWitness(challenge_id=challenge_id, commitment=commitment),
            RevealWitnessValue(challenge_id=challenge_id, value_hash=value, proof_hash=proof,
                               norm_bucket=result.norm_bucket, salt=salt))


def bond_verifiers(path: Path, names: Any, amount: int = 100) -> None:
    """Each of `names` bonds `amount` on the dev chain at `path` (before any challenge it is to sit on)."""
    from chain.calls import BondVerifier
    from chain.dev import DevTransport

    for name in names:
        t = DevTransport(path, name)  # the chain's own sealing
        t.submit([BondVerifier(amount=amount)])
        t.close()
