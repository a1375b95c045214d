"""Witness commitments: a verifier binds itself to its recomputed value before anyone reveals.

commitment = digest("pot/witness/v1", challenge_id, value_hash, norm_bucket, salt, verifier_id).
The verifier id is inside the hash so one verifier cannot copy another's commitment and later
reveal the other's value as its own.
"""

from __future__ import annotations

import hmac
import secrets

from commitments.hashing import digest

DOMAIN = "pot/witness/v1"
SALT_BYTES = 32


class WitnessError(ValueError):
    """Commitment inputs of the wrong shape, with the field named."""


def new_salt() -> bytes:
    """A fresh secret salt (32 bytes from the OS's CSPRNG). Persist it before committing."""
    return secrets.token_bytes(SALT_BYTES)


def _check(challenge_id: bytes, value_hash: bytes, norm_bucket: int, salt: bytes, verifier_id: str) -> None:
    if not isinstance(challenge_id, (bytes, bytearray)) or len(challenge_id) != 32:
        raise WitnessError("challenge_id must be 32 bytes")
    if not isinstance(value_hash, (bytes, bytearray)) or len(value_hash) != 32:
        raise WitnessError("value_hash must be 32 bytes")
    if isinstance(norm_bucket, bool) or not isinstance(norm_bucket, int):
        raise WitnessError(f"norm_bucket must be an integer, got {type(norm_bucket).__name__}")
    if not isinstance(salt, (bytes, bytearray)) or not 16 <= len(salt) <= 64:
        raise WitnessError("salt must be 16..64 bytes")
    if not isinstance(verifier_id, str) or not verifier_id:
        raise WitnessError("verifier_id must be a non-empty account id")


def witness_commitment(
    challenge_id: bytes, value_hash: bytes, norm_bucket: int, salt: bytes, verifier_id: str
) -> bytes:
    """The 32-byte commitment a verifier submits with `commit_witness`."""
    _check(challenge_id, value_hash, norm_bucket, salt, verifier_id)
    return digest(DOMAIN, bytes(challenge_id), bytes(value_hash), norm_bucket, bytes(salt), verifier_id)


def verify_witness(
    commitment: bytes, challenge_id: bytes, value_hash: bytes, norm_bucket: int, salt: bytes, verifier_id: str
) -> bool:
    """True iff the revealed (value_hash, norm_bucket, salt) open `commitment` for this verifier."""
    try:
        expected = witness_commitment(challenge_id, value_hash, norm_bucket, salt, verifier_id)
    except WitnessError:
        return False
    return isinstance(commitment, (bytes, bytearray)) and hmac.compare_digest(expected, bytes(commitment))
