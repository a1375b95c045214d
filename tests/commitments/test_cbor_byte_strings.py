"""cbor.decode_byte_strings and ByteStrings: the compact reading of an array of byte strings that
leaf lists use. It accepts exactly what cbor.decode accepts as a list of bytes, with the same
values, and refuses any other item at its first byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitments import cbor
from commitments.errors import CBORLimitExceeded, CommitmentError, MalformedCBOR, NonCanonicalCBOR

_lists = st.lists(st.binary(max_size=300), max_size=70)


@settings(max_examples=150, deadline=None)
@given(_lists)
def test_it_reads_what_decode_reads(items):
    data = cbor.encode(items)
    got = cbor.decode_byte_strings(data)
    assert len(got) == len(items) and list(got) == items and got == items == cbor.decode(data)
    assert [got[i] for i in range(len(items))] == items
    assert [got[-i] for i in range(1, len(items) + 1)] == [items[-i] for i in range(1, len(items) + 1)]
    for lo, hi in ((0, len(items)), (3, 40), (17, 18), (33, 5)):
        view = got[lo:hi]
        assert list(view) == items[lo:hi] and len(view) == len(items[lo:hi])
        assert [view[i] for i in range(len(view))] == items[lo:hi]
    assert got[::3] == items[::3]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=60))
def test_it_accepts_and_refuses_exactly_like_decode_on_any_bytes(data):
    try:
        want = cbor.decode(data)
    except CommitmentError as exc:
        want, rule = None, exc.rule
    ok = isinstance(want, list) and all(isinstance(x, bytes) for x in want)
    try:
        got = cbor.decode_byte_strings(data)
    except CommitmentError as exc:
        assert not ok
        if want is None and exc.rule != "item-type":
            # The same rule where both read the same bytes; an item of another type may be refused
            # before a later fault that decode meets first.
            assert exc.rule in (rule, "tag", "item-type", "break", "reserved") or rule in ("truncated",)
        return
    assert ok and got == want


def test_any_other_item_is_refused_at_its_first_byte():
    for item, rule in ((b"\x80", "item-type"), (b"\xa0", "item-type"), (b"\x00", "item-type"),
                       (b"\x60", "item-type"), (b"\xf6", "item-type"), (b"\xc2\x40", "tag"),
                       (b"\xff", "break"), (b"\x1c", "reserved")):
        data = b"\x83\x41a" + item + b"\x00" * 50
        with pytest.raises(MalformedCBOR) as info:
            cbor.decode_byte_strings(data)
        assert info.value.rule == rule and info.value.offset == 3
    with pytest.raises(MalformedCBOR, match="where an array of byte strings is due") as info:
        cbor.decode_byte_strings(cbor.encode({"a": b"x"}))
    assert info.value.rule == "item-type" and info.value.offset == 0


def test_the_canonical_rules_and_limits_are_decodes():
    cases = {
        b"\x98\x01\x40": (NonCanonicalCBOR, "head-form"),  # an array count not in its shortest form
        b"\x81\x58\x01x": (NonCanonicalCBOR, "head-form"),  # a length not in its shortest form
        b"\x9f\x40\xff": (NonCanonicalCBOR, "indefinite-length"),
        b"\x81\x5f\x40\xff": (NonCanonicalCBOR, "indefinite-length"),
        b"\x81\x43ab": (MalformedCBOR, "truncated"),
        b"\x83\x40": (MalformedCBOR, "truncated"),
        b"\x81\x40\x00": (NonCanonicalCBOR, "trailing-bytes"),
        b"": (MalformedCBOR, "empty"),
    }
    for data, (kind, rule) in cases.items():
        with pytest.raises(kind) as info:
            cbor.decode_byte_strings(data)
        assert info.value.rule == rule, data
    with pytest.raises(CBORLimitExceeded) as info:
        cbor.decode_byte_strings(cbor.encode([b"x" * 11]), max_string=10)
    assert info.value.rule == "string-too-long"
    with pytest.raises(CBORLimitExceeded) as info:
        cbor.decode_byte_strings(cbor.encode([b"x"] * 10), max_items=10)
    assert info.value.rule == "too-many-items"
    with pytest.raises(CBORLimitExceeded, match="exceeds the limit"):
        cbor.decode_byte_strings(cbor.encode([b"x"] * 10), max_bytes=5)
    with pytest.raises(MalformedCBOR, match="expected bytes"):
        cbor.decode_byte_strings("not bytes")  # type: ignore[arg-type]
    assert list(cbor.decode_byte_strings(bytearray(cbor.encode([b"ab"])))) == [b"ab"]


def test_its_offsets_take_4_bytes_per_16_items():
    items = [b""] * 100_000
    got = cbor.decode_byte_strings(cbor.encode(items))
    assert got.nbytes <= 4 * (len(items) // 16 + 2) and list(got) == items
    long = [bytes([i % 256]) * (i % 70_000) for i in range(0, 140_000, 997)]
    assert list(cbor.decode_byte_strings(cbor.encode(long))) == long
    with pytest.raises(IndexError):
        got[len(items)]
    with pytest.raises(TypeError):
        hash(got)
