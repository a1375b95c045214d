"""Step leaves: exact byte format, parsing refusals, and the float32 loss bit pattern."""

from __future__ import annotations

import struct

import blake3
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from commitments import cbor
from commitments.leaves import (
    INITIAL_LOSS_BITS,
    LeafError,
    StepLeaf,
    initial_leaf,
    loss_bits,
    loss_from_bits,
    parse_step_leaf,
    step_leaf,
    witness_value_hash,
)

D = bytes(range(32))


def test_step_leaf_is_the_cbor_structure_of_design_section_4():
    assert step_leaf(7, D, 0x3F800000) == cbor.encode(["pot/step/v1", 7, D, 0x3F800000])


def test_initial_leaf_is_leaf_zero_with_zero_loss_bits():
    assert INITIAL_LOSS_BITS == 0
    assert initial_leaf(D) == step_leaf(0, D, 0)
    assert parse_step_leaf(initial_leaf(D)) == StepLeaf(0, D, 0)


def test_leaf_zero_with_a_loss_is_refused():
    with pytest.raises(LeafError, match="leaf 0"):
        step_leaf(0, D, 1)
    with pytest.raises(LeafError, match="leaf 0"):
        parse_step_leaf(cbor.encode(["pot/step/v1", 0, D, 5]))


@given(t=st.integers(1, 2**40), digest=st.binary(min_size=32, max_size=32), bits=st.integers(0, 2**32 - 1))
def test_parse_round_trip(t, digest, bits):
    leaf = step_leaf(t, digest, bits)
    parsed = parse_step_leaf(leaf)
    assert parsed == StepLeaf(t, digest, bits)
    assert parsed.to_bytes() == leaf


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (["pot/step/v2", 1, D, 0], "domain"),
        (["pot/step/v1", 1, D], "list of 3"),
        ({"t": 1}, "dict"),
        (["pot/step/v1", -1, D, 0], "t must be"),
        (["pot/step/v1", "1", D, 0], "t must be"),
        (["pot/step/v1", 1, D[:31], 0], "31 bytes"),
        (["pot/step/v1", 1, D.hex(), 0], "state_digest"),
        (["pot/step/v1", 1, D, 2**32], "loss_bits"),
        (["pot/step/v1", 1, D, -1], "loss_bits"),
        (["pot/step/v1", 1, D, 1.0], "loss_bits"),
    ],
)
def test_parse_refuses_malformed_leaves_with_a_reason(obj, reason):
    with pytest.raises(LeafError, match=reason):
        parse_step_leaf(cbor.encode(obj))


def test_parse_refuses_non_canonical_and_garbage_bytes():
    leaf = step_leaf(3, D, 9)
    # 3 as a one-byte-argument int (0x18 0x03) instead of the short form: same value, not canonical.
    long_form = leaf.replace(b"\x03", b"\x18\x03", 1)
    with pytest.raises(LeafError, match="canonical"):
        parse_step_leaf(long_form)
    with pytest.raises(LeafError):
        parse_step_leaf(b"\xff\x00garbage")
    with pytest.raises(LeafError):
        parse_step_leaf(leaf + b"\x00")


def test_step_leaf_refuses_bad_fields():
    with pytest.raises(LeafError, match="state_digest"):
        step_leaf(1, D + b"x", 0)
    with pytest.raises(LeafError, match="t must be"):
        step_leaf(True, D, 0)
    with pytest.raises(LeafError, match="loss_bits"):
        step_leaf(1, D, 2**32)


def test_witness_value_hash_is_blake3_of_the_leaf_bytes():
    leaf = step_leaf(4, D, 77)
    assert witness_value_hash(leaf) == blake3.blake3(leaf).digest()
    assert witness_value_hash(leaf) != witness_value_hash(step_leaf(4, D, 78))


def test_loss_bits_of_tensors_arrays_and_floats():
    one = 0x3F800000
    assert loss_bits(torch.tensor(1.0, dtype=torch.float32)) == one
    assert loss_bits(torch.tensor([1.0], dtype=torch.float32, requires_grad=True)) == one
    assert loss_bits(np.float32(1.0)) == one
    assert loss_bits(np.array([[1.0]], dtype=np.float32)) == one
    assert loss_bits(1.0) == one
    assert loss_bits(-2.5) == struct.unpack("<I", struct.pack("<f", -2.5))[0]
    assert loss_bits(float(np.float32(0.1))) == struct.unpack("<I", struct.pack("<f", 0.1))[0]


def test_loss_bits_refuses_values_that_are_not_one_float32():
    with pytest.raises(LeafError, match="float32"):
        loss_bits(torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(LeafError, match="one element"):
        loss_bits(torch.zeros(2))
    with pytest.raises(LeafError, match="float32"):
        loss_bits(np.float64(1.0))
    with pytest.raises(LeafError, match="not exactly a float32"):
        loss_bits(0.1)
    with pytest.raises(LeafError, match="overflows"):
        loss_bits(1e300)
    with pytest.raises(LeafError):
        loss_bits(True)


@given(bits=st.integers(0, 2**32 - 1))
def test_every_bit_pattern_round_trips_through_numpy_and_torch(bits):
    as_np = np.array([bits], dtype=np.uint32).view(np.float32)
    assert loss_bits(as_np) == bits
    assert loss_bits(torch.from_numpy(as_np.copy())) == bits
    value = loss_from_bits(bits)
    if value == value:  # NaN payloads survive only in arrays, not in Python floats
        assert loss_bits(value) == bits


def test_loss_from_bits_refuses_out_of_range():
    with pytest.raises(LeafError):
        loss_from_bits(2**32)
    assert loss_from_bits(0x3F800000) == 1.0
    assert StepLeaf(1, D, 0x40000000).loss == 2.0
