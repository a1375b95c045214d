"""A synthetic training run for protocol tests: spec, step leaves, roots and proofs.

The leaves are real step leaves over made-up state digests; what the protocol checks (Merkle
proofs, leaf format, H(leaf t)) is exactly what it checks for a real run.
"""

from __future__ import annotations

from chain.calls import (
    BondVerifier,
    CommitWitness,
    RevealWitnessValue,
)
from chain.protocol import vectors
from challenges.witness import witness_commitment
from commitments.hashing import digest

# The synthetic run of the conformance vectors: made-up state digests with real step leaves,
# roots and proofs.
SyntheticRun = vectors.SyntheticRun


def proof(challenge_id: bytes) -> bytes:
    """The proof half every honest replayer of a synthetic run reveals for a challenge (a real
    run's is challenges.witness.state_proof of the post-state; synthetic runs have no tensors)."""
    return vectors.honest_proof(challenge_id)


def bond(amount: int = 100) -> BondVerifier:
    return BondVerifier(amount=amount)


def witness(
    challenge_id: bytes,
    verifier: str,
    value_hash: bytes,
    bucket: int = 0,
    salt: bytes | None = None,
    proof_hash: bytes | None = None,
) -> tuple[CommitWitness, RevealWitnessValue]:
    """The (commit, reveal) pair of one verifier for one challenge. `proof_hash` defaults to the
    honest replayer's `proof(challenge_id)`."""
    salt = salt if salt is not None else digest("pot/test/salt/v1", challenge_id, verifier)
    p = proof(challenge_id) if proof_hash is None else proof_hash
    com = witness_commitment(challenge_id, value_hash, bucket, salt, verifier, proof_hash=p)
    return CommitWitness(challenge_id, com), RevealWitnessValue(challenge_id, value_hash, p, bucket, salt)
