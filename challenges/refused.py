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
# Reason classes, coarse on purpose: nodes that refuse for the same cause must cluster. A download
# that fails for any reason is "unavailable" (see fetch_refusal_class); "too_large" stays a known
# class so that values revealed by earlier versions still read, but no download gives it now.
REFUSAL_CLASSES = ("unavailable", "too_large", "malformed", "invalid", "replay_failed")
UNAVAILABLE = "unavailable"


def refused_value_hash(challenge_id: bytes, reason_class: str) -> bytes:
    if reason_class not in REFUSAL_CLASSES:
        raise ValueError(f"unknown refusal class {reason_class!r}; known: {', '.join(REFUSAL_CLASSES)}")
    return digest(REFUSED_DOMAIN, bytes(challenge_id), reason_class)


def fetch_refusal_class(kind: str) -> str:
    """Every download failure kind gives one class. Which failure it was (a refused address, a
    name that did not resolve, a timeout, an HTTP status, a body too large or encoded) depends on
    the verifier's network as much as on the miner, and the revealed value is public: a miner
    must not learn from it whether some internal address answered. The kind stays in the node's log."""
    del kind
    return UNAVAILABLE


__all__ = ["REFUSAL_CLASSES", "UNAVAILABLE", "REFUSED_BUCKET", "REFUSED_DOMAIN", "fetch_refusal_class", "refused_value_hash"]
