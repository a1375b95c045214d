"""Replay a validated opening's step on the CPU oracle and compare with the committed leaf t.

`replay` gives the verifier's witness value (BLAKE3 of the recomputed leaf) and norm bucket, and,
for a challenge id, the witness pair's proof half (challenges.witness.state_proof of the
post-state); `verify_opening_file` is the offline check behind `pot verify opening`: load,
validate, replay.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from challenges.opening import (
    DEFAULT_MAX_BYTES,
    OpeningRefused,
    ValidatedOpening,
    load_opening,
    validate_opening,
)
from commitments.leaves import loss_bits as _loss_bits
from commitments.leaves import parse_step_leaf, step_leaf, witness_value_hash


class ReplayError(ValueError):
    """A step the oracle could not run on a validated opening, with the reason."""


@dataclass(frozen=True)
class ReplayResult:
    step: int
    state_digest: bytes
    loss_bits: int
    leaf: bytes  # the recomputed leaf t
    value_hash: bytes  # witness_value_hash(leaf): what an exact-profile verifier reveals
    norm_bucket: int
    matches_leaf: bool  # the recomputed leaf equals the committed leaf t byte for byte
    state: Any = field(default=None, repr=False, compare=False)  # the state after step t
    # state_proof(challenge_id, post-state items): the pair's proof half; None without a challenge id
    proof_hash: bytes | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "state_digest": self.state_digest.hex(),
            "loss_bits": f"0x{self.loss_bits:08x}",
            "leaf": self.leaf.hex(),
            "value_hash": self.value_hash.hex(),
            "norm_bucket": self.norm_bucket,
            "matches_leaf": self.matches_leaf,
            "proof_hash": None if self.proof_hash is None else self.proof_hash.hex(),
        }


def replay(validated: ValidatedOpening, *, device: Any = None,
           micro_batches: int | None = None, challenge_id: bytes | None = None) -> ReplayResult:
    """Run step t of a validated opening with the oracle and build the recomputed leaf t; with
    `challenge_id` (32 bytes), also the proof hash of the post-state for that challenge."""
    import torch

    from oracle.norm_bucket import norm_bucket
    from oracle.state import StateError
    from oracle.step import StepError, step

    if not isinstance(validated, ValidatedOpening):
        raise ReplayError(f"replay needs a ValidatedOpening, got {type(validated).__name__}")
    if challenge_id is not None and (
        not isinstance(challenge_id, (bytes, bytearray)) or len(challenge_id) != 32
    ):
        raise ReplayError("challenge_id must be 32 bytes")
    t = validated.step
    before = validated.state if device is None else validated.state.to(torch.device(device))
    try:
        after, loss = step(before, validated.batch, validated.spec, t, micro_batches=micro_batches)
    except (StepError, StateError) as exc:
        raise ReplayError(f"step {t} cannot be replayed: {exc}") from None
    sd = after.digest()
    bits = _loss_bits(loss.cpu())
    leaf = step_leaf(t, sd, bits)
    proof = None
    if challenge_id is not None:
        from challenges.witness import state_proof

        proof = state_proof(bytes(challenge_id), after.items())
    return ReplayResult(
        step=t,
        state_digest=sd,
        loss_bits=bits,
        leaf=leaf,
        value_hash=witness_value_hash(leaf),
        norm_bucket=norm_bucket(before, after),
        matches_leaf=leaf == validated.leaf_bytes,
        state=after,
        proof_hash=proof,
    )


def mismatch_reason(result: ReplayResult, committed_leaf: bytes) -> str:
    """Why a recomputed leaf differs from the committed one ("" when equal)."""
    if result.leaf == committed_leaf:
        return ""
    committed = parse_step_leaf(committed_leaf)
    parts = []
    if committed.state_digest != result.state_digest:
        parts.append(f"state digest {result.state_digest.hex()[:16]} != committed "
                     f"{committed.state_digest.hex()[:16]}")
    if committed.loss_bits != result.loss_bits:
        parts.append(f"loss bits 0x{result.loss_bits:08x} != committed 0x{committed.loss_bits:08x}")
    return f"replayed leaf {result.step} differs: " + "; ".join(parts or ["leaf bytes differ"])


def verify_opening_file(path: str | os.PathLike[str] | bytes, *, expected_digest: bytes | None = None,
                        run_id: bytes | None = None, step: int | None = None,
                        spec_digest: bytes | None = None, dataset_hash: bytes | None = None,
                        schedule_commitment: bytes | None = None, initial_hash: bytes | None = None,
                        root: bytes | None = None, size: int | None = None,
                        max_bytes: int = DEFAULT_MAX_BYTES, device: Any = None,
                        challenge_id: bytes | None = None,
                        ) -> tuple[bool, str, ReplayResult | None]:
    """Load, validate and replay one opening: (ok, reason, result). With `challenge_id` the
    result carries the witness pair's proof hash for that challenge.

    Chain facts that are not given are taken from the opening itself, so such a check shows
    only that the opening is self-consistent and that its step replays to its committed leaf.
    `result` is None when the opening was refused before replay.
    """
    try:
        opening = load_opening(path, max_bytes=max_bytes)
        m = opening.manifest
        from commitments.leaves import LeafError
        from commitments.spec import Spec, SpecError

        spec_from_opening = None
        if spec_digest is None:
            try:
                spec_from_opening = Spec.from_cbor(m["spec"]).digest()
            except SpecError as exc:
                raise OpeningRefused(f"the opening's spec is not usable: {exc}") from None
        if initial_hash is None and m["step"] == 1:
            try:
                initial_hash = parse_step_leaf(m["leaf_prev"]).state_digest
            except LeafError as exc:
                raise OpeningRefused(f"leaf 0 is not a step leaf: {exc}") from None
        validated = validate_opening(
            opening,
            expected_digest=opening.digest if expected_digest is None else expected_digest,
            run_id=m["run_id"] if run_id is None else run_id,
            step=m["step"] if step is None else step,
            spec_digest=spec_from_opening if spec_digest is None else spec_digest,
            dataset_hash=m["dataset_hash"] if dataset_hash is None else dataset_hash,
            schedule_commitment=m["schedule_commitment"]
            if schedule_commitment is None
            else schedule_commitment,
            initial_hash=initial_hash if initial_hash is not None else b"\x00" * 32,
            root=m["root"] if root is None else root,
            size=m["size"] if size is None else size,
        )
    except OpeningRefused as exc:
        return False, exc.reason, None
    try:
        result = replay(validated, device=device, challenge_id=challenge_id)
    except ReplayError as exc:
        return False, str(exc), None
    reason = mismatch_reason(result, validated.leaf_bytes)
    return result.matches_leaf, reason, result


__all__ = ["ReplayError", "ReplayResult", "mismatch_reason", "replay", "verify_opening_file"]
