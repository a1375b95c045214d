"""The witness value of a refused opening: a consensus rule, so every honest verifier computes it
the same way. An opening a verifier cannot use still gets a witness, so the verifier takes part:
value refused_value_hash(challenge_id, reason_class) with norm bucket REFUSED_BUCKET.

The value is digest("pot/witness-refused/v1", challenge_id, reason_class): nodes that refuse for
the same class reveal the same value, and it can never equal H(leaf t) of a real leaf.
"""

from __future__ import annotations

from commitments.hashing import digest

REFUSED_DOMAIN = "pot/witness-refused/v1"
REFUSED_BUCKET = -(2**31)
# Reason classes, coarse on purpose: nodes that refuse for the same cause must cluster.
REFUSAL_CLASSES = ("unavailable", "too_large", "malformed", "invalid", "replay_failed")


def refused_value_hash(challenge_id: bytes, reason_class: str) -> bytes:
    if reason_class not in REFUSAL_CLASSES:
        raise ValueError(f"unknown refusal class {reason_class!r}; known: {', '.join(REFUSAL_CLASSES)}")
    return digest(REFUSED_DOMAIN, bytes(challenge_id), reason_class)


def fetch_refusal_class(kind: str) -> str:
    """Download failure kinds to refusal classes: a too-large file is the miner's fault, like no file."""
    return "too_large" if kind == "too_large" else "unavailable"


__all__ = ["REFUSAL_CLASSES", "REFUSED_BUCKET", "REFUSED_DOMAIN", "fetch_refusal_class", "refused_value_hash"]
