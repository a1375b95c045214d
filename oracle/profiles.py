"""Execution profiles: which op namespace a step runs on, and how micro-batches combine.

exact-v1 (the default) runs oracle.exact.ops and accumulates micro-batch gradients as exact
integer partials rounded once, so a step is one set of bytes everywhere. torch-native runs stock
PyTorch with deterministic flags; it is bit-exact only on the hardware class the spec declares.
The spec's dtype picks the precision of the matrix products in either namespace (MixedOps).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch


class ProfileError(ValueError):
    """An unknown profile, or one this installation cannot run."""


def arithmetic_flags() -> None:
    """Settings every profile needs: no TF32 or reduced-precision matmul, no flush-to-zero."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_flush_denormal(False)


def deterministic_flags() -> None:
    """torch-native's deterministic kernels. exact-v1 does not need them (its reductions are exact
    in any order), so it leaves the process-wide switch alone."""
    arithmetic_flags()
    # cuBLAS is deterministic only with a fixed workspace; it must be set before cuBLAS starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


DTYPES = ("float32", "bf16-mixed")


class MixedOps:
    """An op namespace whose matrix products run in bf16-mixed precision: `linear`, `matmul` and
    `causal_attention` round their operands and results to bfloat16 (docs/exact-v1.md §12);
    every other op is the base namespace's, in float32."""

    def __init__(self, base: ModuleType) -> None:
        self._base = base
        self.NAME = f"{base.NAME}/bf16-mixed"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)

    def linear(self, x, w, b=None, *, variant="single"):
        return self._base.linear(x, w, b, variant=variant, bf16=True)

    def matmul(self, a, b, *, variant="single"):
        return self._base.matmul(a, b, variant=variant, bf16=True)

    def causal_attention(self, q, k, v, *, variant="single", dropout_p=0.0, dropout_mask=None):
        return self._base.causal_attention(q, k, v, variant=variant, dropout_p=dropout_p,
                                           dropout_mask=dropout_mask, bf16=True)


@dataclass(frozen=True)
class Profile:
    name: str
    ops: Any  # the module oracle.exact.ops / oracle.native, or a MixedOps over one
    # grads(model, params, inputs, targets, drop_for_rows, micro_batches) -> (loss, grads in order)
    grads: Callable


def _native_grads(ops, model, params, inputs, targets, drop_for, micro_batches):
    names = list(params)
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    total = inputs.numel()
    loss_sum = None
    grads = None
    for lo, hi in split_rows(inputs.shape[0], micro_batches):
        logits = model.forward(ops, leaves, inputs[lo:hi], drop_for(lo))
        loss = ops.cross_entropy(logits, targets[lo:hi], total_count=total)
        g = torch.autograd.grad(loss, [leaves[n] for n in names])
        grads = list(g) if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
    return loss_sum, grads


def split_rows(batch: int, micro_batches: int) -> list[tuple[int, int]]:
    """Contiguous whole-sequence slices [lo, hi) of a batch, as even as possible."""
    if not isinstance(micro_batches, int) or not 1 <= micro_batches <= batch:
        raise ProfileError(
            f"micro_batches must be between 1 and the batch size {batch}, got {micro_batches!r}"
        )
    base, extra = divmod(batch, micro_batches)
    out, lo = [], 0
    for i in range(micro_batches):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _exact_grads(ops, model, params, inputs, targets, drop_for, micro_batches):
    # imported here, as in get(): oracle.exact loads the numba kernels, which torch-native never needs
    from oracle.exact.grads import micro_batch_grads

    def forward(leaves, lo, hi):
        return model.forward(ops, leaves, inputs[lo:hi], drop_for(lo))

    return micro_batch_grads(forward, params, targets, split_rows(inputs.shape[0], micro_batches),
                             total_count=inputs.numel())


def get(name: str, dtype: str = "float32") -> Profile:
    if dtype not in DTYPES:
        raise ProfileError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if name == "torch-native":
        deterministic_flags()
        from oracle import native as base
        grads = _native_grads
    elif name == "exact-v1":
        arithmetic_flags()
        from oracle.exact import ops as base
        grads = _exact_grads
    else:
        raise ProfileError(f"unknown profile {name!r}; expected 'exact-v1' or 'torch-native'")
    ops = MixedOps(base) if dtype == "bf16-mixed" else base
    return Profile(name, ops, lambda *a: grads(ops, *a))
