"""The one convention of the kernels' torch wrappers, as a decorator, and the array views they share.

A wrapper allocates its outputs as torch tensors, hands numpy views of them and of its inputs to
a compiled kernel, and returns the tensors. `kernel` adds what every wrapper needs around that:

* empty input: with `empty=`, a call whose first tensor has no elements returns empty(*args)
  without entering the kernel;
* threads and the lock, by `threads=`:
  - "pool": a numba-parallel kernel: the thread count for the call (kernels._pool.threads_for),
    numba's pool set to it, all under the lock (numba's pool takes one caller at a time);
  - "direct": a kernel with a serial body besides its parallel one: called with direct=True on
    the calling thread, without the pool or the lock, when the call gets one thread, else as
    "pool" with direct=False;
  - "split": a serial body split over Python threads (kernels._pool.split): called with
    threads=, no lock (numba's pool is not used).

Every wrapper made by `kernel` is recorded in WRAPPERS (name -> wrapper), which
kernels.registry pairs with the eager definitions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from oracle.exact.kernels._pool import lock, set_pool_threads, threads_for
from oracle.exact.quant import F32

F = TypeVar("F", bound=Callable[..., Any])
Threads = Literal["pool", "direct", "split"]

WRAPPERS: dict[str, Callable[..., Any]] = {}


def _no_elements(args: tuple[Any, ...]) -> bool:
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return first is not None and first.numel() == 0


def kernel(threads: Threads = "pool", *, empty: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Make fn a kernel wrapper with the module's convention (see the module text)."""
    if threads not in ("pool", "direct", "split"):
        raise ValueError(f"kernel threads must be 'pool', 'direct' or 'split', got {threads!r}")

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if empty is not None and _no_elements(args):
                return empty(*args, **kwargs)
            n = threads_for(args)
            if threads == "split":
                return fn(*args, threads=n, **kwargs)
            if threads == "direct":
                if n == 1:
                    return fn(*args, direct=True, **kwargs)
                with lock:
                    set_pool_threads(n)
                    return fn(*args, direct=False, **kwargs)
            with lock:
                set_pool_threads(n)
                return fn(*args, **kwargs)

        if fn.__name__ in WRAPPERS:
            raise ValueError(f"two kernel wrappers are named {fn.__name__}")
        WRAPPERS[fn.__name__] = wrapper
        return wrapper  # type: ignore[return-value]
    return wrap


def like_f32(x: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
    """A new float32 tensor of x's shape (the result of an elementwise or row kernel)."""
    return torch.empty(x.shape, dtype=F32)


def as_np(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A numpy view of t (a contiguous copy first if t is not contiguous)."""
    return t.detach().contiguous().numpy()


def rows2(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """t as a numpy matrix of its last dim's rows."""
    n = t.shape[-1] if t.dim() else 1
    return as_np(t).reshape(-1, n)


def elementwise(kernel_fn: Callable[..., Any], x: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
    """A float32 result of x's shape from kernel_fn(x flat, *more flat, out flat)."""
    out = torch.empty(x.shape, dtype=F32)
    kernel_fn(as_np(x).reshape(-1), *(as_np(t).reshape(-1) for t in more), out.view(-1).numpy())
    return out
