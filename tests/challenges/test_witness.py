"""Witness commitments bind value, bucket, salt and verifier identity."""

from __future__ import annotations

import pytest

from challenges.witness import WitnessError, new_salt, verify_witness, witness_commitment
from commitments.hashing import digest

C, V = b"\x01" * 32, b"\x02" * 32


def test_commitment_is_the_documented_digest():
    salt = b"\x05" * 32
    assert witness_commitment(C, V, 3, salt, "v1") == digest("pot/witness/v1", C, V, 3, salt, "v1")


def test_verify_round_trip_and_every_field_binds():
    salt = new_salt()
    com = witness_commitment(C, V, -2, salt, "v1")
    assert verify_witness(com, C, V, -2, salt, "v1")
    assert not verify_witness(com, b"\x09" * 32, V, -2, salt, "v1")
    assert not verify_witness(com, C, b"\x09" * 32, -2, salt, "v1")
    assert not verify_witness(com, C, V, -1, salt, "v1")
    assert not verify_witness(com, C, V, -2, new_salt(), "v1")
    assert not verify_witness(com, C, V, -2, salt, "v2")  # a copied commitment is not yours
    assert not verify_witness(b"short", C, V, -2, salt, "v1")
    assert not verify_witness(com, C, V, -2, b"tiny", "v1")  # malformed reveal: False, no exception


def test_salts_are_fresh():
    salts = {new_salt() for _ in range(50)}
    assert len(salts) == 50 and all(len(s) == 32 for s in salts)


@pytest.mark.parametrize(
    "args, reason",
    [
        ((b"x", V, 0, b"s" * 16, "v1"), "challenge_id"),
        ((C, V, True, b"s" * 16, "v1"), "norm_bucket"),
        ((C, V, 0, b"s" * 15, "v1"), "salt"),
        ((C, V, 0, b"s" * 16, ""), "verifier_id"),
    ],
)
def test_bad_inputs_refused(args, reason):
    with pytest.raises(WitnessError, match=reason):
        witness_commitment(*args)
