"""Compiled CPU kernels (numba) of exact-v1: each the twin of an eager definition, bit for bit.

The package mirrors the eager modules file for file: kernels.transcendental (exp, GELU,
sigmoid, SiLU), kernels.quant (the exact row sum, the GEMM operands' quantisers), kernels.ops
(softmax and cross-entropy rows, layer norm rows, the per-sequence sums, the clipping sum's
chunks), kernels.accumulate (the two-word fold and its rounding), kernels.sqrt (square roots),
kernels.gemm (the float64 route's epilogues, the int8 slice route) and kernels.optim (AdamW, SGD).
Beside them: kernels._numba (numba, the on/off switch, the compile options, the shared scalar
primitives), kernels._pool (threads, the lock, the split of serial bodies), kernels._wrap (the
one wrapper convention, `kernel`) and kernels.registry (each wrapper's eager definition and its
conformance cases; tests/oracle/test_kernel_registry.py compares every pair).

Each mirrors its eager definition operation for operation, without fastmath (no FMA contraction,
no reassociation, no flush-to-zero). Used only for CPU tensors; set POT_EXACT_KERNELS=0 to run
the eager definitions everywhere. Callers use the names re-exported here
(`from oracle.exact import kernels; kernels.gelu(...)`).
"""

from __future__ import annotations

from typing import Any

from oracle.exact.kernels import accumulate as _accumulate
from oracle.exact.kernels import gemm as _gemm
from oracle.exact.kernels import ops as _ops
from oracle.exact.kernels import optim as _optim
from oracle.exact.kernels import quant as _quant
from oracle.exact.kernels import sqrt as _sqrt
from oracle.exact.kernels import transcendental as _transcendental
from oracle.exact.kernels._numba import disabled, enabled, numba
from oracle.exact.kernels._pool import PARALLEL_MIN_ELEMS
from oracle.exact.kernels.accumulate import f64_to_f32, fold_into, fold_result
from oracle.exact.kernels.gemm import (
    digits_parts_tile,
    digits_round_tile,
    hilo_round_f32,
    quant_digits,
    scale_parts,
    scale_round_f32,
)
from oracle.exact.kernels.ops import (
    ce_bwd_rows,
    ce_rows,
    layer_norm_bwd_rows,
    layer_norm_rows,
    log_softmax_bwd_rows,
    log_softmax_rows,
    seq_sums,
    softmax_bwd_rows,
    softmax_rows,
    sum_of_squares_chunks,
)
from oracle.exact.kernels.optim import adamw, sgd
from oracle.exact.kernels.quant import quant_cols, quant_rows, quant_rows_hilo
from oracle.exact.kernels.sqrt import sqrt
from oracle.exact.kernels.transcendental import exp, gelu, gelu_grad, sigmoid, sigmoid_grad, silu, silu_grad

KERNEL_MODULES = (_transcendental, _quant, _ops, _accumulate, _sqrt, _gemm, _optim)


def all_kernels() -> list[tuple[str, Any]]:
    """(name, dispatcher) of every compiled kernel (a name starting with _ and ending in _k), for
    the machine-code scan."""
    if numba is None:
        return []
    return [
        (n, f) for m in KERNEL_MODULES for n, f in vars(m).items() if n.startswith("_") and n.endswith("_k")
    ]


# Internals that tests and oracle.rng reach into: the lock numba's pool is taken under (oracle.rng's
# compiled pass shares it), the split of serial bodies, and some kernels' serial bodies and constants.
from oracle.exact.kernels._pool import lock as _lock  # noqa: E402
from oracle.exact.kernels._pool import split as _split  # noqa: E402
from oracle.exact.kernels.gemm import (  # noqa: E402
    _digits_cols_k,
    _digits_cols_part_k,
    _digits_parts_par_k,
    _digits_parts_tile_k,
    _digits_round_par_k,
    _digits_round_tile_k,
    _digits_rows_k,
    _digits_rows_part_k,
    _scale2_part_k,
    _scale_round_part_k,
)
from oracle.exact.kernels.ops import _sos_chunks_k  # noqa: E402
from oracle.exact.kernels.optim import _adamw_k, _sgd_k  # noqa: E402
from oracle.exact.kernels.quant import _COL_TILE, _SS_LANES, _col_tile, _quant_cols_part_k, _quant_rows_part_k  # noqa: E402
from oracle.exact.kernels.sqrt import _sqrt32_k, _sqrt64_k  # noqa: E402

__all__ = [
    "PARALLEL_MIN_ELEMS",
    "adamw",
    "all_kernels",
    "ce_bwd_rows",
    "ce_rows",
    "digits_parts_tile",
    "digits_round_tile",
    "disabled",
    "enabled",
    "exp",
    "f64_to_f32",
    "fold_into",
    "fold_result",
    "gelu",
    "gelu_grad",
    "hilo_round_f32",
    "layer_norm_bwd_rows",
    "layer_norm_rows",
    "log_softmax_bwd_rows",
    "log_softmax_rows",
    "numba",
    "quant_cols",
    "quant_digits",
    "quant_rows",
    "quant_rows_hilo",
    "scale_parts",
    "scale_round_f32",
    "seq_sums",
    "sgd",
    "sigmoid",
    "sigmoid_grad",
    "silu",
    "silu_grad",
    "softmax_bwd_rows",
    "softmax_rows",
    "sqrt",
    "sum_of_squares_chunks",
]
__all__ += [  # the internals named above
    "_COL_TILE",
    "_SS_LANES",
    "_col_tile",
    "_digits_cols_k",
    "_digits_cols_part_k",
    "_digits_parts_par_k",
    "_digits_parts_tile_k",
    "_digits_round_par_k",
    "_digits_round_tile_k",
    "_digits_rows_k",
    "_digits_rows_part_k",
    "_lock",
    "_quant_cols_part_k",
    "_quant_rows_part_k",
    "_scale2_part_k",
    "_scale_round_part_k",
    "_split",
    "_sqrt32_k",
    "_sqrt64_k",
    "_adamw_k",
    "_sgd_k",
    "_sos_chunks_k",
]
