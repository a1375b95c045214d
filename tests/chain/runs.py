"""A synthetic training run for protocol tests: spec, step leaves, roots and proofs.

The leaves are real step leaves over made-up state digests; what the protocol checks (Merkle
proofs, leaf format, H(leaf t)) is exactly what it checks for a real run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chain.calls import (
    BondVerifier,
    CommitWitness,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    derive_run_id,
)
from challenges.witness import witness_commitment
from commitments import merkle
from commitments.hashing import digest
from commitments.leaves import step_leaf, witness_value_hash
from commitments.spec import Spec


@dataclass
class SyntheticRun:
    steps: int = 8
    seed: str = "run-a"
    profile: str = "exact-v1"
    endpoint: str = "http://miner.test:8000"
    miner: str = "miner"  # the account that registers it: the run id is derived from it
    leaves: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.leaves = [
            step_leaf(t, digest("pot/test/state/v1", self.seed, t), 0 if t == 0 else 0x40000000 + t)
            for t in range(self.steps + 1)
        ]

    @property
    def spec(self) -> Spec:
        kw = {"steps": self.steps, "profile": self.profile}
        if self.profile != "exact-v1":
            kw["hardware"] = {"device": "cuda", "isa": "sm90", "threads": 1}
        return Spec.from_dict(kw)

    @property
    def nonce(self) -> bytes:
        return digest("pot/test/run-nonce/v1", self.seed)[:16]

    @property
    def run_id(self) -> bytes:
        return derive_run_id(self.miner, self.nonce)

    def register(self, **overrides) -> StartTrainingCommitment:
        fields = {
            "run_id": self.run_id,
            "nonce": self.nonce,
            "initial_hash": digest("pot/test/state/v1", self.seed, 0),
            "schedule_commitment": digest("pot/test/schedule/v1", self.seed),
            "dataset_hash": digest("pot/test/dataset/v1", self.seed),
            "spec": self.spec.to_cbor(),
            "declared_steps": self.steps,
            "endpoint": self.endpoint,
        }
        fields.update(overrides)
        return StartTrainingCommitment(**fields)

    def root(self, size: int) -> bytes:
        return merkle.root(self.leaves[:size])

    def submit_root(self, size: int, old_size: int = 0) -> SubmitCheckpointRoot:
        proof = merkle.consistency_proof(self.leaves[:size], old_size) if old_size else []
        return SubmitCheckpointRoot(self.run_id, self.root(size), size, proof)

    def submit_full_root(self) -> SubmitCheckpointRoot:
        return self.submit_root(self.steps + 1)

    def opening(self, challenge_id: bytes, step: int, *, leaf: bytes | None = None) -> SubmitOpening:
        proof = merkle.inclusion_proof(self.leaves, step)
        return SubmitOpening(
            challenge_id,
            digest("pot/test/opening/v1", challenge_id),
            f"{self.endpoint}/openings/{challenge_id.hex()}",
            leaf if leaf is not None else self.leaves[step],
            proof,
        )

    def value_hash(self, step: int) -> bytes:
        return witness_value_hash(self.leaves[step])


def proof(challenge_id: bytes) -> bytes:
    """The proof half every honest replayer of a synthetic run reveals for a challenge (a real
    run's is challenges.witness.state_proof of the post-state; synthetic runs have no tensors)."""
    return digest("pot/test/proof/v1", challenge_id)


def bond(amount: int = 100) -> BondVerifier:
    return BondVerifier(amount=amount)


def witness(challenge_id: bytes, verifier: str, value_hash: bytes, bucket: int = 0,
            salt: bytes | None = None, proof_hash: bytes | None = None) -> tuple[CommitWitness, RevealWitnessValue]:
    """The (commit, reveal) pair of one verifier for one challenge. `proof_hash` defaults to the
    honest replayer's `proof(challenge_id)`."""
    salt = salt if salt is not None else digest("pot/test/salt/v1", challenge_id, verifier)
    p = proof(challenge_id) if proof_hash is None else proof_hash
    com = witness_commitment(challenge_id, value_hash, bucket, salt, verifier, proof_hash=p)
    return CommitWitness(challenge_id, com), RevealWitnessValue(challenge_id, value_hash, p, bucket, salt)
