"""The refused-opening witness value: one consensus rule every honest verifier computes alike."""

from __future__ import annotations

import pytest

from challenges.refused import REFUSAL_CLASSES, REFUSED_BUCKET, fetch_refusal_class, refused_value_hash
from commitments.hashing import digest


def test_refused_value_rule():
    cid = b"\x01" * 32
    values = {refused_value_hash(cid, c) for c in REFUSAL_CLASSES}
    assert len(values) == len(REFUSAL_CLASSES)
    assert refused_value_hash(cid, "invalid") == refused_value_hash(cid, "invalid")
    assert refused_value_hash(cid, "invalid") != refused_value_hash(b"\x02" * 32, "invalid")
    with pytest.raises(ValueError, match="unknown refusal class"):
        refused_value_hash(cid, "bored")
    # Every download failure reveals one class: which one it was would tell a miner about the
    # verifier's network (whether an internal address answered, and how).
    for kind in ("bad_uri", "refused_address", "dns", "redirect", "http_status", "content_encoding", "too_large",
                 "unreachable"):
        assert fetch_refusal_class(kind) == "unavailable", kind


def test_refused_value_is_pinned():
    # A consensus value: changing the domain, the classes or the bucket splits honest verifiers.
    cid = bytes(range(32))
    assert refused_value_hash(cid, "unavailable") == digest("pot/witness-refused/v1", cid, "unavailable")
    assert REFUSED_BUCKET == -(2**31)
    assert REFUSAL_CLASSES == ("unavailable", "too_large", "malformed", "invalid", "replay_failed")
