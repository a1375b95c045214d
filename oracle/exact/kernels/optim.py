"""Compiled twins of oracle.optim's elementwise updates: AdamW and SGD with momentum on
contiguous float32 CPU tensors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, Int, njit, prange
from oracle.exact.kernels._wrap import kernel
from oracle.exact.quant import F32

# --- optimizer updates and the clipping sum (oracle.optim, ops.sum_of_squares are the definitions) --
# AdamW and SGD: one pass per tensor, every operation a float32 operation (numba keeps float32 op
# float32 as float32; the tests read the LLVM IR), in the eager order, into new arrays. The eager
# code does not canonicalise NaN, so the kernels count NaN in their outputs and the wrappers return
# None when there is one: the caller then runs the eager code for that tensor (no NaN output means
# no NaN anywhere, since every intermediate reaches an output and NaN never disappears).
# sum_of_squares: per chunk of 2^16 values the exact integer sum of the quantised squares and its
# exponent, combined exactly by the caller as the eager code does.


@njit(parallel=True, **_opts)
def _adamw_k(p: Arr, g: Arr, m: Arr, v: Arr, decay_flag: bool, has_wd: bool, decay: np.float32,
             b1: np.float32,
             c1: np.float32, b2: np.float32, c2: np.float32, sqrt_bc2: np.float32, eps: np.float32,
             step_size: np.float32, po: Arr, mo: Arr, vo: Arr) -> Int:
    wd = decay_flag and has_wd
    nan = 0
    for i in prange(p.shape[0]):
        pi = p[i]
        if wd:
            pi = pi * decay
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * (gi * gi)
        # kernels.sqrt of a float32: RN32 of the binary64 root of the widened value (_sqrt32_k)
        d = np.float32(math.sqrt(np.float64(vi))) / sqrt_bc2 + eps
        pn = pi - (mi / d) * step_size
        po[i] = pn
        mo[i] = mi
        vo[i] = vi
        if pn != pn or mi != mi or vi != vi:
            nan += 1
    return nan

@njit(parallel=True, **_opts)
def _sgd_k(p: Arr, g: Arr, buf: Arr, decay_flag: bool, has_wd: bool, wdc: np.float32, mu: np.float32,
           lr: np.float32, po: Arr, bo: Arr) -> Int:
    wd = decay_flag and has_wd
    nan = 0
    for i in prange(p.shape[0]):
        pi = p[i]
        gi = g[i]
        if wd:
            gi = gi + wdc * pi
        bi = mu * buf[i] + gi
        pn = pi - lr * bi
        po[i] = pn
        bo[i] = bi
        if pn != pn or bi != bi:
            nan += 1
    return nan


def _f32_scalar(t: torch.Tensor) -> np.float32:
    return np.float32(t.item())  # a float32 tensor's value: exact through the binary64 float


def _flat_f32(t: torch.Tensor) -> np.ndarray[Any, Any]:
    return t.detach().numpy().reshape(-1)


@kernel()
def adamw(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, hp: Any,
          decay: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """oracle.optim.adamw for contiguous CPU float32 tensors of one shape: (p, m, v) as new
    tensors, bit for bit, or None if an output holds a NaN (the eager code then runs)."""
    po, mo, vo = (torch.empty(p.shape, dtype=F32) for _ in range(3))
    nan = _adamw_k(_flat_f32(p), _flat_f32(g), _flat_f32(m), _flat_f32(v), bool(decay), bool(hp.has_wd),
                   _f32_scalar(hp.decay), _f32_scalar(hp.b1), _f32_scalar(hp.c1), _f32_scalar(hp.b2),
                   _f32_scalar(hp.c2), _f32_scalar(hp.sqrt_bc2), _f32_scalar(hp.eps),
                   _f32_scalar(hp.step_size), _flat_f32(po), _flat_f32(mo), _flat_f32(vo))
    return None if nan else (po, mo, vo)


@kernel()
def sgd(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor, hp: Any,
        decay: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """oracle.optim.sgd for contiguous CPU float32 tensors of one shape: (p, buf) as new tensors,
    bit for bit, or None if an output holds a NaN."""
    po, bo = (torch.empty(p.shape, dtype=F32) for _ in range(2))
    nan = _sgd_k(_flat_f32(p), _flat_f32(g), _flat_f32(buf), bool(decay), bool(hp.has_wd),
                 _f32_scalar(hp.wd), _f32_scalar(hp.mu), _f32_scalar(hp.lr), _flat_f32(po), _flat_f32(bo))
    return None if nan else (po, bo)
