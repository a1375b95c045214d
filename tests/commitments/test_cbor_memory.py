"""The decoders' memory is bounded by bytes, not items: whatever shape a document of n bytes has,
decoding it (cbor.decode, a leaf list, an opening's manifest at the download gate) peaks at no
more than 4x n plus a small constant in tracemalloc's count, or is refused with a reason."""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from challenges.opening import (
    GATE_MEMORY_RATIO,
    MAGIC,
    LeavesRefused,
    OpeningGate,
    OpeningRefused,
    decode_leaves,
)
from commitments import cbor
from commitments.errors import CBORLimitExceeded, MalformedCBOR, NonCanonicalCBOR
from commitments.leaves import step_leaf
from tests.commitments.tracing import traced_peak

# What may come on top of the budget's 4x in tracemalloc's count: the decoder's slack, and the
# exception and frames of a refusal.
CONSTANT = cbor.MEMORY_SLACK + 16 * 1024


# --- adversarial shapes: a unit repeated inside an array, about `size` bytes in all -------------

UNITS = {
    "empty arrays": b"\x80",
    "empty maps": b"\xa0",
    "nested one-item arrays": b"\x81\x81\x81\x80",
    "tiny ints": b"\x00",
    "large ints": b"\x1b" + b"\xff" * 8,
    "empty byte strings": b"\x40",
    "one-byte byte strings": b"\x41\x07",
    "empty texts": b"\x60",
    "floats": b"\xf9\x3c\x00",
    "maps of one tiny entry": b"\xa1\x00\x00",
    "arrays of three empty arrays": b"\x83\x80\x80\x80",
    "wide text": b"\x64\xf0\x9f\x98\x80",
    "digests": b"\x58\x20" + b"\x11" * 32,
}


def _array(n: int) -> bytes:
    return cbor._head(4, n)


def repeated(unit: bytes, size: int) -> bytes:
    count = max(1, size // len(unit))
    return _array(count) + unit * count


def deep_then(unit: bytes, size: int, depth: int) -> bytes:
    """The repeated units under `depth` one-item arrays."""
    return b"\x81" * depth + repeated(unit, size)


def mixed(units: list[bytes], size: int) -> bytes:
    body, count = b"", 0
    while len(body) < size:
        for u in units:
            body += u
            count += 1
    return _array(count) + body


_shapes = st.one_of(
    st.builds(repeated, st.sampled_from(list(UNITS.values())), st.integers(64 * 1024, 192 * 1024)),
    st.builds(deep_then, st.sampled_from(list(UNITS.values())), st.integers(64 * 1024, 128 * 1024),
              st.integers(1, cbor.MAX_DEPTH - 4)),
    st.builds(mixed, st.lists(st.sampled_from(list(UNITS.values())), min_size=2, max_size=6),
              st.integers(64 * 1024, 128 * 1024)),
)


@settings(max_examples=40, deadline=None)
@given(_shapes)
def test_decode_peaks_within_4x_its_input_or_refuses(data):
    peak, err = traced_peak(cbor.decode, data)
    assert peak <= 4 * len(data) + CONSTANT, f"{peak / len(data):.2f}x of {len(data)} bytes"
    if err is not None:
        assert isinstance(err, (MalformedCBOR, NonCanonicalCBOR)), err
        if err.rule == "too-much-memory":
            assert isinstance(err, CBORLimitExceeded) and str(cbor.memory_budget(len(data))) in str(err)


@settings(max_examples=25, deadline=None)
@given(_shapes)
def test_a_leaf_list_peaks_within_4x_its_input_or_refuses(data):
    peak, err = traced_peak(decode_leaves, data)
    assert peak <= 4 * len(data) + CONSTANT, f"{peak / len(data):.2f}x of {len(data)} bytes"
    assert err is None or isinstance(err, LeavesRefused)


def _gate_input(manifest: bytes) -> bytes:
    return MAGIC + struct.pack(">I", len(manifest)) + manifest


@settings(max_examples=25, deadline=None)
@given(_shapes, st.sampled_from(["samples", "leaf_proof"]))
def test_the_manifest_gate_peaks_within_its_ratio_of_the_manifest_or_refuses(shape, field):
    # The manifest as a map whose one field holds the shape, and the shape itself.
    for manifest in (b"\xa1" + cbor.encode(field) + shape, shape):
        data = _gate_input(manifest)
        gate = OpeningGate(expected_digest=bytes(32), spec_digest=bytes(32))
        peak, err = traced_peak(gate, data)
        assert peak <= GATE_MEMORY_RATIO * len(manifest) + CONSTANT, f"{peak / len(manifest):.2f}x"
        # (A shape check of the manifest names no class: the fetch stage reads that as malformed.)
        assert isinstance(err, OpeningRefused) and err.refusal_class in ("malformed", "invalid", None)


def test_eight_mib_of_empty_arrays_is_refused_within_the_bound_everywhere():
    n = 8 << 20
    data = _array(n) + b"\x80" * n
    for fn, bound in ((cbor.decode, 4), (decode_leaves, 4)):
        peak, err = traced_peak(fn, data)
        assert err is not None and peak <= bound * len(data) + CONSTANT
    # Nested so that each array head is cheap: refused when the budget runs out, not before (2 MiB:
    # tracemalloc makes each of the objects built before the refusal slow to count).
    nested = repeated(b"\x83\x80\x80\x80", 2 << 20)
    peak, err = traced_peak(cbor.decode, nested)
    assert isinstance(err, CBORLimitExceeded) and err.rule == "too-much-memory"
    assert 2 * len(nested) < peak <= 4 * len(nested) + CONSTANT
    peak, err = traced_peak(OpeningGate(expected_digest=bytes(32), spec_digest=bytes(32)),
                      _gate_input(b"\xa1" + cbor.encode("samples") + nested))
    assert isinstance(err, OpeningRefused) and peak <= GATE_MEMORY_RATIO * len(nested) + CONSTANT


# --- honest documents cost what they did --------------------------------------------------------


def test_an_honest_leaf_list_costs_a_few_percent_of_its_bytes():
    leaves = [step_leaf(t, bytes([t % 251]) * 32, 0 if t == 0 else 0x3F800000 - t) for t in range(20_000)]
    data = cbor.encode(leaves)
    peak, err = traced_peak(decode_leaves, data)
    assert err is None and peak < 0.05 * len(data)
    got = decode_leaves(data)
    assert got == leaves and list(got) == leaves and len(got) == len(leaves)


def test_honest_documents_fit_the_default_budget():
    docs = [cbor.encode([bytes(32)] * 10_000), cbor.encode(["pot/step/v1", 3, b"\1" * 32, 0x3F800000]),
            cbor.encode({"text": "x" * 100_000}), cbor.encode(b"\0" * 1_000_000)]
    for data in docs:
        dec = cbor.Decoder()
        assert cbor.encode(dec.decode(data)) == data
        assert dec.memory <= cbor.memory_budget(len(data))


# --- the budget and its refusal ---------------------------------------------------------------


def test_the_budget_is_4x_plus_slack_capped_and_max_memory_overrides_it():
    assert cbor.memory_budget(1000) == 4000 + cbor.MEMORY_SLACK
    assert cbor.memory_budget(1 << 40) == cbor.MAX_DECODE_MEMORY
    assert cbor.memory_budget(1000, ratio=16) == 16_000 + cbor.MEMORY_SLACK
    doc = cbor.encode([b"x" * 100] * 100)
    assert len(cbor.decode(doc, max_memory=20_000)) == 100
    with pytest.raises(CBORLimitExceeded, match="memory limit of 10000 bytes") as info:
        cbor.decode(doc, max_memory=10_000)
    assert info.value.rule == "too-much-memory" and info.value.offset is not None
    with pytest.raises(ValueError, match="max_memory"):
        cbor.Decoder(max_memory=-1)
    # More than the default, for a caller whose honest shape needs it.
    ints = cbor.encode(list(range(1000, 30_000)))
    with pytest.raises(CBORLimitExceeded, match="memory"):
        cbor.decode(ints)
    assert len(cbor.decode(ints, max_memory=cbor.memory_budget(len(ints), ratio=16))) == 29_000


def test_a_copied_input_is_charged():
    doc = cbor.encode(b"x" * 10_000)
    dec = cbor.Decoder()
    dec.decode(bytearray(doc))
    assert dec.memory >= 2 * 10_000
    dec.decode(doc)
    assert 10_000 <= dec.memory < 11_000


def test_the_charges_cover_cpython_sizes():
    r = cbor._r16
    for n in (0, 1, 31, 32, 1000):
        assert r(cbor._BYTES + n) >= sys.getsizeof(b"y" * n)
        assert r(cbor._ASCII + n) >= sys.getsizeof("y" * n)
        assert r(cbor._TEXT + 4 * n) >= sys.getsizeof("\U0001f600" * (n // 4) + "y" * (n % 4))
        assert r(cbor._LIST + cbor._SLOT * n) >= sys.getsizeof([None] * n)
        assert cbor._MAP + cbor._ENTRY * max(n, 2) >= sys.getsizeof({i: None for i in range(n)})
    assert cbor._SMALL_INT >= sys.getsizeof((1 << 30) - 1) and cbor._BIG_INT >= sys.getsizeof((1 << 64) - 1)
    assert cbor._FLOAT >= sys.getsizeof(1.5) and cbor._FRAME >= sys.getsizeof([None] * 6)


def test_a_window_decodes_in_place_with_offsets_into_the_buffer():
    doc = cbor.encode({"a": [1, 2]})
    buf = b"\xff" * 5 + doc + b"\xee" * 3
    assert cbor.decode(buf, start=5, end=5 + len(doc)) == {"a": [1, 2]}
    with pytest.raises(NonCanonicalCBOR) as info:
        cbor.decode(buf, start=5)
    assert info.value.rule == "trailing-bytes" and info.value.offset == 5 + len(doc)
    with pytest.raises(MalformedCBOR, match="empty"):
        cbor.decode(buf, start=3, end=3)
    with pytest.raises(ValueError, match="window"):
        cbor.decode(buf, start=4, end=len(buf) + 1)
    with pytest.raises(CBORLimitExceeded, match="exceeds the limit"):
        cbor.decode(buf, start=5, end=5 + len(doc), max_bytes=2)
