"""Fuzzed chain input: `pot1` remark payloads through decode_call, and decoded Substrate blocks
through the remark transport's block reading. Every input decodes or is refused with
CallDecodeError; a block with odd extrinsics, addresses or events still reads."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain.calls import (
    CALL_TYPES,
    PREFIX,
    BondVerifier,
    CallDecodeError,
    CommitWitness,
    DeclareWitnessNormBucket,
    RevealWitnessValue,
    StartTrainingCommitment,
    SubmitCheckpointRoot,
    SubmitOpening,
    UnbondVerifier,
    decode_call,
    encode_call,
)
from commitments import cbor
from tests.fuzz.substrate_rpc import remark_transport

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

b32 = st.binary(min_size=32, max_size=32)
proof = st.lists(b32, max_size=6).map(tuple)
uint = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)

uri = st.from_regex(r"\Ahttp://[a-z]{1,10}/[a-z0-9]{0,20}\Z")

valid_calls = st.one_of(
    st.builds(StartTrainingCommitment, b32, st.binary(min_size=16, max_size=32), b32, b32, b32,
              st.binary(min_size=1, max_size=64), uint, st.from_regex(r"\Ahttps?://[a-z0-9.]{1,20}(:[0-9]{2,5})?\Z")),
    st.builds(SubmitCheckpointRoot, b32, b32, st.integers(1, 2**40), proof),
    st.builds(SubmitOpening, b32, b32, uri, st.binary(min_size=1, max_size=80), proof,
              st.lists(uri, max_size=4).map(tuple)),
    st.builds(CommitWitness, b32, b32),
    st.builds(RevealWitnessValue, b32, b32, b32, st.integers(-(2**31), 2**31 - 1), b32),
    st.builds(DeclareWitnessNormBucket, b32, st.integers(-(2**31), 2**31 - 1)),
    st.builds(BondVerifier, st.integers(1, 2**64 - 1)),
    st.builds(UnbondVerifier, st.integers(1, 2**64 - 1)),
)

# Values canonical CBOR can carry: what a forger can put in a well-formed payload.
cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64) + 1, 2**64 - 1) | text | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


def _decodes_or_refuses(data: bytes) -> Any:
    """decode_call either gives a call that encodes back to these exact bytes, or a CallDecodeError."""
    try:
        call = decode_call(data)
    except CallDecodeError as exc:
        assert str(exc), "a refusal must say why"
        return None
    assert encode_call(call) == data, "a decoded call must be the canonical encoding of its bytes"
    return call


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data):
    _decodes_or_refuses(data)
    _decodes_or_refuses(PREFIX + data)


@FUZZ
@given(
    st.sampled_from(sorted(CALL_TYPES)) | text, st.dictionaries(text, cbor_values, max_size=8) | cbor_values
)
def test_well_formed_cbor_with_any_shape(name, fields):
    _decodes_or_refuses(PREFIX + cbor.encode([name, fields]))


@FUZZ
@given(st.sampled_from(sorted(CALL_TYPES)), st.data())
def test_right_names_wrong_values(name, data):
    fields = {f: data.draw(cbor_values, label=f) for f in CALL_TYPES[name].FIELDS}
    _decodes_or_refuses(PREFIX + cbor.encode([name, fields]))


@FUZZ
@given(valid_calls, st.data())
def test_mutated_valid_calls(call, data):
    raw = bytearray(encode_call(call))
    assert decode_call(bytes(raw)) == call
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]), label="kind")
        i = data.draw(st.integers(0, max(0, len(raw) - 1)), label="at")
        if kind == "flip" and raw:
            raw[i] ^= data.draw(st.integers(1, 255), label="mask")
        elif kind == "cut":
            del raw[i:]
        elif kind == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        elif kind == "delete" and raw:
            del raw[i]
    _decodes_or_refuses(bytes(raw))


def test_oversized_payload_is_refused_before_parsing():
    from chain.calls import MAX_CALL_BYTES

    try:
        decode_call(PREFIX + b"\x5b" + b"\xff" * 8 + b"\0" * MAX_CALL_BYTES)
    except CallDecodeError as exc:
        assert "exceeds the limit" in str(exc)
    else:
        raise AssertionError("an oversized payload decoded")


# --- the Substrate block-reading path -----------------------------------------------------------




ALICE = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
ALICE_PK = bytes.fromhex("d43593c715fdd31c61141abd04a99fd6822c8558854ccde39a5684e7a56da27d")

scale_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**128) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
addresses = st.one_of(st.just(ALICE), st.just("0x" + ALICE_PK.hex()), st.just({"Id": ALICE}),
                      st.just(["Id", ALICE]), text, scale_values)
payloads = st.one_of(
    valid_calls.map(encode_call), st.binary(max_size=60), st.binary(max_size=60).map(lambda b: PREFIX + b)
)


def _remark_call(payload: bytes) -> dict[str, Any]:
    return {
        "module": "System",
        "function": "remark_with_event",
        "args": [],
        "raw": b"",
        "inner": [],
        "remark": payload,
    }


calls = st.recursive(
    payloads.map(_remark_call)
    | st.builds(
        lambda m, f, a: {"module": m, "function": f, "args": a, "raw": b"", "inner": []},
        st.sampled_from(["System", "Timestamp", "Balances", "Utility"]) | text,
        st.sampled_from(["remark", "set", "transfer", "batch_all"]) | text,
        scale_values,
    ),
    lambda inner: st.builds(
        lambda kids, f: {"module": "Utility", "function": f, "args": [], "raw": b"", "inner": kids},
        st.lists(inner, max_size=3),
        st.sampled_from(["batch", "batch_all", "force_batch"]),
    ),
    max_leaves=6,
)
extrinsics = st.one_of(st.none(), st.builds(lambda a, c: {"address": a, "call": c}, addresses, calls),
                       st.dictionaries(text, scale_values, max_size=2))


def _blake(payload: bytes) -> str:
    from chain.substrate.scale import blake2_256

    return "0x" + blake2_256(payload).hex()


@st.composite
def events(draw, exts):
    """System events for the fuzzed extrinsics: real-looking ones (success, Remarked hashes of the
    actual payloads) mixed with failures, foreign events and garbage attributes."""
    out = []
    for idx, ext in enumerate(exts):
        phase = draw(st.sampled_from([{"ApplyExtrinsic": idx}, "ApplyExtrinsic", "Finalization"]))
        if draw(st.booleans()):
            out.append({"phase": phase, "extrinsic_idx": idx, "module_id": "System",
                        "event_id": draw(st.sampled_from(["ExtrinsicSuccess", "ExtrinsicFailed"])),
                        "attributes": draw(scale_values)})
        if isinstance(ext, dict) and isinstance(ext.get("call"), dict):
            from chain.substrate.remark import _walk_remarks

            for payload in _walk_remarks(ext["call"], "fuzz"):
                sender = draw(st.sampled_from([ALICE, "0x" + ALICE_PK.hex()]) | text | scale_values)
                digest = draw(st.just(_blake(payload)) | text | scale_values)
                out.append(
                    {
                        "phase": phase,
                        "extrinsic_idx": idx,
                        "module_id": "System",
                        "event_id": "Remarked",
                        "attributes": draw(st.just({"sender": sender, "hash": digest}) | scale_values),
                    }
                )
    out += draw(st.lists(st.builds(lambda p, i, m, e, a: {"phase": p, "extrinsic_idx": i, "module_id": m,
                                                          "event_id": e, "attributes": a},
                                   st.sampled_from(["ApplyExtrinsic", "Initialization"]) | scale_values,
                                   st.none() | st.integers(0, 5), text, text, scale_values), max_size=3))
    return out


@settings(max_examples=120, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_decoded_blocks_read_without_crashing(data):
    transport, client = remark_transport()
    exts = data.draw(st.lists(extrinsics, max_size=4), label="extrinsics")
    evs = data.draw(events(exts), label="events")
    client.block = (exts, evs)
    block = transport.block(3)
    assert block.number == 3 and isinstance(block.calls, tuple)
    for origin, call in block.calls:
        # Only executed, well-formed pot1 remarks of a usable signer become protocol calls.
        assert isinstance(origin, str) and origin
        assert type(call) in CALL_TYPES.values()


def test_an_executed_remark_becomes_a_call_and_a_foreign_one_does_not():
    transport, client = remark_transport()
    good = encode_call(CommitWitness(b"\1" * 32, b"\2" * 32))
    foreign = b"hello"
    broken = PREFIX + b"\xa0"
    batch = {"module": "Utility", "function": "batch_all", "args": [], "raw": b"",
             "inner": [_remark_call(foreign), _remark_call(good), _remark_call(broken)]}
    events = [
        {
            "phase": {"ApplyExtrinsic": 0},
            "extrinsic_idx": 0,
            "module_id": "System",
            "event_id": "Remarked",
            "attributes": {"sender": ALICE, "hash": _blake(p)},
        }
        for p in (foreign, good, broken)
    ]
    events.append({"phase": {"ApplyExtrinsic": 0}, "extrinsic_idx": 0, "module_id": "System",
                   "event_id": "ExtrinsicSuccess", "attributes": {}})
    client.block = ([{"address": ALICE, "call": batch}], events)
    assert transport.block(1).calls == ((ALICE, CommitWitness(b"\1" * 32, b"\2" * 32)),)
    # A node that sends a Remarked event with a hash that is not text: the event is skipped.
    odd = {"phase": {"ApplyExtrinsic": 0}, "extrinsic_idx": 0, "module_id": "System", "event_id": "Remarked",
           "attributes": {"sender": ALICE, "hash": 5}}
    client.block = ([{"address": ALICE, "call": batch}], [odd, *events])
    assert transport.block(1).calls == ((ALICE, CommitWitness(b"\1" * 32, b"\2" * 32)),)
    # The same extrinsic without its success event carries nothing.
    client.block = ([{"address": ALICE, "call": batch}], events[:-1])
    assert transport.block(1).calls == ()
