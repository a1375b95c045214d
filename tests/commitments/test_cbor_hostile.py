"""Hostile CBOR as an attacker would send it: a bignum remark, value-sharing DAGs (tags 28/29) and
deep nesting, through every decoding boundary (calls, leaf lists, opening manifests, specs,
protocol snapshots). Each is refused at once with a typed reason, and nothing else escapes."""

from __future__ import annotations

import struct
import time

import pytest

from chain.calls import PREFIX, CallDecodeError, decode_call
from chain.protocol.state import ProtocolState, SnapshotError
from challenges.opening import MAGIC, LeavesRefused, OpeningRefused, decode_leaves, load_opening
from commitments import cbor
from commitments.errors import CBORLimitExceeded, CommitmentError, MalformedCBOR
from commitments.spec import Spec

# Generous: each refusal here takes well under a millisecond; before the strict decoder they took
# more than 30 s (value sharing) or never finished (60 levels, or the bignum that stopped the node).
QUICK_S = 2.0


def _head(major: int, n: int) -> bytes:
    return cbor._head(major, n)


def bignum_remark(magnitude_bytes: int = 1792) -> bytes:
    """A commit_witness remark whose commitment is a tag-2 bignum too long to print in decimal."""
    big = b"\xc2" + _head(2, magnitude_bytes) + b"\xff" * magnitude_bytes
    body = b"\x82" + cbor.encode("commit_witness") + b"\xa2"
    # Keys in canonical order ("commitment" encodes shorter), so the tag is the first thing wrong.
    body += cbor.encode("commitment") + big + cbor.encode("challenge_id") + cbor.encode(b"\x11" * 32)
    return PREFIX + body


def shared_dag(levels: int) -> bytes:
    """Value sharing: node i = 28([node i+1, 29(i+1)]), so a tree walk visits 2**levels nodes."""
    out = b""
    for i in reversed(range(levels)):
        inner = out if out else b"\xd8\x1c\x80"  # innermost: a shareable empty list
        out = b"\xd8\x1c\x82" + inner + b"\xd8\x1d" + _head(0, i + 1)
    return out


def dag_remark(levels: int, pad: int = 0) -> bytes:
    body = b"\x82" + cbor.encode("commit_witness") + b"\xa2"
    body += (
        cbor.encode("commitment")
        + shared_dag(levels)
        + cbor.encode("challenge_id")
        + cbor.encode(b"\x00" * (32 + pad))
    )
    return PREFIX + body


def deep(levels: int) -> bytes:
    return b"\x81" * levels + b"\x00"


def manifest_opening(manifest: bytes) -> bytes:
    return MAGIC + struct.pack(">I", len(manifest)) + manifest


def _quick(fn, exc_type, match, *args):
    t0 = time.perf_counter()
    with pytest.raises(exc_type, match=match) as info:
        fn(*args)
    assert time.perf_counter() - t0 < QUICK_S
    # The reason is short and names a rule, never the attacker's value.
    assert len(str(info.value)) < 400
    return info.value


def test_the_bignum_remark_is_the_size_the_attack_needs():
    data = bignum_remark()
    assert 1700 <= len(data) <= 1900
    # The magnitude has more decimal digits than Python will print: formatting it would raise.
    assert len(b"\xff" * 1792) * 8 * 0.30103 > 4300


def test_a_bignum_remark_is_refused_with_a_reason():
    exc = _quick(decode_call, CallDecodeError, "tags are not allowed", bignum_remark())
    assert "not canonical CBOR" in str(exc)
    with pytest.raises(MalformedCBOR) as info:
        cbor.decode(bignum_remark()[len(PREFIX):])
    assert info.value.rule == "tag" and info.value.code == "MalformedCBOR"


@pytest.mark.parametrize("levels", [30, 60])
def test_value_sharing_remarks_are_refused_at_once(levels):
    data = dag_remark(levels)
    assert len(data) < 1000
    _quick(decode_call, CallDecodeError, "tags are not allowed", data)


def test_a_621_byte_value_sharing_call_is_refused_at_once():
    # 80 levels (a tree walk of 2**80 nodes) padded to the size of the call that kept block
    # processing busy for more than 30 s.
    data = dag_remark(80, pad=2)
    assert len(data) == 621
    _quick(decode_call, CallDecodeError, "tags are not allowed", data)


@pytest.mark.parametrize("levels", [30, 60])
def test_value_sharing_leaf_lists_and_manifests_are_refused_at_once(levels, tmp_path):
    leaves = b"\x82" + cbor.encode(b"leaf") + shared_dag(levels)
    _quick(decode_leaves, LeavesRefused, "tags are not allowed", leaves)
    manifest = b"\xa1" + cbor.encode("samples") + shared_dag(levels)
    _quick(load_opening, OpeningRefused, "tags are not allowed", manifest_opening(manifest))
    path = tmp_path / "x.opening"
    path.write_bytes(manifest_opening(manifest))
    _quick(load_opening, OpeningRefused, "tags are not allowed", path)


def test_value_sharing_specs_and_snapshots_are_refused_at_once():
    _quick(
        Spec.from_cbor, MalformedCBOR, "tags are not allowed", b"\xa1" + cbor.encode("model") + shared_dag(60)
    )
    _quick(ProtocolState.from_cbor, SnapshotError, "tags are not allowed", shared_dag(60))


@pytest.mark.parametrize("levels", [cbor.MAX_DEPTH + 1, 10_000, 60_000])
def test_nesting_past_the_depth_limit_is_refused_everywhere(levels):
    for data in (deep(levels), b"\xa1\x00" * levels + b"\x00"):
        with pytest.raises(CBORLimitExceeded, match="nested deeper") as info:
            cbor.decode(data)
        assert info.value.rule == "too-deep"
        _quick(decode_call, CallDecodeError, "nested deeper", PREFIX + data)
        # A leaf list holds byte strings only: the first item that is not one is refused at its first byte.
        exc = _quick(decode_leaves, LeavesRefused, "byte strings", data)
        assert exc.reason.endswith(
            "offset 1: an array in an array that holds only byte strings"
            if data[0] == 0x81
            else "offset 0: a map where an array of byte strings is due"
        )
        _quick(load_opening, OpeningRefused, "nested deeper", manifest_opening(data))


def test_the_depth_limit_is_the_encoders():
    ok: list = []
    for _ in range(cbor.MAX_DEPTH):
        ok = [ok]
    assert cbor.decode(cbor.encode(ok)) == ok
    assert cbor.decode(deep(cbor.MAX_DEPTH)) is not None
    with pytest.raises(CommitmentError):
        cbor.encode([ok])
    with pytest.raises(CBORLimitExceeded):
        cbor.decode(b"\x81" + cbor.encode(ok))


def test_a_huge_claimed_length_is_refused_before_anything_is_built():
    for head in (b"\x5b", b"\x7b", b"\x9b", b"\xbb"):
        dec = cbor.Decoder()
        with pytest.raises(MalformedCBOR) as info:
            dec.decode(head + b"\xff" * 8 + b"\x00" * 64)
        assert dec.steps == 1, "refused at the head, before reading or allocating"
        assert "18446744073709551615" not in str(info.value)


def test_a_huge_integer_is_refused_by_the_encoder_without_printing_it():
    for n in (10**5000, -(10**5000), 2**64):
        with pytest.raises(MalformedCBOR, match="does not fit in 64 bits") as info:
            cbor.encode({"x": [n]})
        assert not any(ch.isdigit() for ch in str(info.value).replace("64", ""))


def test_call_refusals_stay_small_whatever_the_names_on_the_wire():
    from chain.calls import PREFIX as P

    long_name = "x" * 100_000
    for data in (P + cbor.encode([long_name, {}]),
                 P + cbor.encode(["commit_witness", {"challenge_id": b"\x01" * 32, "commitment": b"\x02" * 32,
                                                    **{f"{i:06d}" + "y" * 1000: 0 for i in range(100)}}])):
        _quick(decode_call, CallDecodeError, "unknown", data)
