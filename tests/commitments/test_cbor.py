"""Deterministic CBOR (RFC 8949 §4.2.1) and the BLAKE3 domain-separated digests built on it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commitments import cbor
from commitments.errors import CommitmentError, MalformedCBOR, NonCanonicalCBOR
from commitments.hashing import DIGEST_SIZE, blake3, digest, h, structure_bytes

# RFC 8949 Appendix A examples whose encodings are also the deterministic ones.
RFC_VECTORS = [
    (0, "00"), (1, "01"), (10, "0a"), (23, "17"), (24, "1818"), (25, "1819"), (100, "1864"),
    (1000, "1903e8"), (1000000, "1a000f4240"), (1000000000000, "1b000000e8d4a51000"),
    (18446744073709551615, "1bffffffffffffffff"), (-18446744073709551616, "3bffffffffffffffff"),
    (-1, "20"), (-10, "29"), (-100, "3863"), (-1000, "3903e7"),
    (0.0, "f90000"), (-0.0, "f98000"), (1.0, "f93c00"), (1.1, "fb3ff199999999999a"), (1.5, "f93e00"),
    (65504.0, "f97bff"), (100000.0, "fa47c35000"), (3.4028234663852886e38, "fa7f7fffff"),
    (1.0e300, "fb7e37e43c8800759c"), (5.960464477539063e-8, "f90001"), (0.00006103515625, "f90400"),
    (-4.0, "f9c400"), (-4.1, "fbc010666666666666"), (math.inf, "f97c00"), (-math.inf, "f9fc00"),
    (False, "f4"), (True, "f5"), (None, "f6"),
    (b"", "40"), (b"\x01\x02\x03\x04", "4401020304"),
    ("", "60"), ("a", "6161"), ("IETF", "6449455446"), ('"\\', "62225c"), ("\u00fc", "62c3bc"),
    ("\u6c34", "63e6b0b4"),
    ([], "80"), ([1, 2, 3], "83010203"), ([1, [2, 3], [4, 5]], "8301820203820405"),
    (list(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
    ({}, "a0"), ({1: 2, 3: 4}, "a201020304"), ({"a": 1, "b": [2, 3]}, "a26161016162820203"),
    (["a", {"b": "c"}], "826161a161626163"),
    ({"a": "A", "b": "B", "c": "C", "d": "D", "e": "E"}, "a56161614161626142616361436164614461656145"),
]


@pytest.mark.parametrize(("value", "hexed"), RFC_VECTORS, ids=[v[1][:16] for v in RFC_VECTORS])
def test_rfc_8949_vectors_encode_and_decode(value, hexed):
    assert cbor.encode(value).hex() == hexed
    back = cbor.decode(bytes.fromhex(hexed))
    assert back == value
    if isinstance(value, float):
        assert math.copysign(1.0, back) == math.copysign(1.0, value)


def test_nan_has_one_encoding():
    assert cbor.encode(math.nan).hex() == "f97e00"
    assert math.isnan(cbor.decode(bytes.fromhex("f97e00")))


def test_map_keys_sort_by_their_encoded_bytes_not_insertion_or_length():
    # 1000 encodes as 0x19..., "a" as 0x61...: bytewise order puts the integer first (RFC 8949
    # §4.2.1), where the old length-first rule of RFC 7049 would put "a" first.
    assert cbor.encode({"a": 0, 1000: 0}).hex() == "a21903e8006161" + "00"
    assert cbor.encode({"aa": 1, "b": 2}) == cbor.encode({"b": 2, "aa": 1})
    assert cbor.encode({"aa": 1, "b": 2}).hex() == "a2616202626161" + "01"
    assert cbor.encode({-1: 0, 10: 0}).hex() == "a20a002000"


def test_tuples_encode_as_lists_and_byte_likes_as_bytes():
    assert cbor.encode((1, 2)) == cbor.encode([1, 2])
    assert cbor.encode(bytearray(b"ab")) == cbor.encode(memoryview(b"ab")) == cbor.encode(b"ab")


_scalars = (
    st.none() | st.booleans() | st.integers(-(2**64), 2**64 - 1)
    | st.floats(allow_nan=False) | st.binary(max_size=40) | st.text(max_size=20)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=6) | st.integers(-1000, 1000), inner, max_size=5),
    max_leaves=30,
)


@given(_values)
def test_round_trip_and_canonical_fixed_point(value):
    data = cbor.encode(value)
    back = cbor.decode(data)
    assert cbor.encode(back) == data
    assert back == value


@given(st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63), min_size=2, max_size=8), st.randoms())
def test_insertion_order_never_changes_the_bytes(d, rnd):
    items = list(d.items())
    rnd.shuffle(items)
    assert cbor.encode(dict(items)) == cbor.encode(d)


@pytest.mark.parametrize(
    ("hexed", "why"),
    [
        ("1817", "23 in the one-byte-argument form"),
        ("190017", "23 in the two-byte form"),
        ("f93c01" + "", None),  # a valid half float, canonical: control case
        ("fa3f800000", "1.0 as a single where a half suffices"),
        ("fb3ff0000000000000", "1.0 as a double"),
        ("fb7ff8000000000000", "NaN as a double"),
        ("9f01ff", "indefinite-length array"),
        ("5f4101ff", "indefinite-length byte string"),
        ("a2616201616102", "unsorted map keys"),
        ("a2616101616102", "duplicate map keys"),
        ("0000", "trailing bytes"),
        ("5800", "empty byte string with a one-byte length"),
    ],
)
def test_non_canonical_encodings_are_refused(hexed, why):
    data = bytes.fromhex(hexed)
    if why is None:
        assert cbor.encode(cbor.decode(data)) == data
        return
    with pytest.raises(NonCanonicalCBOR):
        cbor.decode(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (bytes.fromhex("1a0000"), "not valid CBOR"),
        (bytes.fromhex("62c3"), "not valid CBOR"),
        (bytes.fromhex("f7"), "not allowed"),
        (bytes.fromhex("c11a514b67b0"), "not allowed"),
        (bytes.fromhex("ff"), "not valid CBOR"),
    ],
)
def test_malformed_input_is_refused_with_a_reason(data, reason):
    with pytest.raises(MalformedCBOR, match=reason):
        cbor.decode(data)


def test_decode_refuses_non_bytes_and_oversized_input():
    with pytest.raises(MalformedCBOR, match="expected bytes"):
        cbor.decode("00")
    with pytest.raises(MalformedCBOR, match="exceeds the limit"):
        cbor.decode(cbor.encode(b"x" * 100), max_bytes=50)


def test_decode_refuses_deep_nesting_without_a_recursion_traceback():
    deep = b"\x81" * 10_000 + b"\x00"
    with pytest.raises(CommitmentError):
        cbor.decode(deep)


def test_encode_refuses_what_the_protocol_does_not_use():
    with pytest.raises(MalformedCBOR, match="64 bits"):
        cbor.encode(2**64)
    with pytest.raises(MalformedCBOR, match="64 bits"):
        cbor.encode(-(2**64) - 1)
    with pytest.raises(MalformedCBOR, match="set"):
        cbor.encode({1, 2})
    with pytest.raises(MalformedCBOR, match="nested deeper"):
        nested: list = []
        for _ in range(100):
            nested = [nested]
        cbor.encode(nested)


# --- hashing ----------------------------------------------------------------------------------


def test_blake3_known_answers():
    assert h(b"").hex() == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert h(b"abc").hex() == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    assert DIGEST_SIZE == 32


def test_blake3_constructor_is_hashlib_style():
    hasher = blake3(b"ab")
    hasher.update(b"c")
    assert hasher.digest() == h(b"abc") and hasher.digest_size == 32
    assert blake3().digest() == h(b"")


def test_digest_is_blake3_of_the_cbor_array():
    assert structure_bytes("pot/x/v1", 1, b"\x02") == cbor.encode(["pot/x/v1", 1, b"\x02"])
    assert digest("pot/x/v1", 1, b"\x02") == h(cbor.encode(["pot/x/v1", 1, b"\x02"]))


@given(st.lists(_scalars, max_size=4))
def test_domains_separate_and_fields_do_not_run_together(fields):
    assert digest("pot/a/v1", *fields) != digest("pot/b/v1", *fields)
    # Fields are CBOR items, not concatenated bytes: ("ab", "") and ("a", "b") differ.
    assert digest("pot/a/v1", "ab", "") != digest("pot/a/v1", "a", "b")


def test_domains_must_be_pot_strings():
    for bad in ("step/v1", "", b"pot/x", None):
        with pytest.raises(ValueError, match="domain"):
            structure_bytes(bad, 1)
