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
    assert fetch_refusal_class("too_large") == "too_large"
    assert fetch_refusal_class("unreachable") == fetch_refusal_class("http_status") == "unavailable"


def test_refused_value_is_pinned():
    # A consensus value: changing the domain, the classes or the bucket splits honest verifiers.
    cid = bytes(range(32))
    assert refused_value_hash(cid, "unavailable") == digest("pot/witness-refused/v1", cid, "unavailable")
    assert REFUSED_BUCKET == -(2**31)
    assert REFUSAL_CLASSES == ("unavailable", "too_large", "malformed", "invalid", "replay_failed")
