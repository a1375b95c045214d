"""Deterministic CBOR (RFC 8949 §4.2.1) and the BLAKE3 domain-separated digests built on it."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commitments import cbor
from commitments.errors import CBORLimitExceeded, CommitmentError, MalformedCBOR, NonCanonicalCBOR
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


@given(
    st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63), min_size=2, max_size=8), st.randoms()
)
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


# --- the strict decoder: every rule, every limit, linear work -------------------------------------


@pytest.mark.parametrize(
    ("hexed", "kind", "rule"),
    [
        ("c11a514b67b0", MalformedCBOR, "tag"),
        ("c249010000000000000000", MalformedCBOR, "tag"),  # bignum
        ("d81c80", MalformedCBOR, "tag"),  # shareable
        ("d81d00", MalformedCBOR, "tag"),  # shared reference
        ("e0", MalformedCBOR, "simple-value"),
        ("f3", MalformedCBOR, "simple-value"),
        ("f7", MalformedCBOR, "simple-value"),  # undefined
        ("f820", MalformedCBOR, "simple-value"),
        ("fc", MalformedCBOR, "reserved"),
        ("1c", MalformedCBOR, "reserved"),
        ("5d", MalformedCBOR, "reserved"),
        ("1f", MalformedCBOR, "reserved"),
        ("ff", MalformedCBOR, "break"),
        ("8101ff", NonCanonicalCBOR, "trailing-bytes"),  # [1], then a stray break
        ("9f01ff", NonCanonicalCBOR, "indefinite-length"),
        ("7f6161ff", NonCanonicalCBOR, "indefinite-length"),
        ("bf0000ff", NonCanonicalCBOR, "indefinite-length"),
        ("1817", NonCanonicalCBOR, "head-form"),
        ("1900ff", NonCanonicalCBOR, "head-form"),
        ("1a0000ffff", NonCanonicalCBOR, "head-form"),
        ("1b00000000ffffffff", NonCanonicalCBOR, "head-form"),
        ("3817", NonCanonicalCBOR, "head-form"),
        ("980100", NonCanonicalCBOR, "head-form"),
        ("b8010000", NonCanonicalCBOR, "head-form"),
        ("f97e01", NonCanonicalCBOR, "float-form"),  # a NaN with a payload
        ("f9fe00", NonCanonicalCBOR, "float-form"),  # a negative NaN
        ("fa7fc00000", NonCanonicalCBOR, "float-form"),
        ("fb3ff8000000000000", NonCanonicalCBOR, "float-form"),  # 1.5 fits a half
        ("62c328", MalformedCBOR, "utf8"),
        ("63eda080", MalformedCBOR, "utf8"),  # a lone surrogate
        ("62c080", MalformedCBOR, "utf8"),  # an overlong form
        ("a18000", MalformedCBOR, "container-key"),
        ("a1a00000", MalformedCBOR, "container-key"),
        ("a200000000", NonCanonicalCBOR, "duplicate-key"),
        ("a20100f93c0000", NonCanonicalCBOR, "duplicate-key"),  # 1 and 1.0 are one Python key
        ("a20100f500", NonCanonicalCBOR, "duplicate-key"),  # 1 and true likewise
        ("a201000000", NonCanonicalCBOR, "key-order"),
        ("a2616200616100", NonCanonicalCBOR, "key-order"),
        ("a262616100616200", NonCanonicalCBOR, "key-order"),  # "aa" before "b": length-first order
        ("0000", NonCanonicalCBOR, "trailing-bytes"),
    ],
)
def test_every_rule_refuses_with_its_code_rule_and_offset(hexed, kind, rule):
    with pytest.raises(CommitmentError) as info:
        cbor.decode(bytes.fromhex(hexed))
    exc = info.value
    assert type(exc) is kind, (type(exc), str(exc))
    assert exc.rule == rule and exc.code == kind.__name__
    assert isinstance(exc.offset, int) and f"offset {exc.offset}" in str(exc)


def test_a_longer_key_sorts_after_by_its_length_byte():
    assert cbor.decode(bytes.fromhex("a2616100626161" + "00")) == {"a": 0, "aa": 0}


@given(_values)
def test_every_proper_prefix_is_refused_as_truncated(value):
    data = cbor.encode(value)
    for cut in range(len(data)):
        with pytest.raises(MalformedCBOR) as info:
            cbor.decode(data[:cut])
        assert info.value.rule in ("truncated", "empty")


def test_limits_are_keyword_arguments_with_typed_refusals():
    doc = cbor.encode({"a": [1, 2, 3], "b": b"xyz" * 10})
    assert cbor.decode(doc, max_items=8, max_depth=2, max_string=30) == cbor.decode(doc)
    for kw, rule in (({"max_bytes": len(doc) - 1}, "too-large"), ({"max_items": 7}, "too-many-items"),
                     ({"max_depth": 1}, "too-deep"), ({"max_string": 29}, "string-too-long")):
        with pytest.raises(CBORLimitExceeded) as info:
            cbor.decode(doc, **kw)
        assert info.value.rule == rule and info.value.code == "CBORLimitExceeded"
    assert isinstance(info.value, MalformedCBOR)  # a limit is a refusal of the input, like the rest
    with pytest.raises(ValueError, match="max_items"):
        cbor.decode(doc, max_items=-1)


def test_claimed_counts_are_checked_against_the_bytes_that_remain():
    # An array promising more items than bytes remain is refused at its head, before any item.
    for data in (b"\x9a\x00\x01\x00\x00" + b"\x00" * 100, b"\x82\x9a\x00\x01\x00\x00" + b"\x00" * 100,
                 b"\xba\x00\x01\x00\x00" + b"\x00" * 100):
        dec = cbor.Decoder()
        with pytest.raises(MalformedCBOR, match="past the end"):
            dec.decode(data)
        assert dec.steps <= 2
    # A string claiming a length past max_string is refused on its head even when the bytes exist.
    dec = cbor.Decoder(max_string=10)
    with pytest.raises(CBORLimitExceeded):
        dec.decode(cbor.encode(b"x" * 1000))
    assert dec.steps == 1


def test_refusals_never_quote_the_input():
    secret = "s3cr3t-value-from-the-wire"
    for data in (
        b"\xa2" + cbor.encode(secret) + b"\x01" + cbor.encode("a") + b"\x02",
        cbor.encode([secret]) + b"\x00",
        cbor.encode(secret)[:-1],
        b"\xc2" + cbor.encode(secret.encode()),
    ):
        with pytest.raises(CommitmentError) as info:
            cbor.decode(data)
        assert secret not in str(info.value) and "s3cr3t" not in str(info.value)


def _worst_cases(n: int) -> list[bytes]:
    """Valid documents of about n bytes that stress each kind of work the decoder does."""
    return [
        cbor.encode([0] * n),  # many tiny items
        cbor.encode([[]] * n),  # many containers
        cbor.encode({i: None for i in range(n // 10)}),  # many keys to compare
        cbor.encode({("k" * 40) + str(i): i for i in range(n // 60)}),  # long keys sharing a prefix
        cbor.encode(b"x" * n),  # one long string
        cbor.encode(["\u00fc" * 8] * (n // 18)),  # UTF-8 text
        cbor.encode([[[[[[[[0]]]]]]]] * (n // 9)),  # nesting
        cbor.encode([1.1] * (n // 9)),  # floats checked for their shortest form
    ]


@pytest.mark.parametrize("n", [1_000, 10_000, 100_000])
def test_work_is_linear_in_the_input_for_valid_worst_cases(n):
    for data in _worst_cases(n):
        # Work, not memory: most of these cost more than the default budget (tests/commitments/
        # test_cbor_memory.py), so the decoder is given room to finish them.
        dec = cbor.Decoder(max_memory=1 << 30)
        dec.decode(data)
        assert dec.steps <= 2 * len(data)


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    b = bytearray(data)
    for kind, at, byte in edits:
        if not b:
            break
        i = at % len(b)
        if kind == 0:
            b[i] = byte
        elif kind == 1:
            b.insert(i, byte)
        else:
            del b[i]
    return bytes(b)


def _decodes_or_refuses(data: bytes) -> None:
    dec = cbor.Decoder()
    try:
        obj = dec.decode(data)
    except (MalformedCBOR, NonCanonicalCBOR) as exc:
        assert exc.code in ("MalformedCBOR", "NonCanonicalCBOR", "CBORLimitExceeded") and exc.rule
        assert len(str(exc)) < 200
    else:
        # Whatever is accepted is exactly the canonical encoding of what it decoded to.
        assert cbor.encode(obj) == data
    assert dec.steps <= 2 * len(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=16 * 1024))
def test_random_bytes_decode_or_refuse_with_linear_work(data):
    _decodes_or_refuses(data)


_HEADS = st.sampled_from([0x18, 0x19, 0x1a, 0x1b, 0x5b, 0x7b, 0x9b, 0xbb, 0x9f, 0xbf, 0xd8, 0xf9, 0xfb, 0xff])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_values, st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2**16), st.integers(0, 255) | _HEADS),
                         min_size=1, max_size=4))
def test_near_valid_documents_decode_or_refuse_with_linear_work(value, edits):
    _decodes_or_refuses(_mutate(cbor.encode(value), edits))


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(min_size=1, max_size=8), st.integers(1, 20_000), st.binary(max_size=64))
def test_repeated_prefixes_decode_or_refuse_with_linear_work(unit, times, tail):
    # Nesting openers, long runs of heads and value-sharing tags, repeated far past any limit.
    _decodes_or_refuses(unit * times + tail)
