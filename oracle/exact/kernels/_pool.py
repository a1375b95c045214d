"""How the kernels use threads: one lock around numba's pool, the thread count of a call, and the
split of a serial body over Python threads.

numba's workqueue threading layer (kernels._numba) aborts on concurrent parallel calls; `lock`
makes every kernel safe from any number of threads (each kernel is parallel inside already).
Small calls run on one thread: waking a thread pool costs more than it saves, and much more on a
busy machine. Larger ones use as many threads as torch does (OMP_NUM_THREADS and friends).

Kernels with a serial body over an index range run on more threads by splitting that range
(`split`): the body's own code on each part, the last part on the calling thread and the others
on a pool of Python threads kept here (the bodies are compiled nogil). Each index is computed as
on one thread, so the bytes do not depend on the split. numba's parallel launch costs about
0.1 ms, and its prange bodies ran up to 3x slower than the serial ones (768 x 768 column
quantiser: 0.97 ms on one thread against 0.26 ms), so that at two threads those calls were
slower than at one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch

from oracle.exact.kernels._numba import numba

lock = threading.RLock()

PARALLEL_MIN_ELEMS = 1 << 18


def threads_for(args: Iterable[object]) -> int:
    """The thread count of a call with these arguments: 1 below PARALLEL_MIN_ELEMS elements in
    its largest tensor, else torch's thread count (at most numba's)."""
    n = max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=0)
    if n < PARALLEL_MIN_ELEMS or numba is None:
        return 1
    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def set_pool_threads(threads: int) -> None:
    """numba's pool size for the next parallel call (hold `lock`)."""
    if numba is not None:
        numba.set_num_threads(threads)


_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _split_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers < workers:
            old, _pool, _pool_workers = (
                _pool,
                ThreadPoolExecutor(workers, thread_name_prefix="pot-kernel"),
                workers,
            )
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _reset_pool_in_child() -> None:
    # a forked child has none of the parent's pool threads: a fresh pool starts on first use
    global _pool, _pool_workers, _pool_lock
    _pool, _pool_workers, _pool_lock = None, 0, threading.Lock()


os.register_at_fork(after_in_child=_reset_pool_in_child)


def split(part: Callable[..., Any], args: tuple[Any, ...], n: int, threads: int, align: int = 1) -> int:
    """part(*args, i0, i1) over [0, n) in up to `threads` contiguous ranges whose bounds are
    multiples of `align` (every range waited for, also when one raises); the sum of what the
    parts return (None counts 0)."""
    chunks = -(-n // align) if n > 0 else 0
    k = min(threads, chunks)
    if k <= 1:
        return part(*args, 0, n) or 0
    step = -(-chunks // k) * align
    bounds = [(i, min(n, i + step)) for i in range(0, n, step)]
    pool = _split_pool(len(bounds) - 1)
    futures = [pool.submit(part, *args, i0, i1) for i0, i1 in bounds[:-1]]
    try:
        total = part(*args, *bounds[-1]) or 0
    finally:
        wait(futures)  # the parts write into the caller's buffers: none may outlive this call
    return total + sum(f.result() or 0 for f in futures)
