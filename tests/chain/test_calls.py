"""The pot1 call codec: round trips, and refusal of every kind of malformed payload."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chain.calls import (
    MAX_CALL_BYTES,
    MAX_MIRRORS,
    PREFIX,
    BondVerifier,
    CallDecodeError,
    CallError,
    CommitWitness,
    DeclareWitnessNormBucket,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    UnbondVerifier,
    decode_call,
    derive_run_id,
    encode_call,
)
from commitments import cbor

H = bytes(range(32))
N = bytes(range(16))  # a registration nonce


def examples():
    return [
        StartTrainingCommitment(H, N, H, H, H, b"\xa0", 100, "http://miner:8000"),
        SubmitCheckpointRoot(H, H, 17, [H, bytes(32)]),
        SubmitOpening(H, H, "http://miner/o/1", b"leafbytes", (H,)),
        SubmitOpening(H, H, "http://miner/o/1", b"leafbytes", (H,), ("http://mirror/o/1", "ipfs://x")),
        CommitWitness(H, bytes(32)),
        RevealWitnessValue(H, H, bytes(32), -3, bytes(16)),
        DeclareWitnessNormBucket(H, 12),
        BondVerifier(100),
        UnbondVerifier(1),
    ]


@pytest.mark.parametrize(
    "call", examples(), ids=lambda c: c.NAME + ("+mirrors" if getattr(c, "mirrors", ()) else "")
)
def test_round_trip(call):
    data = encode_call(call)
    assert data.startswith(PREFIX)
    assert decode_call(data) == call
    name, fields = cbor.decode(data[4:])
    assert name == call.NAME and set(fields) == set(type(call).FIELDS)


def test_lists_and_tuples_are_the_same_call():
    assert SubmitCheckpointRoot(H, H, 2, [H]) == SubmitCheckpointRoot(H, H, 2, (H,))


@given(
    st.binary(min_size=32, max_size=32),
    st.integers(0, 2**64 - 1),
    st.lists(st.binary(min_size=32, max_size=32), max_size=64),
)
def test_round_trip_property(h, size, proof):
    call = SubmitCheckpointRoot(h, h, size, proof)
    assert decode_call(encode_call(call)) == call


def _payload(name, fields):
    return PREFIX + cbor.encode([name, fields])


GOOD = examples()[4].to_wire()


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "does not start"),
        (b"hello world", "does not start"),
        (b"pot2" + cbor.encode(["commit_witness", GOOD]), "does not start"),
        (PREFIX + b"\xff\xff", "not canonical CBOR"),
        (PREFIX + b"\x18\x05", "not canonical CBOR"),  # long-form int
        (PREFIX + cbor.encode(["commit_witness", GOOD]) + b"\x00", "not canonical CBOR"),
        (PREFIX + cbor.encode({"a": 1}), "must be [call_name"),
        (PREFIX + cbor.encode(["commit_witness"]), "must be [call_name"),
        (_payload("transfer", GOOD), "unknown call 'transfer'"),
        (_payload("commit_witness", {"challenge_id": H}), "missing field(s) commitment"),
        (_payload("commit_witness", {**GOOD, "x": 1}), "unknown field(s) x"),
        (_payload("commit_witness", {**GOOD, "commitment": b"short"}), "commitment must be 32 bytes"),
        (_payload("commit_witness", {**GOOD, "commitment": "text"}), "commitment must be 32 bytes"),
        (
            _payload("declare_witness_norm_bucket", {"challenge_id": H, "bucket": True}),
            "bucket must be an integer",
        ),
        (
            _payload("declare_witness_norm_bucket", {"challenge_id": H, "bucket": 2**40}),
            "32-bit signed",
        ),
        (
            _payload("submit_checkpoint_root", {"run_id": H, "root": H, "size": -1, "consistency_proof": []}),
            "size must be in 0..2^64-1",
        ),
        (
            _payload("submit_checkpoint_root", {"run_id": H, "root": H, "size": 1, "consistency_proof": H}),
            "consistency_proof must be a list",
        ),
        (
            _payload(
                "submit_checkpoint_root", {"run_id": H, "root": H, "size": 1, "consistency_proof": [H] * 65}
            ),
            "at most 64",
        ),
        (
            _payload(
                "reveal_witness_value",
                {"challenge_id": H, "value_hash": H, "proof_hash": H, "norm_bucket": 0, "salt": b"x"},
            ),
            "salt must be 16..64 bytes",
        ),
        (
            _payload(
                "reveal_witness_value",
                {"challenge_id": H, "value_hash": H, "norm_bucket": 0, "salt": bytes(16)},
            ),
            "missing field(s) proof_hash",
        ),
        (
            _payload(
                "submit_opening",
                {"challenge_id": H, "opening_digest": H, "uri": "u", "leaf": b"l", "leaf_proof": []},
            ),
            "missing field(s) mirrors",
        ),
        (
            _payload(
                "submit_opening",
                {
                    "challenge_id": H,
                    "opening_digest": H,
                    "uri": "u",
                    "leaf": b"l",
                    "leaf_proof": [],
                    "mirrors": ["m"] * (MAX_MIRRORS + 1),
                },
            ),
            f"at most {MAX_MIRRORS}",
        ),
        (
            _payload(
                "submit_opening",
                {
                    "challenge_id": H,
                    "opening_digest": H,
                    "uri": "u",
                    "leaf": b"l",
                    "leaf_proof": [],
                    "mirrors": "m",
                },
            ),
            "mirrors must be a list of text",
        ),
        (_payload("bond_verifier", {"amount": 0}), "amount must be at least 1"),
        (_payload("unbond_verifier", {"amount": -1}), "amount must be in 0..2^64-1"),
        (_payload("bond_verifier", {}), "missing field(s) amount"),
        (
            _payload("start_training_commitment", {**examples()[0].to_wire(), "nonce": bytes(15)}),
            "nonce must be 16..32 bytes",
        ),
        (PREFIX + b"\x00" * (MAX_CALL_BYTES + 1), "exceeds the limit"),
        (PREFIX + cbor.encode([1, GOOD]), "must be [call_name"),
        (PREFIX + cbor.encode(["commit_witness", {1: H}]), "field names must be text"),
    ],
)
def test_refusals_name_the_problem(data, reason):
    with pytest.raises(CallDecodeError) as err:
        decode_call(data)
    assert reason in str(err.value)


def test_non_bytes_refused():
    with pytest.raises(CallDecodeError, match="must be bytes"):
        decode_call("pot1...")  # type: ignore[arg-type]


def test_construction_validates():
    with pytest.raises(CallError, match="run_id must be 32 bytes"):
        StartTrainingCommitment(b"x", N, H, H, H, b"\xa0", 1, "")
    with pytest.raises(CallError, match="endpoint is longer"):
        StartTrainingCommitment(H, N, H, H, H, b"\xa0", 1, "x" * 3000)
    with pytest.raises(CallError, match="spec must be 1..65536"):
        StartTrainingCommitment(H, N, H, H, H, b"", 1, "")
    with pytest.raises(CallError, match="nonce must be 16..32 bytes"):
        StartTrainingCommitment(H, bytes(33), H, H, H, b"\xa0", 1, "")
    with pytest.raises(CallError, match="amount must be at least 1"):
        BondVerifier(0)


def test_opening_mirrors_default_to_none_and_go_on_the_wire():
    call = SubmitOpening(H, H, "http://miner/o/1", b"leafbytes", (H,))
    assert call.mirrors == ()
    assert call.to_wire()["mirrors"] == []  # on the wire the field is always present
    assert SubmitOpening(H, H, "u", b"l", (), ["a", "b"]).mirrors == ("a", "b")


def test_run_id_is_bound_to_its_sender_and_nonce():
    rid = derive_run_id("alice", N)
    assert len(rid) == 32 and rid == derive_run_id("alice", N)
    assert rid != derive_run_id("bob", N)
    assert rid != derive_run_id("alice", bytes(range(1, 17)))
    with pytest.raises(CallError, match="nonce must be 16..32 bytes"):
        derive_run_id("alice", b"short")
    with pytest.raises(CallError, match="origin must be a non-empty account id"):
        derive_run_id("", N)


def test_encode_refuses_non_calls():
    with pytest.raises(CallError, match="not a protocol call"):
        encode_call({"name": "commit_witness"})  # type: ignore[arg-type]


@given(st.binary(max_size=200))
def test_random_bytes_never_crash(data):
    try:
        decode_call(PREFIX + data)
    except CallDecodeError:
        pass
