"""One step's loss and gradients over micro-batches: the loop around an ExactGradAccumulator.

The step code (oracle.profiles) and the conformance tests both run it, so the split-invariance
the tests check is that of the code that trains.
"""

from __future__ import annotations

import torch

from oracle.exact import ops
from oracle.exact.accumulate import ExactGradAccumulator
from oracle.exact.quant import ExactError


def micro_batch_grads(forward, params, targets: torch.Tensor, slices, *, total_count: int | None = None):
    """Loss and gradients of one step, accumulated over micro-batches.

    `forward(leaves, lo, hi)` returns the logits [hi - lo, T, V] of sequences lo..hi-1 computed
    with oracle.exact.ops from `leaves` (a dict like `params`, of fresh leaf tensors);
    `targets` is [B, T] int64; `slices` are the micro-batches' (lo, hi) in order, covering the
    batch. Returns (float32 loss, float32 gradients in the order of `params`), the same bytes
    for every split."""
    leaves = {n: params[n].detach().clone().requires_grad_(True) for n in params}
    acc = ExactGradAccumulator([leaves[n] for n in params])
    run_micro_batches(acc, forward, leaves, targets, slices, rows=(0, targets.shape[0]),
                      total_count=targets.numel() if total_count is None else total_count)
    return acc.loss(), acc.grads()


def run_micro_batches(acc, forward, leaves, targets: torch.Tensor, slices, *, rows: tuple[int, int],
                      total_count: int) -> None:
    """Forward and backward of the micro-batches `slices` (consecutive, covering the sequences
    rows[0]..rows[1]-1 of the step's batch) into `acc`; `targets` is the whole batch's."""
    expected = rows[0]
    for lo, hi in slices:
        if lo != expected or hi <= lo:
            raise ExactError(f"micro-batches must be consecutive, non-empty slices from {rows[0]}; "
                             f"got {list(slices)}")
        expected = hi
        with acc.micro_batch():
            logits = forward(leaves, lo, hi)
            ops.cross_entropy(logits, targets[lo:hi], total_count=total_count).backward()
    if expected != rows[1]:
        raise ExactError(f"micro-batches cover sequences {rows[0]}..{expected - 1}, not "
                         f"{rows[0]}..{rows[1] - 1}")
