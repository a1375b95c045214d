"""Witness commitments: a verifier binds itself to its recomputed witness before anyone reveals.

The witness is a pair. `value_hash` = H(recomputed leaf t) says whether the miner's committed leaf
is right; anyone can read H(leaf t) off the chain, so it proves no work. `proof_hash` =
`state_proof(challenge_id, post-state)` is a digest of every byte of the recomputed post-step
state keyed by the challenge: no public data gives it (the miner never publishes it, the opening
holds the state before the step), so only a verifier that replayed the step can reveal it.

commitment = digest("pot/witness/v2", challenge_id, value_hash, proof_hash, norm_bucket, salt,
verifier_id). The verifier id is inside the hash so one verifier cannot copy another's commitment
and later reveal the other's value as its own.
"""

from __future__ import annotations

import hmac
import secrets

from commitments.hashing import digest

DOMAIN = "pot/witness/v2"
PROOF_DOMAIN = "pot/witness-proof/v2"
PROOF_KEY_DOMAIN = "pot/witness-key/v2"
SALT_BYTES = 32


class WitnessError(ValueError):
    """Commitment inputs of the wrong shape, with the field named."""


def new_salt() -> bytes:
    """A fresh secret salt (32 bytes from the OS's CSPRNG). Persist it before committing."""
    return secrets.token_bytes(SALT_BYTES)


def _check(challenge_id: bytes, value_hash: bytes, proof_hash: bytes, norm_bucket: int, salt: bytes,
           verifier_id: str) -> None:
    if not isinstance(challenge_id, (bytes, bytearray)) or len(challenge_id) != 32:
        raise WitnessError("challenge_id must be 32 bytes")
    if not isinstance(value_hash, (bytes, bytearray)) or len(value_hash) != 32:
        raise WitnessError("value_hash must be 32 bytes")
    if not isinstance(proof_hash, (bytes, bytearray)) or len(proof_hash) != 32:
        raise WitnessError("proof_hash must be 32 bytes")
    if isinstance(norm_bucket, bool) or not isinstance(norm_bucket, int):
        raise WitnessError(f"norm_bucket must be an integer, got {type(norm_bucket).__name__}")
    if not isinstance(salt, (bytes, bytearray)) or not 16 <= len(salt) <= 64:
        raise WitnessError("salt must be 16..64 bytes")
    if not isinstance(verifier_id, str) or not verifier_id:
        raise WitnessError("verifier_id must be a non-empty account id")


def witness_commitment(
    challenge_id: bytes, value_hash: bytes, norm_bucket: int, salt: bytes, verifier_id: str, *,
    proof_hash: bytes,
) -> bytes:
    """The 32-byte commitment a verifier submits with `commit_witness`."""
    _check(challenge_id, value_hash, proof_hash, norm_bucket, salt, verifier_id)
    return digest(DOMAIN, bytes(challenge_id), bytes(value_hash), bytes(proof_hash), norm_bucket, bytes(salt),
                  verifier_id)


def verify_witness(
    commitment: bytes,
    challenge_id: bytes,
    value_hash: bytes,
    norm_bucket: int,
    salt: bytes,
    verifier_id: str,
    *,
    proof_hash: bytes,
) -> bool:
    """True iff the revealed (value_hash, proof_hash, norm_bucket, salt) open `commitment` for this
    verifier."""
    try:
        expected = witness_commitment(challenge_id, value_hash, norm_bucket, salt, verifier_id,
                                      proof_hash=proof_hash)
    except WitnessError:
        return False
    return isinstance(commitment, (bytes, bytearray)) and hmac.compare_digest(expected, bytes(commitment))


def proof_key(challenge_id: bytes) -> bytes:
    """The 32-byte BLAKE3 key of a challenge's state proof: digest("pot/witness-key/v2", challenge_id)."""
    if not isinstance(challenge_id, (bytes, bytearray)) or len(challenge_id) != 32:
        raise WitnessError("challenge_id must be 32 bytes")
    return digest(PROOF_KEY_DOMAIN, bytes(challenge_id))


def state_proof(challenge_id: bytes, items) -> bytes:
    """The proof half of a witness: digest("pot/witness-proof/v2", challenge_id, [[name,
    keyed_tensor_digest], ...]) over the post-state's (name, tensor) pairs in canonical order,
    each tensor's canonical bytes hashed with BLAKE3 in keyed mode under `proof_key(challenge_id)`.

    Every byte of every tensor (parameters, both AdamW moments, the step counter) enters it, so
    it cannot be had from the leaf's state digest, the per-tensor digests, or any other state."""
    from commitments.tensors import keyed_tensor_digests

    key = proof_key(challenge_id)
    return digest(PROOF_DOMAIN, bytes(challenge_id), [[n, d] for n, d in keyed_tensor_digests(items, key)])
