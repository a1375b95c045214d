"""Witness commitments bind the pair (value hash, proof hash), the bucket, the salt and the
verifier's identity; the proof half is a keyed digest of the whole replayed post-state."""

from __future__ import annotations

import numpy as np
import pytest

from challenges.witness import (
    PROOF_DOMAIN,
    WitnessError,
    new_salt,
    proof_key,
    state_proof,
    verify_witness,
    witness_commitment,
)
from commitments.hashing import digest
from commitments.tensors import keyed_tensor_digests, state_digest, tensor_digests

C, V, PR = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32


def test_commitment_is_the_documented_digest():
    salt = b"\x05" * 32
    assert witness_commitment(C, V, 3, salt, "v1", proof_hash=PR) == digest(
        "pot/witness/v2", C, V, PR, 3, salt, "v1"
    )


def test_verify_round_trip_and_every_field_binds():
    salt = new_salt()
    com = witness_commitment(C, V, -2, salt, "v1", proof_hash=PR)
    assert verify_witness(com, C, V, -2, salt, "v1", proof_hash=PR)
    assert not verify_witness(com, b"\x09" * 32, V, -2, salt, "v1", proof_hash=PR)
    assert not verify_witness(com, C, b"\x09" * 32, -2, salt, "v1", proof_hash=PR)
    assert not verify_witness(com, C, V, -2, salt, "v1", proof_hash=b"\x09" * 32)  # the proof half binds
    assert not verify_witness(com, C, V, -1, salt, "v1", proof_hash=PR)
    assert not verify_witness(com, C, V, -2, new_salt(), "v1", proof_hash=PR)
    assert not verify_witness(com, C, V, -2, salt, "v2", proof_hash=PR)  # a copied commitment is not yours
    assert not verify_witness(b"short", C, V, -2, salt, "v1", proof_hash=PR)
    assert not verify_witness(
        com, C, V, -2, b"tiny", "v1", proof_hash=PR
    )  # malformed reveal: False, no exception
    assert not verify_witness(com, C, V, -2, salt, "v1", proof_hash=b"tiny")


def test_the_proof_hash_is_required():
    with pytest.raises(TypeError):
        witness_commitment(C, V, 0, b"s" * 16, "v1")  # type: ignore[call-arg]


def test_salts_are_fresh():
    salts = {new_salt() for _ in range(50)}
    assert len(salts) == 50 and all(len(s) == 32 for s in salts)


@pytest.mark.parametrize(
    "args, proof, reason",
    [
        ((b"x", V, 0, b"s" * 16, "v1"), PR, "challenge_id"),
        ((C, b"x", 0, b"s" * 16, "v1"), PR, "value_hash"),
        ((C, V, 0, b"s" * 16, "v1"), b"x" * 31, "proof_hash"),
        ((C, V, True, b"s" * 16, "v1"), PR, "norm_bucket"),
        ((C, V, 0, b"s" * 15, "v1"), PR, "salt"),
        ((C, V, 0, b"s" * 16, ""), PR, "verifier_id"),
    ],
)
def test_bad_inputs_refused(args, proof, reason):
    with pytest.raises(WitnessError, match=reason):
        witness_commitment(*args, proof_hash=proof)


# --- the state proof ----------------------------------------------------------------------------


def _state(seed: int = 0) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        ("param/w", rng.standard_normal((4, 3)).astype(np.float32)),
        ("opt/exp_avg/w", rng.standard_normal((4, 3)).astype(np.float32)),
        ("opt/exp_avg_sq/w", np.abs(rng.standard_normal((4, 3))).astype(np.float32)),
        ("step", np.array(7, dtype=np.int64)),
    ]


def test_state_proof_is_the_documented_digest():
    items = _state()
    key = proof_key(C)
    assert key == digest("pot/witness-key/v2", C) and len(key) == 32
    expected = digest(PROOF_DOMAIN, C, [[n, d] for n, d in keyed_tensor_digests(items, key)])
    assert state_proof(C, items) == expected and len(expected) == 32


def test_state_proof_is_not_derivable_from_the_state_digest():
    items = _state()
    proof = state_proof(C, items)
    public = tensor_digests(items)
    # Nothing a miner publishes (the per-tensor digests, the state digest in the leaf) is the proof,
    # nor the proof formula over those digests instead of the keyed ones.
    assert proof != state_digest(items)
    assert proof != digest(PROOF_DOMAIN, C, [[n, d] for n, d in public])
    assert {d for _, d in keyed_tensor_digests(items, proof_key(C))}.isdisjoint({d for _, d in public})


def test_state_proof_changes_with_any_byte_and_with_the_challenge():
    items = _state()
    proof = state_proof(C, items)
    assert state_proof(C, _state()) == proof  # deterministic
    assert state_proof(b"\x07" * 32, items) != proof  # per challenge: one replay proves one challenge
    seen = {proof}
    for i, (name, t) in enumerate(items):
        raw = bytearray(t.tobytes())
        for pos in range(len(raw)):  # every byte of every tensor (152 bytes in all)
            flipped = bytearray(raw)
            flipped[pos] ^= 0x01
            changed = list(items)
            changed[i] = (name, np.frombuffer(bytes(flipped), dtype=t.dtype).reshape(t.shape))
            p = state_proof(C, changed)
            assert p not in seen, (name, pos)
            seen.add(p)
    # The names and the order enter it too.
    renamed = [("param/v" if n == "param/w" else n, t) for n, t in items]
    assert state_proof(C, renamed) != proof


def test_state_proof_refuses_a_bad_challenge_id():
    with pytest.raises(WitnessError, match="challenge_id"):
        state_proof(b"short", _state())
