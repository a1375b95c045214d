"""Openings read from disk through a memory map: the pre-state is never copied whole, it reads as
safetensors itself reads it, and a header that lies about its tensors allocates nothing."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load

from challenges.opening import (
    OpeningRefused,
    build_opening,
    load_opening,
    parse_state_bytes,
    state_bytes,
    validate_opening,
)
from commitments import merkle
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return walk(tiny_spec(3), corpus(tmp_path_factory.mktemp("data")))


def test_an_opening_from_a_path_is_mapped_and_validates(run, tmp_path):
    data = build_opening(spec=run.spec, run_id=RUN_ID, step=2, pre_state=run.states[1], dataset=run.dataset,
                         schedule=run.schedule, leaves=run.leaves)
    path = tmp_path / "x.opening"
    path.write_bytes(data)
    op = load_opening(path)
    assert isinstance(op.pre_state, memoryview) and op.pre_state.readonly
    assert op.digest == load_opening(data).digest
    v = validate_opening(
        op,
        expected_digest=op.digest,
        run_id=RUN_ID,
        step=2,
        spec_digest=run.spec.digest(),
        dataset_hash=run.dataset.dataset_hash,
        schedule_commitment=run.schedule.commitment,
        initial_hash=run.states[0].digest(),
        root=merkle.root(run.leaves),
        size=len(run.leaves),
    )
    assert v.state.digest() == run.states[1].digest()


def test_validation_without_a_copy_checks_the_state_in_the_map(run, tmp_path):
    import numpy as np

    data = build_opening(spec=run.spec, run_id=RUN_ID, step=2, pre_state=run.states[1], dataset=run.dataset,
                         schedule=run.schedule, leaves=run.leaves)
    path = tmp_path / "x.opening"
    path.write_bytes(data)
    facts = dict(run_id=RUN_ID, step=2, spec_digest=run.spec.digest(), dataset_hash=run.dataset.dataset_hash,
                 schedule_commitment=run.schedule.commitment, initial_hash=run.states[0].digest(),
                 root=merkle.root(run.leaves), size=len(run.leaves))
    op = load_opening(path)
    v = validate_opening(op, expected_digest=op.digest, copy_state=False, **facts)
    assert v.state.digest() == run.states[1].digest()
    lo = np.frombuffer(op.pre_state, dtype=np.uint8).ctypes.data
    hi = lo + len(op.pre_state)
    # every tensor of any size lies inside the file's map: no byte of the state was copied
    assert all(lo <= t.data_ptr() < hi for t in v.state.tensors.values() if t.numel())
    copied = validate_opening(load_opening(path), expected_digest=op.digest, **facts)
    assert not any(lo <= t.data_ptr() < hi for t in copied.state.tensors.values())
    # and the refusals are the same: a state that is not leaf t-1's is refused either way
    other = build_opening(spec=run.spec, run_id=RUN_ID, step=2, pre_state=run.states[2], dataset=run.dataset,
                          schedule=run.schedule, leaves=run.leaves)
    path.write_bytes(other)
    op = load_opening(path)
    for copy_state in (True, False):
        with pytest.raises(OpeningRefused, match="step counter|pre-state digest"):
            validate_opening(op, expected_digest=op.digest, copy_state=copy_state, **facts)


def _header(blob: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _with_header(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _corruptions(blob: bytes) -> dict[str, bytes]:
    header, data = _header(blob)
    names = [k for k in header if k != "__metadata__"]
    first = names[0]
    gap = json.loads(json.dumps(header))
    gap[first]["data_offsets"] = [gap[first]["data_offsets"][0] + 4, gap[first]["data_offsets"][1] + 4]
    wrong_dtype = json.loads(json.dumps(header))
    wrong_dtype[first]["dtype"] = "Q7"
    short_shape = json.loads(json.dumps(header))
    short_shape[first]["shape"] = [1000003]
    bad_meta = json.loads(json.dumps(header))
    bad_meta["__metadata__"] = {"format": 7}
    return {
        "truncated": blob[:-3],
        "padded": blob + b"\0" * 8,
        "length-too-long": struct.pack("<Q", len(blob)) + blob[8:],
        "not-json": struct.pack("<Q", 4) + b"{abc" + data,
        "gap": _with_header(gap, data),
        "unknown-dtype": _with_header(wrong_dtype, data),
        "shape-vs-bytes": _with_header(short_shape, data),
        "metadata-not-text": _with_header(bad_meta, data),
        "empty": b"",
    }


def test_the_mapped_reader_reads_and_refuses_what_safetensors_does(run):
    blob = state_bytes(run.states[1])
    ours = parse_state_bytes(memoryview(blob), run.spec)
    theirs = load(blob)
    assert set(ours.tensors) == set(theirs)
    for name, t in theirs.items():
        assert ours.tensors[name].dtype == t.dtype and torch.equal(ours.tensors[name], t), name
    for bad in _corruptions(blob).values():
        with pytest.raises((SafetensorError, ValueError, RuntimeError)):
            load(bad)
        with pytest.raises(OpeningRefused, match="pre-state"):
            parse_state_bytes(memoryview(bad), run.spec)


def test_a_header_claiming_a_huge_tensor_allocates_nothing(run):
    # 2^40 float32 values declared in a few bytes: refused from the header alone.
    header = {"param/x": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 1 << 42]}}
    with pytest.raises(OpeningRefused, match="not a readable safetensors file"):
        parse_state_bytes(_with_header(header, b"\0" * 64), run.spec)
    # A well-tiled header for tensors of the wrong layout: refused before any copy is made.
    header = {"param/x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    with pytest.raises(OpeningRefused, match="state layout"):
        parse_state_bytes(_with_header(header, b"\0" * 8), run.spec)
