"""Compiled twin of oracle.exact.sqrt: correctly rounded square roots of float32 and float64
tensors, and `sqrt`, which picks this kernel for CPU tensors or the eager definition.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from oracle.exact import sqrt as xsqrt
from oracle.exact.kernels._numba import OPTS as _opts
from oracle.exact.kernels._numba import Arr, enabled, njit, prange
from oracle.exact.kernels._numba import f32 as _f32
from oracle.exact.kernels._numba import f64_bits as _f64_bits
from oracle.exact.kernels._wrap import as_np, kernel
from oracle.exact.quant import F32, F64

# --- square roots (oracle.exact.sqrt is the definition) ------------------------------------------
# math.sqrt compiles to LLVM's sqrt intrinsic, the IEEE instruction (sqrtsd/vsqrtpd on x86, fsqrt
# on ARM): correctly rounded, so it equals the eager definition bit for bit (conformance vectors).


NAN64_BITS = 0x7FF8000000000000

@njit(parallel=True, **_opts)
def _sqrt64_k(x: Arr, out_bits: Arr) -> None:
    for i in prange(x.shape[0]):
        r = math.sqrt(x[i])  # sqrt(-0) = -0
        # the canonical NaN, written as bits: LLVM treats NaN payloads as unspecified and
        # would fold a float select between NaNs away (the instruction's NaN is negative)
        out_bits[i] = NAN64_BITS if r != r else _f64_bits(r)


@njit(parallel=True, **_opts)
def _sqrt32_k(x: Arr, out: Arr) -> None:
    for i in prange(x.shape[0]):
        out[i] = _f32(math.sqrt(np.float64(x[i])))


@kernel()
def _sqrt_cpu(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype)
    if x.dtype == F32:
        _sqrt32_k(as_np(x).reshape(-1), out.view(-1).numpy())
    else:
        _sqrt64_k(as_np(x).reshape(-1), out.view(-1).view(torch.int64).numpy())
    return out


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded sqrt of a float32 or float64 tensor on any device: this kernel for CPU
    tensors, the eager definition (oracle.exact.sqrt) elsewhere or when kernels are off."""
    if x.dtype not in (F32, F64):
        raise ValueError(f"sqrt takes a float32 or float64 tensor, got {x.dtype}")
    if not enabled() or x.device.type != "cpu":
        return xsqrt.sqrt32(x) if x.dtype == F32 else xsqrt.sqrt64(x)
    return _sqrt_cpu(x)
