"""The red team's forgeries: surgery on training states (one ulp, swapped moments, a step counter,
a NaN) and the registry of edits, each turning the lab's honest run into one Attempt the verifier
must refuse, catch, or pass because it changes no byte."""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from challenges.opening import MAGIC, encode_opening, load_opening, state_bytes
from commitments import cbor, merkle
from commitments.dataset import Dataset
from commitments.leaves import loss_bits, parse_step_leaf, step_leaf
from commitments.schedule import derive_schedule
from commitments.spec import Spec
from devnet.lab import CHALLENGED, SPEC, STEPS, Lab
from oracle.state import TrainState
from oracle.step import StepError, step


@dataclass
class Attempt:
    """What one edit hands the verifier: the served bytes, the run whose chain facts apply, the step."""

    data: bytes
    run_id: bytes
    step: int = CHALLENGED
    gzip: bool = False  # served with Content-Encoding: gzip (a decompression bomb)
    changed: bool = True  # computed from the bytes: does this edit change any committed or served byte?


# --- state surgery ------------------------------------------------------------------------------


def _with_tensor(state: Any, name: str, fn: Callable[[Any], Any]) -> Any:
    tensors = dict(state.tensors)
    tensors[name] = fn(tensors[name].clone())
    return TrainState(tensors)


def _first_param(state: Any) -> str:
    return next(k for k in state.tensors if k.startswith("param/") and state.tensors[k].numel() > 1)


def ulp_up(state: Any, name: str | None = None, index: int = 0) -> Any:
    """One weight moved by one unit in the last place (its next float32 upwards)."""
    name = name or _first_param(state)

    def bump(t: Any) -> Any:
        flat = t.view(-1)
        flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf"), dtype=flat.dtype))
        return t

    return _with_tensor(state, name, bump)


def swap_moments(state: Any) -> Any:
    """The AdamW first and second moments of one parameter exchanged."""
    p = _first_param(state)[len("param/"):]
    a, b = f"opt/exp_avg/{p}", f"opt/exp_avg_sq/{p}"
    tensors = dict(state.tensors)
    tensors[a], tensors[b] = state.tensors[b].clone(), state.tensors[a].clone()
    return TrainState(tensors)


def with_step_counter(state: Any, value: int) -> Any:
    return _with_tensor(state, "step", lambda t: torch.tensor(value, dtype=torch.int64))


def with_nan(state: Any) -> Any:
    def poison(t: Any) -> Any:
        t.view(-1)[0] = float("nan")
        return t

    return _with_tensor(state, _first_param(state), poison)


def times_one(state: Any) -> Any:
    """One weight multiplied by 1.0: an edit that changes no byte."""
    return _with_tensor(state, _first_param(state), lambda t: t * torch.ones((), dtype=t.dtype))


# --- the edits ----------------------------------------------------------------------------------

EDITS: list[tuple[str, str, Callable[[Lab], Attempt]]] = []


def edit(name: str, kind: str):
    def register(fn: Callable[[Lab], Attempt]) -> Callable[[Lab], Attempt]:
        EDITS.append((name, kind, fn))
        return fn
    return register


def _opening_edit(lab: Lab, data: bytes) -> Attempt:
    return Attempt(data, lab.honest.run_id, changed=data != lab.opening())


@edit("spec-lr-changed", "a changed spec field")
def _spec_lr(lab: Lab) -> Attempt:
    d = lab.spec.canonical()
    d["optimizer"]["lr"] = d["optimizer"]["lr"] * 2
    spec = Spec.from_dict(d).to_cbor()
    return _opening_edit(lab, lab.rebuild(lab.opening(), lambda m: m.__setitem__("spec", spec)))


@edit("spec-batch-size-changed", "a changed spec field")
def _spec_batch(lab: Lab) -> Attempt:
    d = lab.spec.canonical()
    d["batch"]["batch_size"] = 3
    spec = Spec.from_dict(d).to_cbor()

    def change(m: dict[str, Any]) -> None:
        m["spec"] = spec
        m["samples"] = m["samples"][:3]

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("spec-default-restated", "a changed spec field")
def _spec_default(lab: Lab) -> Attempt:
    # eps written out at its default value: the canonical spec, hence every byte, is the same.
    d = dict(SPEC, optimizer={"eps": 1e-8, "kind": "adamw"})
    spec = Spec.from_dict(d).to_cbor()
    return _opening_edit(lab, lab.rebuild(lab.opening(), lambda m: m.__setitem__("spec", spec)))


@edit("dataset-byte-changed", "a changed dataset byte")
def _dataset_byte(lab: Lab) -> Attempt:
    def change(m: dict[str, Any]) -> None:
        samples = [list(s) for s in m["samples"]]
        tok = bytearray(samples[1][1])
        tok[0] ^= 0x01
        samples[1][1] = bytes(tok)
        m["samples"] = samples

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("dataset-byte-changed-rehashed", "a changed dataset byte")
def _dataset_rehashed(lab: Lab) -> Attempt:
    # The forger rebuilds the whole dataset tree around the changed byte: proofs verify, the root moves.
    tokens = np.array(lab.dataset.tokens, copy=True)
    tokens[lab.honest.schedule.batch(CHALLENGED)[0] * lab.spec.sample_len] ^= 1
    forged = Dataset(tokens, lab.spec.sample_len)

    def change(m: dict[str, Any]) -> None:
        m["samples"] = [[int(i), forged.sample(int(i)).astype("<u2").tobytes(), forged.sample_proof(int(i))]
                        for i, _, _ in m["samples"]]
        m["dataset_hash"] = forged.dataset_hash

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("batch-index-changed", "a changed batch index")
def _batch_index(lab: Lab) -> Attempt:
    def change(m: dict[str, Any]) -> None:
        samples = [list(s) for s in m["samples"]]
        i = (samples[0][0] + 1) % lab.dataset.num_samples
        samples[0] = [i, lab.dataset.sample(i).astype("<u2").tobytes(), lab.dataset.sample_proof(i)]
        m["samples"] = samples

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("schedule-reseeded", "a changed schedule")
def _schedule(lab: Lab) -> Attempt:
    other = derive_schedule(lab.spec.rng.schedule_seed + 1, lab.honest.schedule.num_samples, STEPS,
                            lab.spec.batch.batch_size)

    def change(m: dict[str, Any]) -> None:
        m["samples"] = [
            [int(i), lab.dataset.sample(int(i)).astype("<u2").tobytes(), lab.dataset.sample_proof(int(i))]
            for i in other.batch(CHALLENGED)
        ]
        m["schedule_proof"] = other.proof(CHALLENGED)
        m["schedule_commitment"] = other.commitment

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("pre-state-weight-one-ulp", "one ulp changed in one weight")
def _pre_ulp(lab: Lab) -> Attempt:
    return _opening_edit(
        lab, lab.rebuild(lab.opening(), pre_state=state_bytes(ulp_up(lab.states[CHALLENGED - 1])))
    )


@edit("committed-weight-one-ulp", "one ulp changed in one weight")
def _committed_ulp(lab: Lab) -> Attempt:
    leaves = lab.continue_from(ulp_up(lab.states[CHALLENGED]), CHALLENGED)
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1]), run_id,
                   changed=leaves != lab.leaves)


@edit("committed-weight-times-one", "one ulp changed in one weight")
def _committed_noop(lab: Lab) -> Attempt:
    leaves = lab.continue_from(times_one(lab.states[CHALLENGED]), CHALLENGED)
    run_id = lab.commit_trajectory(leaves)
    data = lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1])
    return Attempt(data, run_id, changed=leaves != lab.leaves or data != lab.opening())


@edit("pre-state-moments-swapped", "a swapped optimizer moment")
def _pre_moments(lab: Lab) -> Attempt:
    return _opening_edit(
        lab, lab.rebuild(lab.opening(), pre_state=state_bytes(swap_moments(lab.states[CHALLENGED - 1])))
    )


@edit("committed-moments-swapped", "a swapped optimizer moment")
def _committed_moments(lab: Lab) -> Attempt:
    leaves = lab.continue_from(swap_moments(lab.states[CHALLENGED]), CHALLENGED)
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1]), run_id,
                   changed=leaves != lab.leaves)


@edit("pre-state-step-counter", "a changed step counter")
def _pre_counter(lab: Lab) -> Attempt:
    pre = with_step_counter(lab.states[CHALLENGED - 1], CHALLENGED)
    return _opening_edit(lab, lab.rebuild(lab.opening(), pre_state=state_bytes(pre)))


@edit("committed-step-counter", "a changed step counter")
def _committed_counter(lab: Lab) -> Attempt:
    leaves = lab.continue_from(with_step_counter(lab.states[CHALLENGED], CHALLENGED + 1), CHALLENGED)
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1]), run_id,
                   changed=leaves != lab.leaves)


@edit("opening-loss-bits", "changed loss bits")
def _opening_loss(lab: Lab) -> Attempt:
    # Leaf t with other loss bits, proven under a tree that holds it (not the tree on chain).
    leaf = parse_step_leaf(lab.leaves[CHALLENGED])
    leaves = list(lab.leaves)
    leaves[CHALLENGED] = step_leaf(CHALLENGED, leaf.state_digest, leaf.loss_bits ^ 1)
    tree = merkle.MerkleTree.from_leaves(leaves)

    def change(m: dict[str, Any]) -> None:
        m["leaf"] = leaves[CHALLENGED]
        m["leaf_proof"] = tree.inclusion_proof(CHALLENGED)

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("committed-loss-bits", "changed loss bits")
def _committed_loss(lab: Lab) -> Attempt:
    bits = parse_step_leaf(lab.leaves[CHALLENGED]).loss_bits ^ 1
    leaves = lab.continue_from(lab.states[CHALLENGED], CHALLENGED, loss_bits_t=bits)
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1]), run_id,
                   changed=leaves != lab.leaves)


@edit("forged-leaf-proof", "a forged inclusion proof")
def _forged_proof(lab: Lab) -> Attempt:
    def change(m: dict[str, Any]) -> None:
        proof = list(m["leaf_proof"])
        proof[0] = bytes([proof[0][0] ^ 0x80]) + proof[0][1:]
        m["leaf_proof"] = proof

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("forged-sample-proof", "a forged inclusion proof")
def _forged_sample_proof(lab: Lab) -> Attempt:
    def change(m: dict[str, Any]) -> None:
        samples = [list(s) for s in m["samples"]]
        samples[2][2] = list(reversed(samples[2][2]))
        m["samples"] = samples

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("opening-of-another-step", "an opening from another run or another step")
def _other_step(lab: Lab) -> Attempt:
    return _opening_edit(lab, lab.opening(CHALLENGED + 1))


@edit("opening-of-another-run", "an opening from another run or another step")
def _other_run(lab: Lab) -> Attempt:
    return _opening_edit(lab, lab.opening(CHALLENGED, run=lab.substituted))


@edit("substituted-batch-trajectory", "a substituted trajectory with its own consistent hashes")
def _substituted_batch(lab: Lab) -> Attempt:
    # The trainer's own fault injection: step t trained on another batch, every hash consistent.
    data = lab.opening(CHALLENGED, run=lab.substituted)
    return Attempt(data, lab.substituted.run_id, changed=list(lab.substituted.store.leaves) != lab.leaves)


@edit("substituted-finished-model", "a substituted trajectory with its own consistent hashes")
def _substituted_model(lab: Lab) -> Attempt:
    # A finished model dropped in at step t (its counter set to t), hashes recomputed from there on.
    final = with_step_counter(lab.states[STEPS], CHALLENGED)
    leaves = lab.continue_from(final, CHALLENGED)
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1]), run_id,
                   changed=leaves != lab.leaves)


@edit("truncated-safetensors", "a truncated safetensors file")
def _truncated_state(lab: Lab) -> Attempt:
    blob = load_opening(lab.opening()).pre_state
    return _opening_edit(lab, lab.rebuild(lab.opening(), pre_state=blob[: len(blob) // 2]))


@edit("truncated-opening-file", "a truncated safetensors file")
def _truncated_file(lab: Lab) -> Attempt:
    data = lab.opening()
    return _opening_edit(lab, data[: len(data) - 1000])


@edit("oversized-opening", "an oversized or zip-bomb payload")
def _oversized(lab: Lab) -> Attempt:
    data = lab.opening()
    return _opening_edit(lab, data + b"\0" * (max_opening_bytes(lab) + 1 - len(data)))


@edit("gzip-bomb", "an oversized or zip-bomb payload")
def _gzip_bomb(lab: Lab) -> Attempt:
    # A few hundred kilobytes on the wire that inflate to 64 times the cap.
    bomb = gzip.compress(MAGIC + b"\0" * (64 * max_opening_bytes(lab)), compresslevel=9)
    return Attempt(bomb, lab.honest.run_id, gzip=True)


@edit("manifest-length-bomb", "an oversized or zip-bomb payload")
def _length_bomb(lab: Lab) -> Attempt:
    data = lab.opening()
    return _opening_edit(lab, MAGIC + struct.pack(">I", 0xFFFFFFFF) + data[len(MAGIC) + 4:])


@edit("safetensors-header-bomb", "an oversized or zip-bomb payload")
def _header_bomb(lab: Lab) -> Attempt:
    # A safetensors header that claims 2^40 float32 values backed by a few bytes.
    header = json.dumps(
        {"param/x": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 1 << 42]}}
    )
    raw = header.encode()
    blob = struct.pack("<Q", len(raw)) + raw + b"\0" * 64
    return _opening_edit(lab, lab.rebuild(lab.opening(), pre_state=blob))


@edit("malformed-cbor-manifest", "a malformed CBOR manifest")
def _malformed_cbor(lab: Lab) -> Attempt:
    data = lab.opening()
    (mlen,) = struct.unpack(">I", data[len(MAGIC):len(MAGIC) + 4])
    mb = bytearray(data[len(MAGIC) + 4:len(MAGIC) + 4 + mlen])
    mb[0] = 0xBF  # an indefinite-length map: valid CBOR, never canonical
    mb += b"\xff"
    return _opening_edit(lab, MAGIC + struct.pack(">I", len(mb)) + bytes(mb) + data[len(MAGIC) + 4 + mlen:])


@edit("manifest-wrong-types", "a malformed CBOR manifest")
def _wrong_types(lab: Lab) -> Attempt:
    op = load_opening(lab.opening())
    m = dict(op.manifest)
    m["step"] = -1
    m["leaf_proof"] = "not a proof"
    return _opening_edit(lab, MAGIC + struct.pack(">I", len(cbor.encode(m))) + cbor.encode(m) + op.pre_state)


@edit("manifest-reencoded", "a malformed CBOR manifest")
def _reencoded(lab: Lab) -> Attempt:
    # Decode and encode the manifest again: canonical CBOR gives the same bytes.
    op = load_opening(lab.opening())
    return _opening_edit(lab, encode_opening(cbor.decode(op.manifest_bytes), op.pre_state))


@edit("pre-state-nan", "an opening with NaNs")
def _pre_nan(lab: Lab) -> Attempt:
    return _opening_edit(
        lab, lab.rebuild(lab.opening(), pre_state=state_bytes(with_nan(lab.states[CHALLENGED - 1])))
    )


@edit("committed-nan-pre-state", "an opening with NaNs")
def _committed_nan(lab: Lab) -> Attempt:
    # The forger commits a NaN state as leaf t-1 so the pre-state digest matches.
    pre = with_nan(lab.states[CHALLENGED - 1])
    prev = parse_step_leaf(lab.leaves[CHALLENGED - 1])
    leaves = lab.leaves[:CHALLENGED - 1] + [step_leaf(CHALLENGED - 1, pre.digest(), prev.loss_bits)]
    try:
        after, loss = step(
            pre, lab.dataset.batch(lab.honest.schedule.batch(CHALLENGED)), lab.spec, CHALLENGED
        )
        leaves += lab.continue_from(after, CHALLENGED, loss_bits(loss))[CHALLENGED:]
    except StepError:
        leaves += lab.leaves[CHALLENGED:]
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, pre), run_id, changed=leaves != lab.leaves)


@edit("nan-loss-bits", "an opening with NaNs")
def _nan_loss(lab: Lab) -> Attempt:
    leaves = lab.continue_from(lab.states[CHALLENGED], CHALLENGED, loss_bits_t=0x7FC00000)
    run_id = lab.commit_trajectory(leaves)
    return Attempt(lab.forged_opening(run_id, leaves, lab.states[CHALLENGED - 1]), run_id,
                   changed=leaves != lab.leaves)


def max_opening_bytes(lab: Lab) -> int:
    """The red team's fetch cap: an operator budget of eight honest openings (at least 1 MiB)."""
    return max(1 << 20, 8 * len(lab.opening()))
