"""The manifest's memory budget is sized from the run's own spec: an honest opening is never
refused by a memory limit, whatever its spec's shape (many short samples from a tiny dataset cost
far more than 4x their bytes as objects), while a hostile manifest under a usual spec still gets
about the ratio; cbor.map_entry finds the fields that size it without building anything."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from challenges.opening import (
    GATE_MEMORY_RATIO,
    MAGIC,
    OpeningGate,
    OpeningRefused,
    build_opening,
    honest_manifest_charge,
    load_opening,
)
from commitments import cbor
from commitments.dataset import Dataset
from commitments.errors import CommitmentError
from commitments.leaves import initial_leaf, step_leaf
from oracle.step import init_state
from tests.commitments.tracing import traced_peak
from tests.miner.helpers import schedule_for, tiny_spec

_HEADER = len(MAGIC) + 4


def _opening(tmp_path, *, batch_size: int, seq_len: int, tokens: int):
    """An honest opening of step 1 (the gate and the loader check no replay) over a corpus of
    `tokens` tokens; returns (spec, opening bytes, manifest length)."""
    path = tmp_path / "corpus.npy"
    np.save(path, np.arange(tokens, dtype=np.uint16) % 7)
    spec = tiny_spec(2, batch={"batch_size": batch_size, "seq_len": seq_len})
    ds = Dataset.open(path, spec.sample_len)
    state = init_state(spec)
    leaves = [initial_leaf(state.digest()), step_leaf(1, state.digest(), 0), step_leaf(2, state.digest(), 0)]
    data = build_opening(spec=spec, run_id=bytes(32), step=1, pre_state=state, dataset=ds,
                         schedule=schedule_for(spec, ds), leaves=leaves)
    (mlen,) = struct.unpack(">I", data[len(MAGIC):_HEADER])
    return spec, data, mlen


def test_an_honest_opening_of_many_short_samples_passes_the_gate_and_the_loader(tmp_path):
    # 2048 one-token samples from a dataset of 4: about 16x its bytes as objects. A budget of the
    # ratio alone refused this honest opening (and the committee would have revealed "refused").
    spec, data, mlen = _opening(tmp_path, batch_size=2048, seq_len=1, tokens=8)
    digest = load_opening(data).digest
    gate = OpeningGate(expected_digest=digest, spec_digest=spec.digest())
    done, size = gate(data[:_HEADER + mlen])
    assert done and size == len(data)
    with pytest.raises(CommitmentError, match="memory limit"):
        cbor.decode(data[_HEADER:_HEADER + mlen], max_memory=cbor.memory_budget(mlen, GATE_MEMORY_RATIO))


def test_a_usual_spec_keeps_the_ratio_for_a_hostile_manifest(tmp_path):
    # The run's own spec and sizes, with the samples replaced by 256 KiB of empty arrays (within
    # the size its spec allows): refused, within the gate's ratio of the manifest (the honest
    # charge of 64 samples is far below it).
    spec, data, mlen = _opening(tmp_path, batch_size=64, seq_len=255, tokens=20000)
    manifest = cbor.decode(data[_HEADER:_HEADER + mlen])
    n = 256 << 10
    hostile = dict(manifest)
    hostile["samples"] = []
    raw = cbor.encode(hostile)
    empty = cbor.encode([])
    at = raw.index(cbor.encode("samples") + empty) + len(cbor.encode("samples"))
    bomb = raw[:at] + cbor._head(4, n) + b"\x80" * n + raw[at + len(empty):]
    assert honest_manifest_charge(spec, len(manifest["spec"]), num_samples=manifest["num_samples"],
                                  size=manifest["size"], steps=manifest["steps"]) < len(bomb)
    gate = OpeningGate(expected_digest=bytes(32), spec_digest=spec.digest())
    peak, err = traced_peak(gate, MAGIC + struct.pack(">I", len(bomb)) + bomb)
    assert isinstance(err, OpeningRefused) and "memory limit" in str(err), err
    assert peak <= GATE_MEMORY_RATIO * len(bomb) + cbor.MEMORY_SLACK + 64 * 1024, peak / len(bomb)


def test_the_gate_refuses_another_spec_before_decoding_the_rest(tmp_path):
    spec, data, mlen = _opening(tmp_path, batch_size=4, seq_len=16, tokens=4000)
    gate = OpeningGate(expected_digest=bytes(32), spec_digest=bytes(32))
    with pytest.raises(OpeningRefused, match="spec digest") as exc:
        gate(data[:_HEADER + mlen])
    assert exc.value.refusal_class == "invalid"


_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.binary(max_size=40)
                       | st.text(max_size=10), lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _values, max_size=8), st.text(max_size=6))
def test_map_entry_finds_what_decode_finds(doc, key):
    data = cbor.encode(doc)
    where = cbor.map_entry(data, key)
    assert (where is None) == (key not in doc)
    if where is not None:
        assert cbor.decode(data[where[0]:where[1]]) == doc[key]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_map_entry_answers_or_refuses_on_any_bytes(data):
    try:
        where = cbor.map_entry(b"\xa1" + data, "spec")
    except CommitmentError:
        return
    assert where is None or 1 <= where[0] <= where[1] <= len(data) + 1


def test_map_entry_takes_no_memory_for_a_large_document():
    n = 1 << 20
    data = (
        b"\xa2" + cbor.encode("a") + cbor._head(4, n) + b"\x80" * n + cbor.encode("spec") + cbor.encode(b"x")
    )
    peak, err = traced_peak(cbor.map_entry, data, "spec")
    assert err is None and peak < 16 * 1024
    assert cbor.map_entry(data, "spec") == (len(data) - 2, len(data))
