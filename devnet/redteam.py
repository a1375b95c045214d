"""The red team: train a fresh tiny run, forge its openings and trajectories in every way the
protocol must stop, and run each forgery through the verifier's real path (fetch -> load/validate
-> replay) against the facts a dev chain records. `pot redteam` prints the table.
"""

from __future__ import annotations

import gzip
import http.server
import json
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from challenges.opening import MAGIC, OpeningRefused, encode_opening, load_opening, state_bytes
from commitments import cbor, merkle
from commitments.hashing import digest, h

OUTCOMES = ("refused", "caught", "no-byte-change", "missed")
LABELS = {"refused": "refused before compute", "caught": "caught at the step",
          "no-byte-change": "passes: changes no byte", "missed": "MISSED"}
CHALLENGED = 3  # the step every edit attacks (its pre-state is neither leaf 0 nor the last)
STEPS = 6
SPEC = {"steps": STEPS, "model": {"kind": "mlp", "block_size": 16, "hidden": [32]},
        "batch": {"batch_size": 4, "seq_len": 16}, "rng": {"seed": 7, "schedule_seed": 11}}
CORPUS_BYTES = 200_000


class RedTeamError(RuntimeError):
    """The red team could not set up its run (corpus, chain, training), with the reason."""


@dataclass
class Attempt:
    """What one edit hands the verifier: the served bytes, the run whose chain facts apply, the step."""

    data: bytes
    run_id: bytes
    step: int = CHALLENGED
    gzip: bool = False  # served with Content-Encoding: gzip (a decompression bomb)
    changed: bool = True  # computed from the bytes: does this edit change any committed or served byte?


@dataclass
class EditResult:
    name: str
    kind: str
    outcome: str
    stage: str
    reason: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": self.outcome, "kind": self.kind, "stage": self.stage,
                "reason": self.reason}


@dataclass
class Report:
    edits: list[EditResult]
    honest_checked: int
    honest_flagged: list[tuple[int, str]] = field(default_factory=list)

    @property
    def missed(self) -> list[EditResult]:
        return [e for e in self.edits if e.outcome == "missed"]

    @property
    def ok(self) -> bool:
        return not self.missed and not self.honest_flagged

    def as_json(self) -> dict[str, Any]:
        return {"edits": [e.as_json() for e in self.edits], "honest_flagged": len(self.honest_flagged)}


# --- the prover the forgeries are served from -------------------------------------------------


class _Served(http.server.BaseHTTPRequestHandler):
    files: dict[str, tuple[bytes, bool]]

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        item = self.files.get(self.path)
        if item is None:
            self.send_error(404)
            return
        body, gz = item
        self.send_response(200)
        if gz:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the verifier hung up on an oversized body: that is the refusal under test

    def log_message(self, *args: Any) -> None:
        pass


class Prover:
    """A local HTTP server on 127.0.0.1 serving what the red team hands it."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, bool]] = {}
        handler = type("Handler", (_Served,), {"files": self.files})
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.http.server_address[1]}"

    def put(self, path: str, data: bytes, *, gz: bool = False) -> str:
        self.files[path] = (data, gz)
        return f"{self.endpoint}{path}"

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(5)


# --- the lab: a trained run on a dev chain, and forged runs beside it ---------------------------


class Lab:
    """One honest run trained by the real Trainer on a dev chain, plus helpers to forge from it."""

    def __init__(self, workdir: Path, *, log: Callable[[str], None]) -> None:
        from chain.dev import DevTransport
        from chain.protocol import ProtocolParams
        from commitments.dataset import Dataset, prepare_default_corpus
        from commitments.spec import Spec
        from miner.trainer import Trainer

        self.dir = workdir
        self.log = log
        self.spec = Spec.from_dict(SPEC)
        corpus = workdir / "corpus.npy"
        log(f"preparing the default corpus ({CORPUS_BYTES} bytes) in {corpus}")
        prepare_default_corpus(corpus, max_bytes=CORPUS_BYTES)
        self.dataset = Dataset.open(corpus, self.spec.sample_len, vocab_size=self.spec.model.vocab_size)
        # Every step of every run is challenged, the attacked one first.
        self.params = ProtocolParams(challenges_per_run=STEPS, challenge_delay=1, opening_deadline=50,
                                     commit_window=50, reveal_window=50, quorum_min_reveals=1,
                                     forced_challenge_steps=(CHALLENGED,))
        chain_path = workdir / "chain.db"
        self.chain = DevTransport(chain_path, "miner", sealing="instant")
        self.chain.record_params(self.params)
        self.prover = Prover()
        self.served = 0
        log(f"training the honest run ({STEPS} steps, tiny MLP) with the real trainer")
        self.honest = Trainer(self.spec, self.dataset, workdir / "honest", self.chain, endpoint=self.prover.endpoint,
                              keep_every=2, progress=False, log=log, params=self.params)
        self.honest.run(follow=False)
        log("training a second run whose step "
            f"{CHALLENGED} trains on a substituted batch (the trainer's fault injection)")
        self.substituted = Trainer(self.spec, self.dataset, workdir / "substituted", self.chain,
                                   endpoint=self.prover.endpoint, keep_every=2, progress=False, log=log,
                                   substitute_batch_at=CHALLENGED, params=self.params)
        self.substituted.run(follow=False)
        self.leaves = list(self.honest.store.leaves)
        self.states = [self.honest.store.state(t) for t in range(STEPS + 1)]
        self._opening_cache: dict[tuple[bytes, int], bytes] = {}
        self.forged = 0

    def close(self) -> None:
        self.prover.close()
        for tr in (self.honest, self.substituted):
            tr.close()
        self.chain.close()

    # --- chain facts --------------------------------------------------------------------------
    def view(self) -> Any:
        from chain.view import ChainView

        # Seal until every run's challenges are issued (instant chains only move on submit).
        view = ChainView(self.chain, self.params)
        view.sync()
        for _ in range(5):
            pending = [r for r in view.state.runs.values() if r.challenges_at is not None and not r.challenges]
            if not pending:
                break
            self.chain.seal()
            view.sync()
        return view

    def facts(self, view: Any, run_id: bytes, step: int, expected_digest: bytes) -> Any:
        """What the verifier reads from the chain for the challenge of `step` in `run_id`."""
        from chain import protocol as P
        from node.pipeline import ChainFacts

        reg = next(e for e in view.of(P.RunRegistered) if e.run_id == run_id)
        ch = next(e for e in view.of(P.ChallengeIssued) if e.run_id == run_id and e.step == step)
        return ChainFacts(expected_digest=expected_digest, run_id=run_id, step=step, spec_digest=reg.spec_digest,
                          dataset_hash=reg.dataset_hash, schedule_commitment=reg.schedule_commitment,
                          initial_hash=reg.initial_hash, root=ch.root, size=ch.size)

    # --- openings -----------------------------------------------------------------------------
    def opening(self, t: int = CHALLENGED, *, run: Any = None) -> bytes:
        """The honest opening of step t of a trained run (the trainer's own opening code)."""
        tr = run or self.honest
        key = (tr.run_id, t)
        if key not in self._opening_cache:
            self._opening_cache[key] = tr.opening_for(t, STEPS + 1)[1]
        return self._opening_cache[key]

    def rebuild(self, data: bytes, edit: Callable[[dict[str, Any]], None] | None = None,
                pre_state: bytes | None = None) -> bytes:
        """The opening with its manifest edited and/or pre-state replaced, blob digest kept consistent."""
        op = load_opening(data)
        m = dict(op.manifest)
        blob = op.pre_state if pre_state is None else pre_state
        m["pre_state_blob"], m["pre_state_len"] = h(blob), len(blob)
        if edit is not None:
            edit(m)
        return encode_opening(m, blob)

    def commit_trajectory(self, states_or_leaves: list[Any], *, initial_hash: bytes | None = None) -> bytes:
        """Register a forged run on chain with these leaves (a miner committing its own trajectory)."""
        from chain.calls import StartTrainingCommitment, SubmitCheckpointRoot

        leaves = list(states_or_leaves)
        if leaves == self.leaves:
            return self.honest.run_id  # identical bytes: the honest commitment itself
        self.forged += 1
        run_id = digest("pot/redteam/forged-run/v1", self.forged, merkle.root(leaves))
        from commitments.leaves import parse_step_leaf

        init = initial_hash if initial_hash is not None else parse_step_leaf(leaves[0]).state_digest
        self.chain.submit([StartTrainingCommitment(
            run_id, init, self.honest.schedule.commitment, self.dataset.dataset_hash, self.spec.to_cbor(),
            self.spec.steps, self.prover.endpoint)])
        self.chain.submit([SubmitCheckpointRoot(run_id, merkle.root(leaves), len(leaves), ())])
        return run_id

    def forged_opening(self, run_id: bytes, leaves: list[bytes], pre_state: Any, t: int = CHALLENGED) -> bytes:
        from challenges.opening import build_opening

        return build_opening(spec=self.spec, run_id=run_id, step=t, pre_state=pre_state, dataset=self.dataset,
                             schedule=self.honest.schedule, leaves=leaves)

    def continue_from(self, state: Any, t: int, loss_bits_t: int | None = None) -> list[bytes]:
        """Leaves 0..T of a trajectory that takes `state` as its state after step t and trains on.

        A forger commits whatever it likes; when the oracle cannot step from the forged state
        (a step counter out of place), the honest later leaves stand in.
        """
        from commitments.leaves import loss_bits, parse_step_leaf, step_leaf
        from oracle.step import StepError, step

        honest_t = parse_step_leaf(self.leaves[t])
        bits = honest_t.loss_bits if loss_bits_t is None else loss_bits_t
        leaves = self.leaves[:t] + [step_leaf(t, state.digest(), bits)]
        cur = state
        for u in range(t + 1, STEPS + 1):
            try:
                cur, loss = step(cur, self.dataset.batch(self.honest.schedule.batch(u)), self.spec, u)
                leaves.append(step_leaf(u, cur.digest(), loss_bits(loss)))
            except StepError:
                leaves += self.leaves[len(leaves):]
                break
        return leaves


# --- state surgery ------------------------------------------------------------------------------


def _with_tensor(state: Any, name: str, fn: Callable[[Any], Any]) -> Any:
    from oracle.state import TrainState

    tensors = dict(state.tensors)
    tensors[name] = fn(tensors[name].clone())
    return TrainState(tensors)


def _first_param(state: Any) -> str:
    return next(k for k in state.tensors if k.startswith("param/") and state.tensors[k].numel() > 1)


def ulp_up(state: Any, name: str | None = None, index: int = 0) -> Any:
    """One weight moved by one unit in the last place (its next float32 upwards)."""
    import torch

    name = name or _first_param(state)

    def bump(t: Any) -> Any:
        flat = t.view(-1)
        flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf"), dtype=flat.dtype))
        return t

    return _with_tensor(state, name, bump)


def swap_moments(state: Any) -> Any:
    """The AdamW first and second moments of one parameter exchanged."""
    from oracle.state import TrainState

    p = _first_param(state)[len("param/"):]
    a, b = f"opt/exp_avg/{p}", f"opt/exp_avg_sq/{p}"
    tensors = dict(state.tensors)
    tensors[a], tensors[b] = state.tensors[b].clone(), state.tensors[a].clone()
    return TrainState(tensors)


def with_step_counter(state: Any, value: int) -> Any:
    import torch

    return _with_tensor(state, "step", lambda t: torch.tensor(value, dtype=torch.int64))


def with_nan(state: Any) -> Any:
    def poison(t: Any) -> Any:
        t.view(-1)[0] = float("nan")
        return t

    return _with_tensor(state, _first_param(state), poison)


def times_one(state: Any) -> Any:
    """One weight multiplied by 1.0: an edit that changes no byte."""
    import torch

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
    from commitments.spec import Spec

    d = lab.spec.canonical()
    d["optimizer"]["lr"] = d["optimizer"]["lr"] * 2
    spec = Spec.from_dict(d).to_cbor()
    return _opening_edit(lab, lab.rebuild(lab.opening(), lambda m: m.__setitem__("spec", spec)))


@edit("spec-batch-size-changed", "a changed spec field")
def _spec_batch(lab: Lab) -> Attempt:
    from commitments.spec import Spec

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
    from commitments.spec import Spec

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
    import numpy as np

    from commitments.dataset import Dataset

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
    from commitments.schedule import derive_schedule

    other = derive_schedule(lab.spec.rng.schedule_seed + 1, lab.honest.schedule.num_samples, STEPS,
                            lab.spec.batch.batch_size)

    def change(m: dict[str, Any]) -> None:
        m["samples"] = [[int(i), lab.dataset.sample(int(i)).astype("<u2").tobytes(), lab.dataset.sample_proof(int(i))]
                        for i in other.batch(CHALLENGED)]
        m["schedule_proof"] = other.proof(CHALLENGED)
        m["schedule_commitment"] = other.commitment

    return _opening_edit(lab, lab.rebuild(lab.opening(), change))


@edit("pre-state-weight-one-ulp", "one ulp changed in one weight")
def _pre_ulp(lab: Lab) -> Attempt:
    return _opening_edit(lab, lab.rebuild(lab.opening(), pre_state=state_bytes(ulp_up(lab.states[CHALLENGED - 1]))))


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
    return _opening_edit(lab, lab.rebuild(lab.opening(), pre_state=state_bytes(swap_moments(lab.states[CHALLENGED - 1]))))


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
    from commitments.leaves import parse_step_leaf, step_leaf

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
    from commitments.leaves import parse_step_leaf

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
    header = json.dumps({"param/x": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 1 << 42]}})
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
    return _opening_edit(lab, lab.rebuild(lab.opening(), pre_state=state_bytes(with_nan(lab.states[CHALLENGED - 1]))))


@edit("committed-nan-pre-state", "an opening with NaNs")
def _committed_nan(lab: Lab) -> Attempt:
    # The forger commits a NaN state as leaf t-1 so the pre-state digest matches.
    from commitments.leaves import loss_bits, parse_step_leaf, step_leaf
    from oracle.step import StepError, step

    pre = with_nan(lab.states[CHALLENGED - 1])
    prev = parse_step_leaf(lab.leaves[CHALLENGED - 1])
    leaves = lab.leaves[:CHALLENGED - 1] + [step_leaf(CHALLENGED - 1, pre.digest(), prev.loss_bits)]
    try:
        after, loss = step(pre, lab.dataset.batch(lab.honest.schedule.batch(CHALLENGED)), lab.spec, CHALLENGED)
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


# --- the verifier's path ------------------------------------------------------------------------


def verify(lab: Lab, view: Any, attempt: Attempt, tag: str) -> tuple[str, str, str]:
    """(refused | caught | passed, stage, reason): fetch -> load/validate -> replay, as the node does."""
    from node.fetch import FetchPolicy
    from node.pipeline import replay_file, stage_fetch, stage_validate

    cap = max_opening_bytes(lab)
    try:
        expected = load_opening(attempt.data, max_bytes=cap).digest
    except OpeningRefused:
        expected = h(attempt.data)  # the miner posts some digest; the file is refused before it matters
    facts = lab.facts(view, attempt.run_id, attempt.step, expected)
    served = attempt.data
    uri = lab.prover.put(f"/openings/{tag}", served, gz=attempt.gzip)
    dest = lab.dir / "verifier" / f"{tag}.opening"
    policy = FetchPolicy(connect_timeout_s=5, read_timeout_s=10, total_timeout_s=30, attempts=2, backoff_base_s=0.05,
                         backoff_max_s=0.2)
    fetched = stage_fetch(uri=uri, endpoint=lab.prover.endpoint, run_id=attempt.run_id, dest=dest,
                          leaves_dest=dest.with_suffix(".leaves"), max_opening_bytes=cap,
                          max_leaves_bytes=1 << 20, policy=policy)
    if not fetched.ok:
        return "refused", "fetch", f"[{fetched.refusal_class}] {fetched.reason}"
    validated = stage_validate(dest, facts, max_bytes=cap)
    if not validated.ok:
        return "refused", "validate", f"[{validated.refusal_class}] {validated.reason}"
    msg = replay_file(str(dest), facts.kwargs(), cap)
    if msg["result"] is None:
        return "caught", "replay", msg["reason"] or "the step could not be replayed"
    if not msg["matches"]:
        return "caught", "replay", msg["reason"]
    return "passed", "replay", "the replayed leaf equals the committed leaf"


def run_redteam(workdir: Path, *, log: Callable[[str], None] = lambda s: None,
                only: list[str] | None = None) -> Report:
    """Set up the lab, apply every edit (or those named in `only`), verify each, then the honest steps."""
    import torch

    known = [name for name, _, _ in EDITS]
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise RedTeamError(f"unknown edit(s) {', '.join(unknown)}; known: {', '.join(known)}")
    from chain.transport import TransportError
    from commitments.errors import CommitmentError
    from miner.trainer import TrainerError

    torch.set_num_threads(1)  # the verifier's replay workers run one thread each
    try:
        lab = Lab(workdir, log=log)
    except (CommitmentError, TrainerError, TransportError, OSError) as exc:
        raise RedTeamError(f"cannot set up the run under {workdir}: {exc}") from None
    try:
        attempts: list[tuple[str, str, Attempt]] = []
        for name, kind, make in EDITS:
            if only and name not in only:
                continue
            attempts.append((name, kind, make(lab)))
        view = lab.view()
        results = []
        for name, kind, attempt in attempts:
            outcome, stage, reason = verify(lab, view, attempt, name)
            if outcome == "passed":
                outcome = "missed" if attempt.changed else "no-byte-change"
            elif not attempt.changed:
                # An edit that changes nothing yet fails would flag an honest opening.
                outcome = "missed"
                reason = f"an unchanged opening was flagged: {reason}"
            results.append(EditResult(name, kind, outcome, stage, reason))
            log(f"{name}: {outcome} at {stage}: {reason[:120]}")
        flagged = []
        for t in range(1, STEPS + 1):
            data = lab.opening(t)
            outcome, stage, reason = verify(lab, view, Attempt(data, lab.honest.run_id, step=t, changed=False),
                                            f"honest-{t}")
            if outcome != "passed":
                flagged.append((t, f"{stage}: {reason}"))
        return Report(results, STEPS, flagged)
    finally:
        lab.close()


def format_table(report: Report) -> str:
    w = max(len(e.name) for e in report.edits)
    k = max(len(e.kind) for e in report.edits)
    lines = [f"{'edit':<{w}}  {'kind':<{k}}  {'outcome':<24}  reason", "-" * (w + k + 60)]
    for e in report.edits:
        lines.append(f"{e.name:<{w}}  {e.kind:<{k}}  {LABELS[e.outcome]:<24}  {e.reason[:110]}")
    counts = {o: sum(e.outcome == o for e in report.edits) for o in OUTCOMES}
    lines.append("")
    lines.append(f"{len(report.edits)} edits: " + ", ".join(f"{counts[o]} {LABELS[o]}" for o in OUTCOMES))
    flagged = ", ".join(f"step {t} ({why[:80]})" for t, why in report.honest_flagged) or "none"
    lines.append(f"honest steps checked: {report.honest_checked}; flagged: {flagged}")
    return "\n".join(lines)


app = typer.Typer(no_args_is_help=False, add_completion=False)


@app.callback(invoke_without_command=True)
def redteam(json_out: bool = typer.Option(False, "--json", help="Print the result as JSON (last line)."),
            workdir: Path | None = typer.Option(None, "--workdir", help="Keep the run and chain here (default: a "
                                                "temporary directory, removed afterwards)."),
            only: list[str] = typer.Option([], "--only", help="Apply only this edit (repeatable)."),
            verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress to stderr.")) -> None:
    """Train a fresh tiny run, forge it in every way the protocol must stop, and check each forgery
    through the verifier's real path. Exits 1 if an edit that changes bytes passes or an honest
    step is flagged."""
    def log(msg: str) -> None:
        if verbose:
            print(f"[redteam {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
            report = run_redteam(workdir, log=log, only=only)
        else:
            with tempfile.TemporaryDirectory(prefix="pot-redteam-") as tmp:
                report = run_redteam(Path(tmp), log=log, only=only)
    except RedTeamError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(format_table(report), err=True)
        typer.echo(json.dumps(report.as_json(), sort_keys=True))
    else:
        typer.echo(format_table(report))
    raise typer.Exit(0 if report.ok else 1)


__all__ = ["EDITS", "OUTCOMES", "Report", "app", "run_redteam", "verify"]
