"""What replaying one step of a spec costs a verifier, in the protocol's own integer arithmetic.

The protocol sizes a run's commit window from this estimate, and refuses at registration a spec
whose replay could not fit in `max_replay_blocks` (docs/protocol.md, "Window sizing"). The figures
are estimates, not measurements, and deliberately simple, so that every node computes the same
numbers from the spec alone with no floating point:

* parameters `P`, from the model's shape (embeddings, attention, MLP, norms, head);
* FLOPs of one training step: `6 * P_matmul * tokens` (forward and backward of every matrix
  product) plus `12 * layers * batch * seq_len^2 * width` for attention's score and value
  products (forward and backward), where `tokens = batch_size * seq_len`;
* bytes a verifier moves and hashes: the opening's pre-state (parameters and two AdamW moments,
  `3 * P` values of 4 bytes) and the batch (`batch_size * (seq_len + 1)` tokens of 4 bytes), plus
  hashing the post-state and its keyed proof (`2 * 3 * P * 4`);
* seconds = FLOPs / reference_flops + bytes / reference_bytes_per_s, and
  blocks = ceil(replay_margin * seconds / block_seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from chain.protocol.params import MAX_COMMITTEE


@dataclass(frozen=True)
class ReplayCost:
    params: int
    flops: int
    bytes: int
    seconds: Fraction
    blocks: int

    def as_json(self) -> dict[str, Any]:
        return {"params": self.params, "flops": self.flops, "bytes": self.bytes,
                "seconds": float(self.seconds), "blocks": self.blocks}


def _model_params(m: Any) -> tuple[int, int]:
    """(all parameters, parameters inside matrix products) of a spec's model."""
    v, d, layers = m.vocab_size, m.n_embd, m.n_layer
    if m.kind == "mlp":
        widths = [d, *m.hidden, v]
        matmul = sum(a * b for a, b in zip(widths, widths[1:], strict=False))
        biases = sum(widths[1:]) if m.bias else 0
        return v * d + matmul + biases, matmul
    if m.kind == "llama":
        kv = d * m.n_kv_head // m.n_head
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * m.intermediate_size
        head = 0 if m.tie_weights else v * d
        matmul = layers * per_layer + v * d
        return v * d + head + layers * (per_layer + 2 * d) + d, matmul
    # gpt
    per_layer = 12 * d * d
    small = 13 * d if m.bias else 4 * d
    head = 0 if m.tie_weights else v * d
    matmul = layers * per_layer + v * d
    return v * d + m.block_size * d + head + layers * (per_layer + small) + 2 * d, matmul


def replay_cost(spec: Any, params: Any) -> ReplayCost:
    """The replay cost of one step of `spec` (a commitments.spec.Spec) under protocol `params`."""
    m, b = spec.model, spec.batch
    total, matmul = _model_params(m)
    tokens = b.batch_size * b.seq_len
    flops = 6 * matmul * tokens
    if m.kind in ("gpt", "llama"):
        flops += 12 * m.n_layer * b.batch_size * b.seq_len * b.seq_len * m.n_embd
    state_bytes = 3 * total * 4
    nbytes = state_bytes + b.batch_size * (b.seq_len + 1) * 4 + 2 * state_bytes
    seconds = Fraction(flops, params.reference_flops) + Fraction(nbytes, params.reference_bytes_per_s)
    blocks = -(-(seconds * params.replay_margin) // params.block_seconds)  # ceiling
    return ReplayCost(params=total, flops=flops, bytes=nbytes, seconds=seconds, blocks=max(1, int(blocks)))


def opening_blocks(spec: Any, params: Any, checkpoint_interval: int) -> int:
    """The opening window of a run whose miner keeps a state every `checkpoint_interval` steps: the
    blocks, with the margin, to regenerate a challenged step's pre-state from the last kept state
    (at most checkpoint_interval - 1 steps) and build the opening (one step's replay cost, as a
    verifier's), and never less than the network's opening_deadline."""
    one = replay_cost(spec, params)
    steps = max(1, checkpoint_interval)
    seconds = Fraction(one.flops * steps, params.reference_flops) + Fraction(
        one.bytes, params.reference_bytes_per_s
    )
    blocks = -(-(seconds * params.replay_margin) // params.block_seconds)
    return max(params.opening_deadline, int(blocks), 1)


def seats_below_dispute(params: Any) -> int:
    """The seats of every round of one challenge below its dispute round (committee_size doubled a
    round, at most MAX_COMMITTEE a round): what a run's escrow pays for, per challenge."""
    return sum(min(params.committee_size << (r - 1), MAX_COMMITTEE) for r in range(1, params.max_rounds))


def run_escrow(replay_blocks: int, params: Any) -> tuple[int, int]:
    """(seat fee, escrow) of a run whose replay needs `replay_blocks`: the fee a winning seat is paid
    (fee_per_replay_block per block of replay), and what the miner escrows at registration, that
    fee for every seat of every round below the dispute round of each of its challenges."""
    fee = params.fee_per_replay_block * replay_blocks
    return fee, fee * params.challenges_per_run * seats_below_dispute(params)


__all__ = ["ReplayCost", "opening_blocks", "replay_cost", "run_escrow", "seats_below_dispute"]
