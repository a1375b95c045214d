"""Fuzzed openings: arbitrary container bytes, CBOR manifests of any shape, a real opening's fields
replaced by fuzzed values, and byte-level mutations of a real opening. load_opening and
validate_opening either accept or refuse with OpeningRefused; nothing else escapes, nothing hangs."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from challenges.opening import FIELDS, MAGIC, OpeningRefused, encode_opening, load_opening, validate_opening
from commitments import cbor, merkle
from commitments.dataset import verify_sample
from commitments.hashing import h
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk

FUZZ = settings(max_examples=120, deadline=3000, suppress_health_check=list(HealthCheck))

text = st.text(max_size=30)
cbor_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64) + 1, 2**64 - 1) | text | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=10,
)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real two-step run, its opening of step 2, and the chain facts that opening answers."""
    from challenges.opening import build_opening

    w = walk(tiny_spec(2), corpus(tmp_path_factory.mktemp("fuzz-data")))
    data = build_opening(spec=w.spec, run_id=RUN_ID, step=2, pre_state=w.states[1], dataset=w.dataset,
                         schedule=w.schedule, leaves=w.leaves)
    facts = dict(run_id=RUN_ID, step=2, spec_digest=w.spec.digest(), dataset_hash=w.dataset.dataset_hash,
                 schedule_commitment=w.schedule.commitment, initial_hash=w.states[0].digest(),
                 root=merkle.root(w.leaves), size=len(w.leaves))
    return data, facts


def check(data: bytes, facts: dict, original: bytes) -> str:
    """load + validate as the node does; returns 'refused' or 'valid'. Anything else fails the test."""
    try:
        op = load_opening(data, max_bytes=len(original) * 4)
        validate_opening(op, expected_digest=op.digest, **facts)
    except OpeningRefused as exc:
        assert exc.reason, "a refusal must say why"
        return "refused"
    return "valid"


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes(real, data):
    assert check(data, real[1], real[0]) == "refused"
    assert check(MAGIC + data, real[1], real[0]) == "refused"


@FUZZ
@given(st.integers(0, 2**32 - 1), st.binary(max_size=200))
def test_any_declared_manifest_length(real, length, rest):
    assert check(MAGIC + struct.pack(">I", length) + rest, real[1], real[0]) == "refused"


@FUZZ
@given(cbor_values, st.binary(max_size=64))
def test_manifest_of_any_shape(real, manifest, pre_state):
    assert check(encode_opening(manifest, pre_state), real[1], real[0]) == "refused"


@FUZZ
@given(st.data())
def test_real_manifest_with_fields_replaced(real, data):
    data_bytes, facts = real
    op = load_opening(data_bytes)
    m = dict(op.manifest)
    names = data.draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True), label="fields")
    for name in names:
        m[name] = data.draw(_value_like(m[name]), label=name)
    blob = op.pre_state
    if data.draw(st.booleans(), label="keep blob digest consistent"):
        m["pre_state_blob"], m["pre_state_len"] = h(blob), len(blob)
    if data.draw(st.booleans(), label="drop or add a key"):
        if data.draw(st.booleans()):
            m.pop(data.draw(st.sampled_from(sorted(m))), None)
        else:
            m[data.draw(text)] = data.draw(cbor_values)
    out = check(encode_opening(m, blob), facts, data_bytes)
    if m != op.manifest and out == "valid":
        # The dataset hash is a Merkle root, which does not commit the tree's size: a range of
        # sizes around the true one gives the same inclusion paths for the batch's indices. So
        # num_samples alone may change and still validate; then every sample must be the true
        # tree's (its proof holds under the true size too). Any other accepted change is a bug.
        absent = object()
        changed = {k for k in set(m) | set(op.manifest) if m.get(k, absent) != op.manifest.get(k, absent)}
        assert changed == {"num_samples"}, f"a changed manifest ({sorted(changed)}) was accepted"
        dtype = np.dtype(op.manifest["token_dtype"]).newbyteorder("<")
        for index, tok, proof in m["samples"]:
            arr = np.frombuffer(tok, dtype=dtype)
            assert verify_sample(arr, index, op.manifest["num_samples"], proof, facts["dataset_hash"])


def _value_like(v):
    """Fuzzed values near the original's type (so validation goes deep), or of any type."""
    if isinstance(v, bytes):
        near = st.one_of(st.binary(min_size=len(v), max_size=len(v)), st.binary(max_size=64))
    elif isinstance(v, bool) or not isinstance(v, (int, list, str)):
        near = cbor_values
    elif isinstance(v, int):
        near = st.integers(0, 2**64 - 1) | st.sampled_from([v - 1, v + 1, 0, 2**63])
    elif isinstance(v, str):
        near = st.sampled_from(["uint8", "uint16", "uint32", "int64", "float32", "pot/opening/v0", ""]) | text
    else:
        near = st.lists(st.binary(min_size=32, max_size=32), max_size=len(v) + 2) | st.lists(
            st.lists(
                st.integers(0, 2**20)
                | st.binary(max_size=40)
                | st.lists(st.binary(min_size=32, max_size=32), max_size=3),
                max_size=4,
            ),
            max_size=6,
        )
    return st.one_of(near, cbor_values)


@FUZZ
@given(st.data())
def test_byte_mutations_of_a_real_opening(real, data):
    data_bytes, facts = real
    raw = bytearray(data_bytes)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "set"]), label="kind")
        # Half the edits land in the header and manifest, where the parser is most exposed.
        hi = min(len(raw) - 1, 4096) if data.draw(st.booleans()) else len(raw) - 1
        i = data.draw(st.integers(0, max(0, hi)), label="at")
        if kind == "flip":
            raw[i] ^= data.draw(st.integers(1, 255), label="mask")
        elif kind == "cut":
            del raw[i:]
        elif kind == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=16), label="bytes")
        else:
            raw[i] = data.draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x9F, 0xBF, 0x5B]), label="byte")
        if not raw:
            break
    out = check(bytes(raw), facts, data_bytes)
    if bytes(raw) != data_bytes:
        assert out == "refused", "a mutated opening was accepted"


def test_the_real_opening_is_valid(real):
    assert check(real[0], real[1], real[0]) == "valid"


def test_manifest_field_list_is_exact(real):
    # Sanity of the fuzz base: the real manifest carries exactly the documented fields.
    assert set(load_opening(real[0]).manifest) == set(FIELDS)
    assert cbor.decode(load_opening(real[0]).manifest_bytes) == load_opening(real[0]).manifest
