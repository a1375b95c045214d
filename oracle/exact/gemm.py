"""Exact matrix products of block-quantised operands (docs/exact-v1.md §2): the GEMMs of exact-v1.

The operands are quantised by oracle.exact.quant (or its bit-identical CPU kernels) and multiplied
as float64 integers whose sums stay exact, then rescaled by powers of two and rounded once.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading

import numpy as np
import torch

from oracle import cpu_int8
from oracle.exact import kernels
from oracle.exact.quant import (
    F32,
    F64,
    ExactError,
    all_finite,
    apply_nonfinite,
    canon_nan,
    dot_bits,
    hilo_bits,
    pow2,
    quantise,
    quantise_hilo,
    to_f32_once,
    two_sum,
)

I64 = torch.int64

# --- exact matrix products -------------------------------------------------------------------


def _classes(x: torch.Tensor):
    """Indicator matrices (float64 0/1) of NaN, +inf, -inf, zero, >0 finite, <0 finite."""
    def ind(m):
        return m.to(F64)
    fin = torch.isfinite(x)
    return (ind(torch.isnan(x)), ind(x == math.inf), ind(x == -math.inf), ind(x == 0),
            ind(fin & (x > 0)), ind(fin & (x < 0)))


K_CHUNK = 512


def k_chunks(k: int) -> tuple[int, int]:
    """(number of chunks, chunk length) of a single-slice contraction of length k: chunks of at
    most K_CHUNK, as even as possible (the last zero-padded). The bits per factor are
    dot_bits(chunk length); the block exponents still span the whole row/column."""
    nc = max(1, -(-k // K_CHUNK))
    return nc, -(-k // nc)


SPLIT_T = 26  # chunk products (< 2^53) split as H 2^26 + L: both sums stay exact for 2^26 chunks


# Cauchy-Schwarz: every partial sum of qa_i . qb_j, in any order, is at most |qa_i| |qb_j| in
# magnitude. Below 2^52 (a factor 2 under 2^53, covering the rounding of the norms) one GEMM of
# the whole contraction is exact whatever the BLAS does, and equals the chunked sum.
ONE_GEMM_BOUND = 2.0**52

# The CPU kernels' own sums of squares are plain binary64 sums of exact squares in a fixed order
# (the row kernel: 32 lane sums, then the lanes; the column kernel: k order), so their error is
# known (not so torch.linalg.vector_norm's, §11): each square passes through at most k + 31
# roundings of nonnegative sums, so for k <= 2^20 terms the computed sum is at least
# (1 - (k + 31) 2^-53) times the true one, and the two square roots and their product lose at
# most three more roundings. A computed bound of 2^53 (1 - 2^-20) then proves every partial sum
# below 2^53 (all of them integers), so the margin of a factor 2 is not needed there.
KERNEL_ONE_GEMM_BOUND = 2.0**53 * (1.0 - 2.0**-20)
KERNEL_BOUND_MAX_K = 1 << 20


def _one_gemm_is_exact(qa: torch.Tensor, qb: torch.Tensor) -> bool:
    na = torch.amax(torch.linalg.vector_norm(qa, dim=-1))
    nb = torch.amax(torch.linalg.vector_norm(qb, dim=-2))
    return bool(na * nb <= ONE_GEMM_BOUND)


def _chunk(q: torch.Tensor, c: int, kc: int, rows: bool) -> torch.Tensor:
    lo_k, hi_k = c * kc, min(q.shape[-1 if rows else -2], (c + 1) * kc)
    return q[..., lo_k:hi_k] if rows else q[..., lo_k:hi_k, :]


def _chunked_integer_matmul(qa: torch.Tensor, qb: torch.Tensor, nc: int, kc: int, out=None, tmp=None):
    """Exact integer qa @ qb as float64 (hi, lo) when the sum may pass 2^53.

    Fast path: add the chunk products P_c (each exact, |P_c| <= 2^53) in chunk order while every
    running total stays below 2^53 in magnitude, when every add is exact (the usual case).
    Otherwise: P_c = H_c 2^26 + L_c with H_c = floor(P_c 2^-26), 0 <= L_c < 2^26; sum H_c and
    sum L_c are exact in any order, and (sum H_c) 2^26 + sum L_c is one exact TwoSum. Both paths
    yield the exact integer, so which one runs never changes a result. `out`, `tmp`: buffers of
    the output's shape for the fast path's total and chunk products (hi is then `out`; the split
    path's words are fresh either way)."""
    total = torch.matmul(_chunk(qa, 0, kc, True), _chunk(qb, 0, kc, False), out=out)
    for c in range(1, nc):
        total.add_(torch.matmul(_chunk(qa, c, kc, True), _chunk(qb, c, kc, False), out=tmp))
        mn, mx = torch.aminmax(total)
        if not bool((mx < 2.0**53) & (mn > -(2.0**53))):
            break
    else:
        return total, None
    del total
    dev = qa.device
    down = pow2(torch.full((), -SPLIT_T, dtype=torch.int64, device=dev))
    up = pow2(torch.full((), SPLIT_T, dtype=torch.int64, device=dev))
    hsum = lsum = None
    for c in range(nc):
        p = torch.matmul(_chunk(qa, c, kc, True), _chunk(qb, c, kc, False))
        h = torch.mul(p, down).floor_().mul_(up)  # H_c 2^26, exact
        p.sub_(h)                                  # L_c, exact
        if hsum is None:
            hsum, lsum = h, p
        else:
            hsum.add_(h)  # multiples of 2^26 below 2^79: exact
            lsum.add_(p)
    return two_sum(hsum, lsum)


def _single_product(qa: torch.Tensor, qb: torch.Tensor, s: int, nc: int, kc: int, one_gemm,
                    out=None, tmp=None, route: str | None = None):
    """The exact integer qa @ qb (|q| <= 2^s) as float64 (hi, lo), on this device's route.

    `one_gemm()` says whether one float64 GEMM over the whole k is exact (Cauchy-Schwarz).
    `out`, `tmp`: buffers of the output's shape for the float64 route (hi is then `out` whenever
    lo is None; see _chunked_integer_matmul). `route`: gemm_route(qa.device), when the caller
    has it."""
    route = route or gemm_route(qa.device)
    if route != "dgemm":
        n = _sliced_product(qa, qb, s, s, SLICE_BITS[route])
        if n is not None:
            return _int64_to_parts(n)
    if nc == 1 or one_gemm():
        return torch.matmul(qa, qb, out=out), None
    return _chunked_integer_matmul(qa, qb, nc, kc, out, tmp)


def _exact_gemm(qa: torch.Tensor, qb: torch.Tensor, bits_a: int, bits_b: int, route: str) -> torch.Tensor:
    """qa @ qb for integer-valued float64 operands whose every partial sum the caller has bounded
    below 2^53 (|qa| <= 2^bits_a, |qb| <= 2^bits_b): one GEMM, on this device's route."""
    if route != "dgemm":
        n = _sliced_product(qa, qb, bits_a, bits_b, SLICE_BITS[route])
        if n is not None:
            return n.to(F64)  # exact: below 2^53
    return torch.matmul(qa, qb)


# --- the int8 slice route --------------------------------------------------------------------
#
# An implementation choice, never a spec choice: it computes the same exact integer N = qa @ qb
# as the float64 GEMM, hence the same bytes (docs/exact-v1.md §13 gives the bounds). Operands
# are cut into signed base-2^w digits (int8), every digit pair multiplied by torch._int_mm with
# int32 accumulation over K chunks short enough never to overflow, and the products shifted and
# added in int64.

ROUTES = ("dgemm", "int7", "int8")
SLICE_BITS = {"int7": 7, "int8": 8}
INT64_BOUND = 2**63 - 2**10   # int64 partial sums stay below this; RN64 of one stays below 2^63
MAX_SLICED_BATCH = 16        # more (small) matrices than this: the float64 GEMM's batched call
_route_override: str | None = None


def _route_name() -> str:
    name = _route_override or os.environ.get("POT_EXACT_GEMM", "auto")
    if name != "auto" and name not in ROUTES:
        raise ExactError(f"POT_EXACT_GEMM must be auto, dgemm, int7 or int8, got {name!r}")
    return name


def gemm_route(device) -> str:
    """The integer-GEMM route for tensors on `device`: POT_EXACT_GEMM (dgemm, int7, int8) or, by
    default ("auto"), int7 on CUDA (int8 tensor cores), int8 on CPUs whose int8 GEMM is fast and
    exact (AMX: cpu_int8_exact), dgemm on other CPUs (fast float64 BLAS). Every route gives the
    same bytes."""
    name = _route_name()
    if name == "auto":
        if device.type == "cuda":
            return "int7"
        return "int8" if device.type == "cpu" and cpu_int8_exact() else "dgemm"
    return name


_cpu_int8: bool | None = None


def cpu_int8_exact() -> bool:
    """Whether CPU products take the int8 slice route by default: the compiled kernels are on
    and oracle.cpu_int8 finds this CPU's torch._int_mm fast (AMX tiles through oneDNN; with
    AVX-512 VNNI alone nine int8 products cost about one DGEMM) and exact on its probe (checked
    once per process)."""
    global _cpu_int8
    if not kernels.enabled():
        return False
    if _cpu_int8 is None:
        _cpu_int8 = cpu_int8.fast_and_exact()
    return _cpu_int8


@contextlib.contextmanager
def route(name: str):
    """Use integer-GEMM route `name` (or "auto") on every device inside the block."""
    global _route_override
    if name != "auto" and name not in ROUTES:
        raise ExactError(f"gemm route must be auto, dgemm, int7 or int8, got {name!r}")
    old, _route_override = _route_override, (None if name == "auto" else name)
    try:
        yield
    finally:
        _route_override = old


def slice_count(bits: int, w: int) -> int:
    """Number of signed base-2^w digits for integers |q| <= 2^bits: w-bit low digits in
    [-2^(w-1), 2^(w-1)) and a top digit of magnitude at most 64 (bits - w (n-1) <= 6, plus less
    than one from the low digits), which int8 holds for w = 7 and w = 8."""
    return 1 + max(0, -(-(bits - 6) // w))


def int32_chunk(w: int) -> int:
    """K chunk of one int32 accumulation: each digit product is at most 2^(2w-2) in magnitude, so
    2^(32-2w) of them sum to at most 2^30 < 2^31."""
    return 1 << (32 - 2 * w)


def _digit_weight(bits: int, w: int) -> int:
    """An upper bound of sum_i max|d_i| 2^(w i) over the digits of any |q| <= 2^bits."""
    n = slice_count(bits, w)
    base, scale = 1 << w, 1 << (w * (n - 1))   # scale: the top digit's weight (Python ints)
    low = (1 << (w - 1)) * ((scale - 1) // (base - 1))   # the low digits' largest sum
    top = ((1 << bits) + low) // scale
    assert top <= 64, (bits, w, n, top)
    return low + top * scale


def sliced_bound(k: int, bits_a: int, bits_b: int, w: int) -> int:
    """Largest magnitude any int64 partial sum of the sliced product can reach (Python int)."""
    return k * _digit_weight(bits_a, w) * _digit_weight(bits_b, w)


def _digits(q: torch.Tensor, bits: int, w: int) -> list[torch.Tensor]:
    """Signed base-2^w digits (int8) of integer-valued q, |q| <= 2^bits: q = sum_i d_i 2^(w i)."""
    r = q.to(I64)  # exact: integers below 2^53
    half, mask = 1 << (w - 1), (1 << w) - 1
    out = []
    for _ in range(slice_count(bits, w) - 1):
        d = torch.bitwise_and(r + half, mask) - half   # r mod 2^w, in [-2^(w-1), 2^(w-1))
        out.append(d.to(torch.int8))
        r = torch.bitwise_right_shift(r - d, w)        # exact: r - d is a multiple of 2^w
    out.append(r.to(torch.int8))                        # |r| <= 64 (slice_count)
    return out


def _pad_to(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """x with zeros appended along dim up to `size` (zeros leave every product sum unchanged)."""
    extra = size - x.shape[dim]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, torch.zeros(shape, dtype=x.dtype, device=x.device)], dim=dim)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _int_mm_2d(da: list[torch.Tensor], db: list[torch.Tensor], w: int) -> torch.Tensor:
    """sum_{i,j} (da_i @ db_j) 2^(w (i + j)) in int64 for int8 digit matrices [m, k], [k, n]."""
    m, k = da[0].shape
    n = db[0].shape[1]
    # torch._int_mm's CUDA kernels want m > 16 and k, n multiples of 8: pad with zeros everywhere
    mp, kp, np_ = max(17, m), _round_up(max(k, 1), 8), _round_up(max(n, 1), 8)
    da = [_pad_to(_pad_to(d, 0, mp), 1, kp) for d in da]
    db = [_pad_to(_pad_to(d, 0, kp), 1, np_) for d in db]
    kc = int32_chunk(w)
    out = None
    for c0 in range(0, kp, kc):
        c1 = min(kp, c0 + kc)
        a_c = [d[:, c0:c1].contiguous() for d in da]
        b_c = [d[c0:c1, :].t().contiguous().t() for d in db]  # column-major, as cuBLASLt prefers
        for i, a_i in enumerate(a_c):
            for j, b_j in enumerate(b_c):
                p = torch._int_mm(a_i, b_j).to(I64)             # exact: |sum| <= 2^30 (int32_chunk)
                if i + j:
                    p = torch.bitwise_left_shift(p, w * (i + j))
                out = p if out is None else out.add_(p)        # exact: below INT64_BOUND
    return out[:m, :n]


def _sliced_product(qa: torch.Tensor, qb: torch.Tensor, bits_a: int, bits_b: int, w: int):
    """The exact integer qa @ qb (integer-valued float64, |qa| <= 2^bits_a, |qb| <= 2^bits_b) as
    int64 by the slice route, or None where the route does not apply (a partial sum could pass
    INT64_BOUND, or a batch of many matrices: the float64 GEMM serves those)."""
    k = qa.shape[-1]
    if sliced_bound(k, bits_a, bits_b, w) >= INT64_BOUND:
        return None
    if qa.device.type == "cpu" and _route_name() == "auto":
        return None  # by default CPUs slice only 2-D single products, compiled (_fast_sliced)
    da, db = _digits(qa, bits_a, w), _digits(qb, bits_b, w)
    if qa.dim() == 2 and qb.dim() == 2:
        return _int_mm_2d(da, db, w)
    batch = torch.broadcast_shapes(qa.shape[:-2], qb.shape[:-2])
    count = math.prod(batch)
    if count > MAX_SLICED_BATCH:
        return None
    m, n = qa.shape[-2], qb.shape[-1]
    da = [d.expand(*batch, m, k).reshape(count, m, k) for d in da]
    db = [d.expand(*batch, k, n).reshape(count, k, n) for d in db]
    if count == 0:
        return torch.zeros(*batch, m, n, dtype=I64, device=qa.device)
    outs = [_int_mm_2d([d[t] for d in da], [d[t] for d in db], w) for t in range(count)]
    return torch.stack(outs).reshape(*batch, m, n)


def _int64_to_parts(n: torch.Tensor):
    """(hi, lo) float64 of an exact int64 integer: hi = RN64(n), lo = n - hi (exact, |lo| <=
    2^10), lo None when it is zero everywhere; as the float64 route gives them."""
    hi = n.to(F64)
    lo = (n - hi.to(I64)).to(F64)
    if not bool(torch.any(lo != 0)):
        return hi, None
    return hi, lo


# --- per-thread float64 workspaces ----------------------------------------------------------
#
# The CPU fast path writes the quantised operands (and, when it rounds the product itself, the
# integer GEMM's output) into float64 buffers kept per thread and reused by the next call: a
# fresh array of that size costs a page fault per 4 KiB page on first write (what that cost
# measured: docs/perf/bench-notes.md). A buffer grows to the largest size asked of it
# and is held until the thread ends; POT_EXACT_GEMM_WORKSPACE_MIB caps what one thread holds
# (all its buffers together, default 1024; 0 turns them off), and a request beyond the cap gets
# a fresh tensor as before. A workspace never leaves the call that filled it: what the fast path
# returns, and so what autograd saves, is always a fresh tensor.

WORKSPACE_ENV = "POT_EXACT_GEMM_WORKSPACE_MIB"
WORKSPACE_DEFAULT_MIB = 1024


class _Workspaces(threading.local):
    def __init__(self):
        self.bufs: dict[str, torch.Tensor] = {}  # name -> uint8 bytes
        self.views: dict[str, tuple] = {}  # name -> ((shape, dtype), the last view handed out)
        self.busy = False  # a call on this thread is using them (re-entrant calls get fresh tensors)


_ws = _Workspaces()


def _workspace_cap() -> int:
    """Bytes one thread's workspaces may hold (POT_EXACT_GEMM_WORKSPACE_MIB)."""
    raw = os.environ.get(WORKSPACE_ENV)
    if raw is None:
        return WORKSPACE_DEFAULT_MIB << 20
    try:
        return max(0, int(float(raw) * (1 << 20)))
    except ValueError:
        raise ExactError(f"{WORKSPACE_ENV} must be a number of MiB, got {raw!r}") from None


def _take(ws: _Workspaces | None, name: str, shape, dtype=F64) -> torch.Tensor:
    """A contiguous tensor of `shape` and `dtype` (float64 by default): a view of this thread's
    workspace `name` (grown to fit, within the cap), or a fresh tensor when ws is None or the cap
    would be passed."""
    shape = tuple(shape)
    if ws is None:
        return torch.empty(shape, dtype=dtype)
    last = ws.views.get(name)
    if last is not None and last[0] == (shape, dtype):  # as last time: the same view
        return last[1]
    size = dtype.itemsize
    n = math.prod(shape) * size  # bytes
    buf = ws.bufs.get(name)
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    if buf is None or buf.numel() < n:
        held = sum(b.numel() for k, b in ws.bufs.items() if k != name)
        if held + n > _workspace_cap():
            return torch.empty(shape, dtype=dtype)
        ws.bufs.pop(name, None)  # drop the smaller buffer (and its view) before allocating
        ws.views.pop(name, None)
        # numpy's allocator asks for transparent huge pages on large blocks (fewer faults on the
        # first fill, fewer TLB misses in the GEMM) and aligns them for every dtype; the memory
        # goes when the buffer is replaced, released, or its thread ends
        buf = ws.bufs[name] = torch.from_numpy(np.empty(n, dtype=np.uint8))
    view = buf[:n].view(dtype).view(shape)
    ws.views[name] = ((shape, dtype), view)
    return view


def release_workspaces() -> None:
    """Free this thread's GEMM workspaces (they are allocated again when next needed)."""
    _ws.bufs.clear()
    _ws.views.clear()


def _kernel_quant(x: torch.Tensor, dim: int, s: int, ws: _Workspaces | None = None, name: str = "",
                  need_ss: bool = True):
    """(q, e, ss) of quant.quantise(x, dim, s) from the CPU kernels, or None when a block holds inf
    or NaN (the general path then runs). The caller has checked: a CPU float32 tensor of at least
    2 dims, kernels enabled, dim -1 (blocks are rows) or -2 (blocks are columns). Whichever way x
    is laid out, its blocks are read in place: rows of a row-major matrix by the row kernel,
    columns by the column kernel (a transposed operand is never copied), and q has x's layout
    (a view of workspace `name` of ws when given). ss: the largest sum of squares of a block's
    integers (0.0 when not need_ss)."""
    xt = x.transpose(-2, -1)
    if dim == -1:
        if x.is_contiguous() or not xt.is_contiguous():
            rows, t = True, x.contiguous()      # rows of a row-major matrix (or of a copy)
        else:
            rows, t = False, xt                 # rows of a column-major one: columns of xt
    elif xt.is_contiguous():
        rows, t = True, xt                      # columns of a column-major matrix: rows of xt
    else:
        rows, t = False, x.contiguous()         # columns of a row-major one (or of a copy)
    q = _take(ws, name, t.shape)
    if rows:
        res = kernels.quant_rows(t.reshape(-1, t.shape[-1]), s, out=q.view(-1, t.shape[-1]), need_ss=need_ss)
        if res is None:
            return None
        e = res[1].view(*t.shape[:-1], 1)
    else:
        res = kernels.quant_cols(t, s, out=q, need_ss=need_ss)
        if res is None:
            return None
        e = res[1]
    if t is xt:  # blocks were read through x's transpose: give q and e back in x's orientation
        return q.transpose(-2, -1), e.transpose(-2, -1), res[2]
    return q, e, res[2]


def _fast_single(a: torch.Tensor, b: torch.Tensor, k: int, rounded: bool = False):
    """The single-slice product with both operands quantised by the CPU kernels (finite inputs),
    or None. Same arithmetic as the general path. With `rounded`, a 2-D product whose exact value
    is one word comes back as its float32 result (hi, None) from one fused scale-and-round pass
    (the integer GEMM's output then lives in a workspace)."""
    if not kernels.enabled() or a.dtype != F32 or b.dtype != F32 or a.device.type != "cpu" \
            or b.device.type != "cpu" or a.dim() < 2:
        return None
    nc, kc = k_chunks(k)
    s = dot_bits(kc)
    route = gemm_route(a.device)
    if route == "int8" and (k >= SLICE_MIN_K or _route_name() != "auto"):
        fast = _fast_sliced(a, b, k, s, rounded)
        if fast is not None:
            return fast
    ws = _ws
    if ws.busy:  # re-entered on this thread: the outer call holds the buffers
        ws = None
    else:
        ws.busy = True
    try:
        qa = _kernel_quant(a, -1, s, ws, "qa", nc > 1)  # one chunk: no Cauchy-Schwarz test
        if qa is None:
            return None
        qb = _kernel_quant(b, -2, s, ws, "qb", nc > 1)
        if qb is None:
            return None
        (qa, ea, ssa), (qb, eb, ssb) = qa, qb
        # the Cauchy-Schwarz test (KERNEL_ONE_GEMM_BOUND): either way one GEMM or the chunked sum
        # gives the same exact integer, so the test only picks the faster proven path
        bound = KERNEL_ONE_GEMM_BOUND if k <= KERNEL_BOUND_MAX_K else ONE_GEMM_BOUND
        one_gemm = nc == 1 or math.sqrt(ssa) * math.sqrt(ssb) <= bound
        out = tmp = None
        if rounded and qa.dim() == 2 and qb.dim() == 2 and route == "dgemm":
            # this call rounds N itself: a one-word N may live in a workspace, since what leaves
            # is RN32((N 2^(ea - s)) 2^(eb - s)), a fresh float32 tensor
            shape = (qa.shape[0], qb.shape[1])
            out = _take(ws, "out", shape)
            tmp = None if one_gemm else _take(ws, "chunk", shape)
        hi, lo = _single_product(qa, qb, s, nc, kc, lambda: one_gemm, out, tmp, route)
        del qa, qb
        if rounded and lo is None and hi.dim() == 2:
            return kernels.scale_round_f32(hi, ea.reshape(-1), eb.reshape(-1), s), None
        # hi and lo are fresh here, never views of the workspaces: a workspace hi comes only with
        # lo None and a rounding call (above); two words come from fresh split or sliced parts
        m, n = hi.shape[-2], hi.shape[-1]
        if hi.numel() == m * n and hi.is_contiguous() and ea.numel() == m and eb.numel() == n:
            # one matrix (the weight gradient of one sequence): both scalings in one pass
            ea, eb = ea.reshape(m), eb.reshape(n)
            kernels.scale_parts(hi.view(m, n), ea, eb, s)
            if lo is not None:
                lo = lo.contiguous()
                kernels.scale_parts(lo.view(m, n), ea, eb, s)
            return hi, lo
        return _scale(hi, lo, pow2(ea - s), pow2(eb - s))
    finally:
        if ws is not None:
            ws.busy = False


def _kernel_digits(x: torch.Tensor, dim: int, s: int, rev: bool, out: torch.Tensor):
    """Block exponents (int64 [blocks]) of quant.quantise(x, dim, s) for a float32 matrix x, its
    integers written as 3 int8 digits into out [blocks, 3k] (kernels.quant_digits), or None
    for a block holding inf or NaN. Blocks are read in place whichever way x is laid out."""
    xt = x.t()
    if dim == -1:  # blocks: the rows of x
        if x.is_contiguous() or not xt.is_contiguous():
            return kernels.quant_digits(x.contiguous(), s, True, rev, out)
        return kernels.quant_digits(xt, s, False, rev, out)
    if xt.is_contiguous():  # blocks: the columns of x
        return kernels.quant_digits(xt, s, True, rev, out)
    return kernels.quant_digits(x.contiguous(), s, False, rev, out)


def shift_bound(bits: int, w: int) -> int:
    """Largest sum over one contraction index of |d_i| |e_j| for the digit pairs i + j = t of one
    shift t, over every t (Python int): one int8 GEMM of the concatenated pairs of a shift sums
    k of these, so it stays exact in int32 while k * shift_bound < 2^31."""
    n = slice_count(bits, w)
    scale = 1 << (w * (n - 1))
    low = (1 << (w - 1)) * ((scale - 1) // (((1 << w) - 1) or 1))
    top = ((1 << bits) + low) // scale  # the top digit's largest magnitude (_digit_weight)
    mag = [1 << (w - 1)] * (n - 1) + [top]
    return max(sum(mag[i] * mag[t - i] for i in range(max(0, t - n + 1), min(t, n - 1) + 1))
               for t in range(2 * n - 1))


SLICE_TILE_M, SLICE_TILE_N = 512, 256  # output tiles of the CPU slice route (int32 sums in L2)
# By default ("auto") the CPU slice route takes contractions of at least this length: shorter
# ones (a weight gradient over one 256-token sequence) run as fast on the float64 route, whose
# BLAS needs no digit passes (bench/oracle.py measures both).
SLICE_MIN_K = 512


def _slice_tile() -> tuple[int, int]:
    """The output tile of the CPU slice route: SLICE_TILE_M x SLICE_TILE_N on one thread, the
    columns times the thread count on more (the int8 GEMMs and the epilogue then split a tile)."""
    return SLICE_TILE_M, SLICE_TILE_N * max(1, torch.get_num_threads())


def _sliced_tiles(da: torch.Tensor, db: torch.Tensor, k: int, p: torch.Tensor, epilogue) -> int:
    """Tile by tile of the output (SLICE_TILE_M x SLICE_TILE_N, so the five int32 shift products
    stay in cache for their epilogue): the shift products of 3-digit operands (da [m, 3k] in digit
    order, db [n, 3k] reversed), each one torch._int_mm over the concatenated pairs, into the
    workspace p, then epilogue(tile [5, h, w], r0, c0). Returns the sum of what the epilogues
    return."""
    m, n = da.shape[0], db.shape[0]
    tm, tn = _slice_tile()
    total = 0
    for r0 in range(0, m, tm):
        r1 = min(m, r0 + tm)
        for c0 in range(0, n, tn):
            c1 = min(n, c0 + tn)
            tile = p[:5 * (r1 - r0) * (c1 - c0)].view(5, r1 - r0, c1 - c0)
            for t in range(5):
                i0, i1 = max(0, t - 2), min(t, 2)
                torch._int_mm(
                    da[r0:r1, i0 * k : (i1 + 1) * k],
                    db[c0:c1, (2 - t + i0) * k : (3 - t + i1) * k].t(),
                    out=tile[t],
                )
            total += epilogue(tile, r0, c0)
    return total


def _fast_sliced(a: torch.Tensor, b: torch.Tensor, k: int, s: int, rounded: bool):
    """The single-slice product on the CPU's int8 slice route, compiled: the quantiser writes
    int8 digits (kernels.quant_digits), each shift t's digit products sum_{i+j=t} A_i B_j are one
    torch._int_mm over the pairs' concatenated contraction (int32, exact: k * shift_bound <
    2^31), and the epilogue adds the shifts in int64 and scales and rounds (kernels.
    digits_round_f32 / digits_parts). One 2-D product (leading dims of size 1) of finite float32
    operands; None otherwise (the float64 route or the general path serves)."""
    w = SLICE_BITS["int8"]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, n = a.shape[-2], b.shape[-1]
    nd = slice_count(s, w)
    if math.prod(batch) != 1 or m == 0 or n == 0 or a.dtype != F32 or b.dtype != F32 or nd != 3 \
            or k * shift_bound(s, w) >= 2**31 or sliced_bound(k, s, s, w) >= INT64_BOUND:
        return None
    a2, b2 = a.reshape(m, k), b.reshape(k, n)
    ws = _ws
    if ws.busy:
        ws = None
    else:
        ws.busy = True
    try:
        da = _take(ws, "da", (m, nd * k), torch.int8)
        ea = _kernel_digits(a2, -1, s, False, da)
        if ea is None:
            return None
        db = _take(ws, "db", (n, nd * k), torch.int8)
        eb = _kernel_digits(b2, -2, s, True, db)  # digits in reverse order (see kernels)
        if eb is None:
            return None
        tm, tn = _slice_tile()
        p = _take(ws, "p", ((2 * nd - 1) * min(m, tm) * min(n, tn),), torch.int32)
        shape = batch + (m, n)
        if rounded:
            out = torch.empty(m, n, dtype=F32)
            if not _sliced_tiles(
                da, db, k, p, lambda t, r0, c0: kernels.digits_round_tile(t, ea, eb, s, out, r0, c0)
            ):
                return out.view(shape), None
        hi, lo = torch.empty(m, n, dtype=F64), None

        def parts(t, r0, c0):
            nonlocal lo
            if kernels.digits_parts_tile(t, ea, eb, s, hi, lo, r0, c0) and lo is None:
                # the first tile whose integers pass 2^53: from now on lo is written too (the
                # tiles before had lo = 0)
                lo = torch.zeros(m, n, dtype=F64)
                kernels.digits_parts_tile(t, ea, eb, s, hi, lo, r0, c0)
            return 0

        _sliced_tiles(da, db, k, p, parts)
        return hi.view(shape), (None if lo is None else lo.view(shape))
    finally:
        if ws is not None:
            ws.busy = False


def _kernel_quant_hilo(x: torch.Tensor, dim: int, s: int):
    if not kernels.enabled() or x.device.type != "cpu" or x.dtype != F32:
        return None
    t = (x if dim == -1 else x.transpose(-2, -1)).contiguous()
    res = kernels.quant_rows_hilo(t.reshape(-1, t.shape[-1]), s)
    if res is None:
        return None
    h, lo, e = (r.reshape(*t.shape[:-1], -1) for r in res)
    return (h, lo, e) if dim == -1 else tuple(r.transpose(-2, -1) for r in (h, lo, e))


def _fast_hilo(a: torch.Tensor, b: torch.Tensor, k: int, rounded: bool = False):
    """The hi/lo product with both operands sliced by the CPU kernel (finite inputs), or None.
    Same arithmetic as the general path. With `rounded`, a 2-D product comes back as its float32
    result (out, None) from one fused pass over the GEMM outputs (kernels.hilo_round_f32)."""
    s = hilo_bits(k)
    qa = _kernel_quant_hilo(a, -1, s)
    if qa is None:
        return None
    qb = _kernel_quant_hilo(b, -2, s)
    if qb is None:
        return None
    (ha, la, ea), (hb, lb, eb) = qa, qb
    top, mid = _hilo_products(ha, la, hb, lb, s)
    del ha, la, hb, lb
    if rounded and top.dim() == 2:
        out = kernels.hilo_round_f32(top, mid, ea.reshape(-1), eb.reshape(-1), s)
        if out is not None:
            return out, None
    return _hilo_finish(top, mid, ea, eb, s)


def _hilo_products(ha, la, hb, lb, s: int):
    """(top, mid) = (ha @ hb, ha @ lb + la @ hb): exact integers, both below 2^53."""
    route = gemm_route(ha.device)
    top = _exact_gemm(ha, hb, s, s, route)
    # exact: both below 2^52 (|lo| <= 2^(s-1))
    mid = _exact_gemm(ha, lb, s, s - 1, route).add_(_exact_gemm(la, hb, s - 1, s, route))
    return top, mid


def _hilo_finish(top, mid, ea, eb, s: int):
    """(hi, lo) of the hi/lo product from _hilo_products' (top, mid), top scaled in place."""
    two_s = pow2(torch.full((), s, dtype=torch.int64, device=top.device))
    top = top.mul_(two_s)  # exact: a power-of-two scale
    hi, lo = two_sum(top, mid)
    return _scale(hi, lo, pow2(ea - 2 * s), pow2(eb - s))


def _hilo_combine(ha, la, hb, lb, ea, eb, s: int):
    return _hilo_finish(*_hilo_products(ha, la, hb, lb, s), ea, eb, s)


def _scale(hi, lo, scale_a, scale_b):
    """(hi, lo) times the two exact power-of-two block scales (in place when shapes allow)."""
    if hi.shape == torch.broadcast_shapes(hi.shape, scale_a.shape, scale_b.shape):
        hi = hi.mul_(scale_a).mul_(scale_b)
    else:
        hi = hi * scale_a * scale_b
    if lo is not None:
        lo = lo * scale_a * scale_b
    return hi, lo


def _maxabs(x: torch.Tensor, dim: int) -> torch.Tensor:
    """max |x| along dim (kept), NaN if the line holds one (amax propagates NaN)."""
    return torch.amax(torch.abs(x), dim=dim, keepdim=True)


def _matmul_nonfinite(a: torch.Tensor, b: torch.Tensor):
    """Per output: (NaN, +inf, -inf) flags of the IEEE product sum, from counts of term classes.

    Counts come from float64 matmuls of 0/1 matrices (exact, order-free): a term is NaN if either
    factor is NaN or it is inf * 0; +inf if inf meets a factor of the same sign; -inf otherwise."""
    an, ap, am, az, apf, amf = _classes(a)
    bn, bp, bm, bz, bpf, bmf = _classes(b)
    ainf, binf = ap + am, bp + bm
    mm = torch.matmul
    nan_terms = mm(an, torch.ones_like(bn)) + mm(torch.ones_like(an) - an, bn) \
        + mm(ainf, bz) + mm(az, binf)
    pos = mm(ap, bp + bpf) + mm(am, bm + bmf) + mm(apf, bp) + mm(amf, bm)
    neg = mm(ap, bm + bmf) + mm(am, bp + bpf) + mm(apf, bm) + mm(amf, bp)
    return nan_terms > 0, pos > 0, neg > 0


def matmul_parts(a: torch.Tensor, b: torch.Tensor, variant: str = "single"):
    """The exact value of quantised a @ b as float64 parts (hi, lo); see _matmul_parts."""
    hi, lo, _ = _matmul_parts(a, b, variant)
    return hi, lo


def _matmul_parts(a: torch.Tensor, b: torch.Tensor, variant: str):
    """The exact value of quantised a[..., m, k] @ b[..., k, n] as float64 parts (hi, lo).

    Blocks: one per row of a along k, one per column of b along k. "single": dot_bits of the chunk
    length (k_chunks), the exact value is hi + lo (lo None when k fits one chunk). "hilo":
    hilo_bits(k) per slice, the exact value is hi + lo (hi = fl(value)). Non-finite entries
    follow IEEE classes (see _matmul_nonfinite)."""
    if variant not in ("single", "hilo"):
        raise ExactError(f"matmul variant must be 'single' or 'hilo', got {variant!r}")
    k = a.shape[-1]
    if b.shape[-2] != k:
        raise ExactError(
            f"matmul: inner sizes differ: a[..., {a.shape[-2]}, {k}] @ b[..., {b.shape[-2]}, {b.shape[-1]}]"
        )
    if k == 0:
        shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
        return torch.zeros(shape, dtype=F64, device=a.device), None, False
    fast = _fast_single(a, b, k) if variant == "single" else _fast_hilo(a, b, k)
    if fast is not None:
        return fast[0], fast[1], False
    amax, bmax = _maxabs(a, -1), _maxabs(b, -2)
    flags = None
    if not all_finite(amax, bmax):
        flags = _matmul_nonfinite(a.to(F64), b.to(F64))
        zero = torch.zeros((), dtype=a.dtype, device=a.device)
        a = torch.where(torch.isfinite(a), a, zero)
        b = torch.where(torch.isfinite(b), b, zero)
        amax, bmax = _maxabs(a, -1), _maxabs(b, -2)
    if variant == "single":
        nc, kc = k_chunks(k)
        s = dot_bits(kc)
        qa, ea = quantise(a, -1, s, amax)
        qb, eb = quantise(b, -2, s, bmax)
        hi, lo = _single_product(qa, qb, s, nc, kc, lambda: _one_gemm_is_exact(qa, qb))
        del qa, qb
        hi, lo = _scale(hi, lo, pow2(ea - s), pow2(eb - s))
    elif variant == "hilo":
        s = hilo_bits(k)
        ha, la, ea = quantise_hilo(a, -1, s, amax)
        hb, lb, eb = quantise_hilo(b, -2, s, bmax)
        hi, lo = _hilo_combine(ha, la, hb, lb, ea, eb, s)
    else:
        raise ExactError(f"matmul variant must be 'single' or 'hilo', got {variant!r}")
    if flags is not None:
        hi = apply_nonfinite(hi, *flags)
        if lo is not None:
            lo = torch.where(torch.isfinite(hi), lo, torch.zeros_like(lo))
    return hi, lo, flags is not None


def exact_matmul(a: torch.Tensor, b: torch.Tensor, variant: str = "single") -> torch.Tensor:
    """float32 result of the exact product of quantised a and b, rounded once."""
    fast_path = {"single": _fast_single, "hilo": _fast_hilo}.get(variant)
    if fast_path is not None and a.shape[-1] == b.shape[-2] and a.shape[-1] > 0:
        fast = fast_path(a, b, a.shape[-1], rounded=True)
        if fast is not None and fast[0].dtype == F32:
            return fast[0]
        if fast is not None:  # two words: round them once below
            hi, lo = fast
            if lo is not None and not bool(torch.any(lo != 0)):
                lo = None
            return to_f32_once(hi, lo)
    hi, lo, nonfinite = _matmul_parts(a, b, variant)
    if lo is not None and not bool(torch.any(lo != 0)):
        lo = None  # hi alone is exact: one conversion rounds it
    out = to_f32_once(hi, lo)
    # NaN only arises from non-finite inputs (finite sums are exact; overflow gives inf)
    return canon_nan(out) if nonfinite else out
