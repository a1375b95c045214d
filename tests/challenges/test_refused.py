"""The refused-opening witness: one consensus value per challenge that every honest verifier
computes alike, whatever made the opening unusable."""

from __future__ import annotations

import pytest

from challenges.refused import (
    REFUSAL_CLASSES,
    REFUSED_BUCKET,
    fetch_refusal_class,
    refused_pair,
    refused_value_hash,
)
from challenges.witness import state_proof
from commitments.hashing import digest
from commitments.leaves import step_leaf, witness_value_hash


def test_every_refusal_class_reveals_the_one_value():
    # Protocol v2: a miner serving each verifier a different bad opening cannot split the honest
    # reveals across classes; they all reveal the same value.
    cid = b"\x01" * 32
    values = {refused_value_hash(cid, c) for c in REFUSAL_CLASSES}
    assert values == {refused_value_hash(cid)}
    assert refused_value_hash(cid) != refused_value_hash(b"\x02" * 32)  # per challenge
    with pytest.raises(ValueError, match="unknown refusal class 'bored'"):
        refused_value_hash(cid, "bored")  # the class, when given, is still checked
    # Every download failure is one class: which one it was would tell a miner about the
    # verifier's network (whether an internal address answered, and how).
    for kind in (
        "bad_uri",
        "refused_address",
        "dns",
        "redirect",
        "http_status",
        "content_encoding",
        "too_large",
        "unreachable",
    ):
        assert fetch_refusal_class(kind) == "unavailable", kind


def test_the_refused_pair_is_the_value_twice():
    cid = bytes(range(32))
    v, p = refused_pair(cid)
    assert v == p == refused_value_hash(cid)
    assert refused_pair(b"\x07" * 32) != (v, p)


def test_the_refused_value_is_never_a_leaf_value_or_a_state_proof():
    cid = bytes(range(32))
    v = refused_value_hash(cid)
    leaf = step_leaf(3, digest("pot/test/state/v1", 3), 0x40000003)
    assert v != witness_value_hash(leaf)  # another domain than H(leaf t)
    assert v != state_proof(cid, [])


def test_refused_value_is_pinned():
    # A consensus value: changing the domain or the bucket splits honest verifiers.
    cid = bytes(range(32))
    assert refused_value_hash(cid) == digest("pot/witness-refused/v2", cid)
    assert refused_value_hash(cid, "unavailable") == digest("pot/witness-refused/v2", cid)
    assert REFUSED_BUCKET == -(2**31)
    assert REFUSAL_CLASSES == ("unavailable", "too_large", "malformed", "invalid", "replay_failed")
