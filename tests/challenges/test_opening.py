"""Openings: build/load/validate round trip, and every tampering refused with a reason naming it."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from challenges.opening import (
    MAGIC,
    LeavesRefused,
    OpeningRefused,
    build_opening,
    committed_losses,
    decode_leaves,
    encode_leaves,
    encode_opening,
    load_opening,
    opening_digest,
    state_bytes,
    validate_opening,
    verify_leaves,
)
from commitments import cbor, merkle
from commitments.leaves import loss_bits, step_leaf
from oracle.state import TrainState
from tests.miner.helpers import RUN_ID, corpus, tiny_spec, walk

STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return walk(tiny_spec(STEPS), corpus(tmp_path_factory.mktemp("data")))


def facts(run, op, **over):
    d = dict(expected_digest=op.digest, run_id=RUN_ID, step=op.step, spec_digest=run.spec.digest(),
             dataset_hash=run.dataset.dataset_hash, schedule_commitment=run.schedule.commitment,
             initial_hash=run.states[0].digest(), root=merkle.root(run.leaves), size=len(run.leaves))
    d.update(over)
    return d


def build(run, t, **over):
    kw = dict(spec=run.spec, run_id=RUN_ID, step=t, pre_state=run.states[t - 1], dataset=run.dataset,
              schedule=run.schedule, leaves=run.leaves)
    kw.update(over)
    return build_opening(**kw)


def retamper(data: bytes, edit=None, pre_state: bytes | None = None, fix_blob: bool = True) -> bytes:
    """Rebuild an opening after editing its manifest and/or pre-state (keeping it well-formed)."""
    op = load_opening(data)
    m = dict(op.manifest)
    blob = op.pre_state if pre_state is None else pre_state
    if fix_blob:
        from commitments.hashing import h

        m["pre_state_blob"], m["pre_state_len"] = h(blob), len(blob)
    if edit is not None:
        edit(m)
    return encode_opening(m, blob)


def refused(run, data, match, **over):
    op = load_opening(data)
    with pytest.raises(OpeningRefused, match=match):
        validate_opening(op, **facts(run, op, **over))


# --- round trip -------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, STEPS])
def test_round_trip(run, t):
    data = build(run, t)
    assert data.startswith(MAGIC)
    op = load_opening(data)
    assert op.step == t and op.run_id == RUN_ID
    assert opening_digest(data) == op.digest
    v = validate_opening(op, **facts(run, op))
    assert v.state.digest() == run.states[t - 1].digest()
    assert v.leaf_prev.t == t - 1 and v.leaf_t.t == t
    assert v.leaf_bytes == run.leaves[t]
    assert torch.equal(v.batch, torch.from_numpy(run.dataset.batch(run.schedule.batch(t))))


def test_pre_state_as_bytes_and_from_path(run, tmp_path):
    blob = state_bytes(run.states[1])
    data = build(run, 2, pre_state=blob)
    path = tmp_path / "op.bin"
    path.write_bytes(data)
    op = load_opening(path)
    assert op.digest == load_opening(data).digest
    validate_opening(op, **facts(run, op))


def test_digest_covers_the_pre_state(run):
    a = load_opening(build(run, 2))
    st = dict(run.states[1].tensors)
    name = next(iter(st))
    st[name] = st[name].clone()
    st[name].view(-1)[0] += 1.0
    b = load_opening(retamper(build(run, 2), pre_state=state_bytes(TrainState(st))))
    assert a.digest != b.digest


def test_build_refuses_a_root_it_does_not_hold(run):
    with pytest.raises(OpeningRefused, match="do not give the root"):
        build(run, 2, root=b"\x01" * 32)
    with pytest.raises(OpeningRefused, match="step 0 is outside"):
        build(run, 0)


# --- load: malformed files --------------------------------------------------------------------


def test_bad_magic(run):
    data = build(run, 2)
    with pytest.raises(OpeningRefused, match="does not start with"):
        load_opening(b"XXXXX\n" + data[6:])


def test_truncated_header_and_manifest(run):
    data = build(run, 2)
    with pytest.raises(OpeningRefused, match="shorter than the 10-byte header"):
        load_opening(data[:7])
    (mlen,) = struct.unpack(">I", data[6:10])
    with pytest.raises(OpeningRefused, match="truncated opening: the manifest needs"):
        load_opening(data[:10 + mlen - 1])


def test_truncated_pre_state(run):
    data = build(run, 2)
    with pytest.raises(OpeningRefused, match="pre-state length is .* manifest says"):
        load_opening(data[:-100])
    with pytest.raises(OpeningRefused, match="padded"):
        load_opening(data + b"\x00")


def test_oversized(run, tmp_path):
    data = build(run, 2)
    with pytest.raises(OpeningRefused, match="over the limit"):
        load_opening(data, max_bytes=len(data) - 1)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    with pytest.raises(OpeningRefused, match="over the limit"):
        load_opening(path, max_bytes=1000)
    with pytest.raises(OpeningRefused, match="manifest length .* exceeds"):
        load_opening(MAGIC + struct.pack(">I", 2**32 - 1) + b"\x00" * 10)


def test_not_canonical_cbor(run):
    op = load_opening(build(run, 2))
    mb = op.manifest_bytes
    # Re-encode the map head in the long form (0xb8 n instead of 0xb3): same value, not canonical.
    assert mb[0] == 0xa0 + len(op.manifest)
    bad = bytes([0xb8, len(op.manifest)]) + mb[1:]
    with pytest.raises(OpeningRefused, match="not canonical CBOR"):
        load_opening(MAGIC + struct.pack(">I", len(bad)) + bad + op.pre_state)
    garbage = b"\xff\xfe\xfd"
    with pytest.raises(OpeningRefused, match="not canonical CBOR"):
        load_opening(MAGIC + struct.pack(">I", 3) + garbage)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.pop("leaf_proof"), "missing field.*leaf_proof"),
    (lambda m: m.update(extra=1), "unknown field.*extra"),
    (lambda m: m.update(step="2"), "step must be an unsigned integer"),
    (lambda m: m.update(step=0), "at least 1"),
    (lambda m: m.update(run_id=b"\x00" * 31), "run_id must be 32 bytes"),
    (lambda m: m.update(version="pot/opening/v0"), "version must be"),
    (lambda m: m.update(token_dtype="float32"), "token_dtype must be one of"),
    (lambda m: m.update(samples=[]), "samples must be a non-empty list"),
    (lambda m: m.update(samples=[[1, b"x"]]), r"sample 0 must be \[index, token bytes, proof\]"),
    (lambda m: m.update(leaf_proof=[b"x"]), "leaf_proof must be a list of at most"),
])
def test_mistyped_manifest(run, edit, match):
    data = retamper(build(run, 2), edit)
    with pytest.raises(OpeningRefused, match=match):
        load_opening(data)


def test_manifest_not_a_map(run):
    mb = cbor.encode([1, 2])
    with pytest.raises(OpeningRefused, match="must be a CBOR map"):
        load_opening(MAGIC + struct.pack(">I", len(mb)) + mb)


# --- validate: each check names what is wrong --------------------------------------------------


def test_wrong_expected_digest(run):
    refused(run, build(run, 2), "opening digest .* != the digest on chain", expected_digest=b"\x02" * 32)


def test_spec_digest(run):
    refused(run, build(run, 2), "spec digest .* != the run's spec digest", spec_digest=b"\x03" * 32)


def test_another_runs_opening(run):
    refused(run, build(run, 2), "is for run .* not run", run_id=b"\x04" * 32)


def test_another_steps_opening(run):
    refused(run, build(run, 3), "is for step 3, the challenge is step 2", step=2)


def test_other_commitments(run):
    data = build(run, 2)
    refused(run, data, "dataset hash .* != the run's", dataset_hash=b"\x05" * 32)
    refused(run, data, "schedule commitment .* != the run's", schedule_commitment=b"\x06" * 32)
    refused(run, data, "is not the challenged root", root=b"\x07" * 32)
    refused(run, data, "is not the challenged root", size=len(run.leaves) - 1)


def test_forged_leaf_proof(run):
    def edit(m):
        m["leaf_proof"] = [bytes(32)] + m["leaf_proof"][1:]
    refused(run, retamper(build(run, 2), edit), "leaf 2 is not included in the root")

    def edit_prev(m):
        m["leaf_prev_proof"] = list(reversed(m["leaf_prev_proof"]))
    refused(run, retamper(build(run, 3), edit_prev), "leaf 2 is not included in the root")


def test_forged_leaf_value(run):
    # A leaf that is not a step leaf can still be in a tree the "miner" built: refuse its shape.
    bogus = list(run.leaves)
    bogus[2] = b"not a leaf"
    tree = merkle.MerkleTree.from_leaves(bogus)
    data = build(run, 2, leaves=bogus)
    refused(run, data, "not a step leaf", root=tree.root())
    swapped = list(run.leaves)
    swapped[2] = step_leaf(3, bytes(32), 0)  # a leaf naming the wrong step
    data = build(run, 2, leaves=swapped)
    refused(run, data, "leaf 2 says step 3", root=merkle.root(swapped))


def test_changed_batch_index(run):
    ds = run.dataset

    def edit(m):
        # An honest sample (true tokens and dataset proof) that is not in the schedule's batch.
        i = (m["samples"][0][0] + 1) % ds.num_samples
        m["samples"][0] = [i, np.asarray(ds.sample(i), dtype="<u2").tobytes(), ds.sample_proof(i)]
    refused(run, retamper(build(run, 2), edit), "is not the schedule's batch of step 2")


def test_dropped_sample(run):
    refused(run, retamper(build(run, 2), lambda m: m["samples"].pop()), "batch holds 3 samples")


def test_wrong_sample_tokens(run):
    def edit(m):
        tok = bytearray(m["samples"][1][1])
        tok[0] ^= 1
        m["samples"][1][1] = bytes(tok)
    refused(run, retamper(build(run, 2), edit), r"sample 1 \(index \d+\) is not in the dataset")


def test_forged_sample_proof(run):
    def edit(m):
        m["samples"][0][2] = [bytes(32)] * len(m["samples"][0][2])
    refused(run, retamper(build(run, 2), edit), r"sample 0 .*dataset proof fails")


def test_short_sample(run):
    def edit(m):
        m["samples"][0][1] = m["samples"][0][1][:-2]
    refused(run, retamper(build(run, 2), edit), "holds 32 bytes, not 17 uint16 tokens")


def test_pre_state_blob_mismatch(run):
    data = build(run, 2)
    op = load_opening(data)
    blob = bytearray(op.pre_state)
    blob[-1] ^= 1
    refused(
        run, retamper(data, pre_state=bytes(blob), fix_blob=False), "do not match the manifest's blob digest"
    )


def test_one_ulp_in_a_weight(run):
    st = dict(run.states[1].tensors)
    name = next(n for n in st if n.startswith("param/"))
    w = st[name].clone()
    flat = w.view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf")))
    st[name] = w
    data = retamper(build(run, 2), pre_state=state_bytes(TrainState(st)))
    refused(run, data, "pre-state digest .* != leaf 1's")


def test_truncated_safetensors(run):
    blob = state_bytes(run.states[1])
    refused(run, retamper(build(run, 2), pre_state=blob[: len(blob) // 2]), "not a readable safetensors file")
    refused(run, retamper(build(run, 2), pre_state=b"\x00" * 64), "not a readable safetensors file")


def test_pre_state_of_another_spec(run):
    st = dict(run.states[1].tensors)
    st.pop(next(n for n in st if n.startswith("opt/")))
    refused(run, retamper(build(run, 2), pre_state=state_bytes(TrainState(st))), "pre-state.*missing")


def test_initial_hash(run):
    refused(run, build(run, 1), "!= the run's initial hash", initial_hash=b"\x08" * 32)


def test_nan_in_the_committed_state(run):
    # A miner that committed a state holding NaN: the digests agree, the state is still refused.
    st = dict(run.states[1].tensors)
    name = next(n for n in st if n.startswith("param/"))
    w = st[name].clone()
    w.view(-1)[3] = float("nan")
    st[name] = w
    bad = TrainState(st)
    leaves = list(run.leaves)
    leaves[1] = step_leaf(1, bad.digest(), loss_bits(np.float32(4.0)))
    data = build(run, 2, pre_state=bad, leaves=leaves)
    refused(run, data, "param/.* holds 1 non-finite value", root=merkle.root(leaves))


def test_step_counter_mismatch(run):
    # The state after step 2 offered as the state before step 2.
    leaves = list(run.leaves)
    leaves[1] = step_leaf(1, run.states[2].digest(), 0)
    data = build(run, 2, pre_state=run.states[2], leaves=leaves)
    refused(run, data, "step counter is 2, step 2 needs 1", root=merkle.root(leaves))


# --- served leaves ----------------------------------------------------------------------------


def test_verify_leaves(run):
    root = merkle.root(run.leaves)
    got = verify_leaves(encode_leaves(run.leaves), root, len(run.leaves))
    assert [x.t for x in got] == list(range(len(run.leaves)))
    assert len(committed_losses(got)) == STEPS and all(x > 0 for x in committed_losses(got))
    # A prover ahead of the chain serves more leaves; the committed prefix is what counts.
    prefix = verify_leaves(run.leaves, merkle.root(run.leaves[:3]), 3)
    assert len(prefix) == 3


def test_verify_leaves_refusals(run):
    root = merkle.root(run.leaves)
    n = len(run.leaves)
    with pytest.raises(LeavesRefused, match="leaves were served, the committed tree has"):
        verify_leaves(run.leaves[:-1], root, n)
    forged = list(run.leaves)
    forged[2] = step_leaf(2, bytes(32), loss_bits(np.float32(0.5)))
    with pytest.raises(LeavesRefused, match="give root .* the committed root is"):
        verify_leaves(forged, root, n)
    out_of_order = list(run.leaves)
    out_of_order[1], out_of_order[2] = out_of_order[2], out_of_order[1]
    with pytest.raises(LeavesRefused, match="leaf 1 says step 2"):
        verify_leaves(out_of_order, root, n)
    with pytest.raises(LeavesRefused, match="not canonical CBOR"):
        decode_leaves(b"\xff")
    with pytest.raises(LeavesRefused, match="list of byte strings"):
        decode_leaves(cbor.encode([1, 2]))


def test_a_fine_tunes_initial_state_must_be_the_committed_pretrained_one():
    """Step 1 of a spec with [init]: the pre-state's parameters are those the spec's params digest
    names, its moments zero; anything else is refused (a miner cannot start from a finished model)."""
    import torch

    from challenges.opening import OpeningRefused, _check_pretrained
    from commitments.spec import Spec
    from oracle import importer
    from oracle.state import TrainState
    from oracle.step import init_state

    model = {"kind": "llama", "vocab_size": 32, "block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 8,
             "intermediate_size": 16}
    base = Spec.from_dict({"model": model, "batch": {"batch_size": 2, "seq_len": 8}})
    params = init_state(base).params()
    spec = Spec.from_dict(
        {**base.canonical(), "init": {"params_digest": importer.params_digest(params).hex()}}
    )
    state = init_state(spec, pretrained=params)
    _check_pretrained(state, spec)
    other = dict(state.tensors)
    other["param/norm.weight"] = other["param/norm.weight"] * 2
    with pytest.raises(OpeningRefused, match="not the spec's pretrained parameters"):
        _check_pretrained(TrainState(other), spec)
    moved = dict(state.tensors)
    moved["opt/exp_avg/norm.weight"] = torch.ones_like(moved["opt/exp_avg/norm.weight"])
    with pytest.raises(OpeningRefused, match="moment exp_avg/norm.weight is not zero"):
        _check_pretrained(TrainState(moved), spec)
