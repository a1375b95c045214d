"""The witness of a refused opening: a consensus rule, so every honest verifier computes it the
same way. An opening a verifier cannot use still gets a witness, so the verifier takes part.

Protocol v2 has ONE refused value per challenge, whatever the cause: a wrong digest, malformed
data, a bad proof, a batch that is not the schedule's, an oversize opening, an unavailable one, a
step that cannot be replayed. A miner that serves each verifier a different bad opening therefore
cannot split the honest votes: they all reveal the pair (refused_value_hash(challenge_id),
refused_value_hash(challenge_id)) with norm bucket REFUSED_BUCKET, and it can never equal H(leaf
t) of a real leaf. The verdict gives a refused opening one more opening window (a new round)
before it becomes fraud (docs/protocol.md).

The reason classes stay: a node records which one it saw in its own log and database, never on
chain.
"""

from __future__ import annotations

from commitments.hashing import digest

REFUSED_DOMAIN = "pot/witness-refused/v2"
REFUSED_BUCKET = -(2**31)
# Reason classes a node records locally. A download that fails for any reason is "unavailable"
# (see fetch_refusal_class); "too_large" stays a known class so older records still read.
REFUSAL_CLASSES = ("unavailable", "too_large", "malformed", "invalid", "replay_failed")
UNAVAILABLE = "unavailable"


def refused_value_hash(challenge_id: bytes, reason_class: str | None = None) -> bytes:
    """The one refused value of a challenge. `reason_class`, when given, is checked to be a known
    class and does not enter the value."""
    if reason_class is not None and reason_class not in REFUSAL_CLASSES:
        raise ValueError(f"unknown refusal class {reason_class!r}; known: {', '.join(REFUSAL_CLASSES)}")
    return digest(REFUSED_DOMAIN, bytes(challenge_id))


def refused_pair(challenge_id: bytes) -> tuple[bytes, bytes]:
    """(value_hash, proof_hash) a verifier reveals for a refused opening."""
    v = refused_value_hash(challenge_id)
    return v, v


def fetch_refusal_class(kind: str) -> str:
    """Every download failure kind gives one class. Which failure it was (a refused address, a
    name that did not resolve, a timeout, an HTTP status, a body too large or encoded) depends on
    the verifier's network as much as on the miner; the kind stays in the node's log."""
    del kind
    return UNAVAILABLE


__all__ = ["REFUSAL_CLASSES", "UNAVAILABLE", "REFUSED_BUCKET", "REFUSED_DOMAIN", "fetch_refusal_class",
           "refused_pair", "refused_value_hash"]
