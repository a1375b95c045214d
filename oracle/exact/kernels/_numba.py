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
Arr = np.ndarray[Any, Any]  # an array a kernel reads or writes (numba infers its dtype and layout)
Int = int | np.integer[Any]  # an integer inside a kernel: a Python int or a numpy scalar
Float = float | np.floating[Any]

numba: ModuleType | None
try:
    import numba as _numba_module
    from numba.core import config as _numba_config

    _config: Any = _numba_config  # its settings are set at run time (no static attributes)

    # The workqueue pool sleeps between calls. OpenMP pools spin after each parallel region and
    # starve torch's own threads of the cores they share (measured: 5-30x slower GEMM epilogues).
    # Calls are serialised (kernels._pool's lock), as this layer requires.
    if _config.THREADING_LAYER == "default":
        _config.THREADING_LAYER = "workqueue"
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


def njit(**options: Any) -> Callable[[F], F]:
    """numba.njit with these options (OPTS and parallel=); without numba, the function itself."""
    if numba is None:  # pragma: no cover
        return lambda fn: fn
    return numba.njit(**options)  # pyright: ignore[reportUnknownMemberType]


def _py_bits_as_f64(v: Int) -> float:
    return float(np.array(v, np.int64).view(np.float64))


def _py_bits_as_f32(v: Int) -> np.float32:
    return np.float32(np.array(v, np.int32).view(np.float32).item())


def _py_f64_bits(v: Float) -> int:
    return int(np.array(v, np.float64).view(np.int64))


if numba is not None:
    from numba.core import types as _nbt
    from numba.extending import intrinsic as _intrinsic

    def _bitcast(src: Any, dst: Any) -> Any:
        """An intrinsic reinterpreting a `src` value's bits as `dst` (an LLVM bitcast; no rounding)."""
        def cast(typingctx: Any, v: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.bitcast(args[0], context.get_value_type(dst))
            return dst(src), codegen
        return _intrinsic(cast)

    prange: Callable[..., range] = numba.prange
    # an int64 bit pattern as float64, an int32 one as float32, the bit pattern of a float64
    bits_as_f64: Callable[[Int], float] = _bitcast(_nbt.int64, _nbt.float64)
    bits_as_f32: Callable[[Int], np.float32] = _bitcast(_nbt.int32, _nbt.float32)
    f64_bits: Callable[[Float], int] = _bitcast(_nbt.float64, _nbt.int64)
else:  # pragma: no cover - the same meaning in Python, for a process without numba
    prange = range
    bits_as_f64, bits_as_f32, f64_bits = _py_bits_as_f64, _py_bits_as_f32, _py_f64_bits


NAN32 = np.float32(np.nan)


@njit(**OPTS)
def pow2(k: Int) -> float:
    """2^k for k in [-1022, 1023], from its bit pattern, as quant.pow2 builds it."""
    return bits_as_f64((k + 1023) << 52)


@njit(**OPTS)
def f32(v: Float) -> np.float32:
    """RN32 of a float64, NaN canonical (quant.canon_nan of .to(float32))."""
    return NAN32 if v != v else np.float32(v)
