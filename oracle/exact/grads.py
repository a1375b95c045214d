"""One step's loss and gradients over micro-batches: the loop around an ExactGradAccumulator.

The step code (oracle.profiles) and the conformance tests both run it, so the split-invariance
the tests check is that of the code that trains.
"""

from __future__ import annotations

import torch

from oracle.exact import gemm, ops
from oracle.exact.accumulate import ExactGradAccumulator
from oracle.exact.quant import ExactError


def micro_batch_grads(forward, params, targets: torch.Tensor, slices, *, total_count: int | None = None):
    """Loss and gradients of one step, accumulated over micro-batches.

    `forward(leaves, lo, hi)` returns the logits [hi - lo, T, V] of sequences lo..hi-1 computed
    with oracle.exact.ops from `leaves` (a dict like `params`, of fresh leaf tensors);
    `targets` is [B, T] int64; `slices` are the micro-batches' (lo, hi) in order, covering the
    batch. Returns (float32 loss, float32 gradients in the order of `params`), the same bytes
    for every split. `params` are not modified (nothing writes into the leaves)."""
    leaves = leaves_of(params)
    acc = ExactGradAccumulator([leaves[n] for n in params])
    run_micro_batches(acc, forward, leaves, targets, slices, rows=(0, targets.shape[0]),
                      total_count=targets.numel() if total_count is None else total_count)
    loss = acc.loss()
    return loss, acc.grads(consume=True)  # nothing reads the folds after: release them as we go


def leaves_of(params) -> dict[str, torch.Tensor]:
    """Fresh autograd leaves for `params` (a name -> tensor dict) that share their storage.

    No copy is needed: nothing writes into a leaf in place. The exact ops read their parameter
    operands (quantisation, products, gathers and the bf16 rounding all write new tensors, the
    in-place steps of oracle.exact act on those), their gradients go to the accumulator, never
    into `.grad`, and the optimizer reads the step's own parameter tensors, not the leaves, and
    returns new ones (tests/oracle/test_accumulate_sparse.py checks the bytes of `params` after a
    step)."""
    return {n: params[n].detach().requires_grad_(True) for n in params}


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
    # the step's products are done: the GEMM workspaces (the largest operands' size, 0.5 GB for
    # GPT-2 small) are not held through the rounding, the optimizer and between steps
    gemm.release_workspaces()
