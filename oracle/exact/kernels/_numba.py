"""numba for the compiled kernels: the import, the on/off switch, the compile options, and the
scalar primitives every kernel module shares (bit casts, powers of two, the float32 rounding).

No fastmath: LLVM then keeps every multiply and add separately rounded (no FMA contraction, no
reassociation, no flush-to-zero); tests/oracle/test_exact_kernels.py scans the generated machine
code for fused multiply-add instructions. numba is a declared dependency; without it `enabled()`
is False, the kernels stay plain Python functions that nothing calls, and the eager definitions
run everywhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

numba: ModuleType | None
try:
    import numba as _numba_module

    # The workqueue pool sleeps between calls. OpenMP pools spin after each parallel region and
    # starve torch's own threads of the cores they share (measured: 5-30x slower GEMM epilogues).
    # Calls are serialised (kernels._pool's lock), as this layer requires.
    if _numba_module.config.THREADING_LAYER == "default":
        _numba_module.config.THREADING_LAYER = "workqueue"
    numba = _numba_module
except ImportError:  # pragma: no cover
    numba = None

_disabled = os.environ.get("POT_EXACT_KERNELS", "1") == "0"


def enabled() -> bool:
    """Whether CPU tensors take the compiled kernels (numba present, POT_EXACT_KERNELS not 0)."""
    return numba is not None and not _disabled


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the eager definitions on CPU too (for conformance tests and benchmarks)."""
    global _disabled
    old, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = old


OPTS: dict[str, Any] = dict(cache=True, nogil=True, error_model="numpy")  # fastmath stays off

if numba is not None:
    from numba import njit as _njit
    from numba import prange as _prange
    from numba.core import types as _nbt
    from numba.extending import intrinsic as _intrinsic

    def njit(**options: Any) -> Callable[[F], F]:
        """numba.njit with these options (OPTS and parallel=)."""
        return _njit(**options)  # type: ignore[no-any-return]

    prange: Callable[..., range] = _prange

    def _bitcast(src: Any, dst: Any) -> Callable[..., Any]:
        """An intrinsic reinterpreting a `src` value's bits as `dst` (an LLVM bitcast; no rounding)."""
        def cast(typingctx: Any, v: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.bitcast(args[0], context.get_value_type(dst))
            return dst(src), codegen
        return _intrinsic(cast)  # type: ignore[no-any-return]

    bits_as_f64 = _bitcast(_nbt.int64, _nbt.float64)  # an int64 bit pattern as float64
    bits_as_f32 = _bitcast(_nbt.int32, _nbt.float32)  # an int32 bit pattern as float32
    f64_bits = _bitcast(_nbt.float64, _nbt.int64)     # the bit pattern of a float64 as an int64
else:  # pragma: no cover - the same meaning in Python, for a process without numba
    def njit(**options: Any) -> Callable[[F], F]:
        return lambda fn: fn

    prange = range

    def bits_as_f64(v: int) -> float:
        return float(np.array(v, np.int64).view(np.float64))

    def bits_as_f32(v: int) -> np.float32:
        return np.array(v, np.int32).view(np.float32)[()]

    def f64_bits(v: float) -> int:
        return int(np.array(v, np.float64).view(np.int64))


NAN32 = np.float32(np.nan)


@njit(**OPTS)
def pow2(k: int) -> float:
    """2^k for k in [-1022, 1023], from its bit pattern, as quant.pow2 builds it."""
    return bits_as_f64((k + 1023) << 52)


@njit(**OPTS)
def f32(v: float) -> np.float32:
    """RN32 of a float64, NaN canonical (quant.canon_nan of .to(float32))."""
    return NAN32 if v != v else np.float32(v)
