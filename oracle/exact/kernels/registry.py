"""Each kernel wrapper of oracle.exact.kernels beside the eager definition it mirrors, and the
cases on which the two must agree bit for bit.

An `Entry` names the wrapper (`kernel`), the eager definition (`eager`, "module:name"), a function
that runs that definition on the wrapper's arguments and returns what the wrapper returns
(`run_eager`; it writes what the wrapper writes into its output arguments), and the argument
tuples to compare them on (`cases`: edge values, non-finite values, empty inputs, random ones).
tests/oracle/test_kernel_registry.py runs every case of every entry and checks that every wrapper
of the package has an entry, so a kernel without an eager twin or without cases fails the suite.

A wrapper that returns None declines the input (a NaN in an optimizer update, inf or NaN in a
quantiser's block, the one hi/lo sign case): the caller then runs the eager code, so the eager
side of such a case returns None too.

oracle.exact.ops, accumulate and gemm and oracle.optim import the kernels, so the entries name
them and import them when a case runs (kernels.cases.resolve); a module-level import would
close a cycle. The cases themselves are in kernels.cases.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from oracle.exact import sqrt as xsqrt
from oracle.exact import transcendental as tx
from oracle.exact.kernels._numba import disabled
from oracle.exact.kernels.cases import (
    Args,
    ce_bwd_cases,
    ce_cases,
    digits_cases,
    epilogue_cases,
    f64_cases,
    fold_cases,
    fold_pair_cases,
    form_cases,
    grad_cases,
    hilo_round_cases,
    hilo_rows_cases,
    ln_bwd_cases,
    ln_cases,
    module,
    optim_cases,
    quant_cols_cases,
    quant_rows_cases,
    resolve,
    rows_bwd_cases,
    rows_cases,
    seq_cases,
    sos_cases,
    sqrt_cases,
    tile_cases,
    unary_cases,
)
from oracle.exact.quant import F32, F64, canon_nan, exact_sum64, pow2, quantise, quantise_hilo, to_f32_once

I64 = torch.int64


@dataclass(frozen=True)
class Entry:
    kernel: str                        # the wrapper's name in oracle.exact.kernels
    eager: str                         # "module:name" of the eager definition it mirrors
    run_eager: Callable[..., Any]      # that definition on the wrapper's arguments
    cases: Callable[[], Iterator[Args]]
    nan_payload: bool = True           # False: float64 NaN payloads may differ (words never rounded)


def _off(path: str) -> Callable[..., Any]:
    """The function at `path`, called with the kernels off: its eager branch (the definition)."""
    def call(*args: Any) -> Any:
        with disabled():
            return resolve(path)(*args)
    return call


def _ln_eager(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None,
              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ops = module("oracle.exact.ops")
    with disabled():
        y = ops.layer_norm(x, w, b, eps)
    mu, rstd = ops._ln_stats(x.to(F64), eps)
    return y, mu, rstd


def _ln_bwd_eager(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor | None, mu: torch.Tensor,
                  rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ops._LayerNorm.backward's eager branch, operation for operation."""
    C = x.shape[-1]
    x64, g64 = x.to(F64), g.to(F64)
    xhat = (x64 - mu) * rstd
    n = torch.full((), float(C), dtype=F64)
    gh = g64 * w.to(F64) if w is not None else g64
    m1 = exact_sum64(gh, -1, True) / n
    m2 = exact_sum64(gh * xhat, -1, True) / n
    return canon_nan((rstd * ((gh - m1) - xhat * m2)).to(F32)), g64 * xhat


def _sos_eager(flat: torch.Tensor, chunk: int, s: int) -> tuple[str | None, list[tuple[int, int]]]:
    """ops.sum_of_squares' eager terms of one tensor (its loop body, chunk and s as given)."""
    sq = flat.reshape(-1).to(F64) * flat.reshape(-1).to(F64)
    if not bool(torch.isfinite(sq).all()):
        return ("nan" if bool(torch.isnan(sq).any()) else "inf"), []
    pad = (-sq.numel()) % chunk
    if pad:
        sq = torch.cat([sq, torch.zeros(pad, dtype=F64)])
    q, e = quantise(sq.reshape(sq.numel() // chunk, chunk), 1, s)
    n = torch.sum(q, dim=1)  # exact: integers below 2^53
    return None, [
        (int(ni), int(ei)) for ni, ei in zip(n.tolist(), (e.squeeze(1) - s).tolist(), strict=True) if ni
    ]


# --- accumulate and sqrt -----------------------------------------------------------------------


def _fold_eager(hi: torch.Tensor, lo: torch.Tensor, values: torch.Tensor) -> int:
    step = resolve("oracle.exact.accumulate:_fold_step")
    h, low, bad = hi, lo, 0
    for b in range(values.shape[0]):
        h, low, n = step(h, low, values[b])
        bad += int(n)
    hi.copy_(h)
    lo.copy_(low)
    return bad


def _sqrt_eager(x: torch.Tensor) -> torch.Tensor:
    return xsqrt.sqrt32(x) if x.dtype == F32 else xsqrt.sqrt64(x)


# --- quantisers --------------------------------------------------------------------------------


def _lane_ss(q: torch.Tensor) -> float:
    """The largest row sum of q^2 in the row kernel's order: 32 lanes (index mod 32, each in index
    order), then the lanes added in lane order."""
    R, K = q.shape
    if R == 0:
        return 0.0
    acc = torch.zeros(R, 32, dtype=F64)
    KL = K - K % 32
    for j0 in range(0, KL, 32):
        acc += q[:, j0 : j0 + 32] * q[:, j0 : j0 + 32]
    acc[:, : K - KL] += q[:, KL:] * q[:, KL:]
    t = torch.zeros(R, dtype=F64)
    for lane in range(32):
        t += acc[:, lane]
    return float(t.max())


def _chain_ss(q: torch.Tensor) -> float:
    """The largest column sum of q^2 ([B, K, N]), each column added in k order."""
    acc = torch.zeros(q.shape[0], q.shape[2], dtype=F64)
    for k in range(q.shape[1]):
        acc += q[:, k] * q[:, k]
    return float(acc.max()) if acc.numel() else 0.0


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def _quant_rows_eager(
    x: torch.Tensor, s: int, out: torch.Tensor | None = None, need_ss: bool = True
) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    if not _finite(x):
        return None
    q, e = quantise(x, -1, s)
    if out is not None:
        q = out.copy_(q)
    return q, e, _lane_ss(q) if need_ss else 0.0


def _quant_cols_eager(
    x: torch.Tensor, s: int, out: torch.Tensor | None = None, need_ss: bool = True
) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    if not _finite(x):
        return None
    q, e = quantise(x, -2, s)
    if out is not None:
        q = out.copy_(q)
    K, N = x.shape[-2:]
    return q, e, _chain_ss(q.reshape(math.prod(x.shape[:-2]), K, N)) if need_ss else 0.0


def _hilo_rows_eager(x: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    return quantise_hilo(x, -1, s) if _finite(x) else None


# --- gemm epilogues and the slice route ------------------------------------------------------


def _digits_eager(x: torch.Tensor, s: int, rows: bool, rev: bool, out: torch.Tensor) -> torch.Tensor | None:
    """quant.quantise's integers as gemm._digits' three base-256 digits, laid out as the kernel's
    section comment says: block r's row holds digit 0 of its integers, then 1, then 2 (rev:
    reversed)."""
    blocks = x.shape[0] if rows else x.shape[1]
    if not x.numel():
        return torch.zeros(blocks, dtype=I64)
    if not _finite(x):
        return None
    q, e = quantise(x, -1 if rows else -2, s)
    d = resolve("oracle.exact.gemm:_digits")(q if rows else q.t(), 22, 8)
    out.copy_(torch.cat(d[::-1] if rev else d, dim=1))
    return e.reshape(-1)


def _tile_integer(P: torch.Tensor) -> torch.Tensor:
    n = torch.zeros(P.shape[1:], dtype=I64)
    for t in range(P.shape[0]):
        n += P[t].to(I64) << (8 * t)
    return n


def _tile_scales(
    ea: torch.Tensor, eb: torch.Tensor, s: int, r0: int, c0: int, h: int, w: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return pow2(ea[r0 : r0 + h] - s).unsqueeze(1), pow2(eb[c0 : c0 + w] - s).unsqueeze(0)


def _round_tile_eager(
    P: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int, out: torch.Tensor, r0: int, c0: int
) -> int:
    n = _tile_integer(P)
    h, w = n.shape
    hi, _ = resolve("oracle.exact.gemm:_scale")(n.to(F64), None, *_tile_scales(ea, eb, s, r0, c0, h, w))
    out[r0 : r0 + h, c0 : c0 + w] = canon_nan(to_f32_once(hi))
    return int(((n > 2**53) | (n < -(2**53))).sum())


def _parts_tile_eager(
    P: torch.Tensor,
    ea: torch.Tensor,
    eb: torch.Tensor,
    s: int,
    hi: torch.Tensor,
    lo: torch.Tensor | None,
    r0: int,
    c0: int,
) -> int:
    n = _tile_integer(P)
    h, w = n.shape
    ph, pl = resolve("oracle.exact.gemm:_int64_to_parts")(n)
    low = torch.zeros_like(ph) if pl is None else pl
    sh, sl = resolve("oracle.exact.gemm:_scale")(ph, low, *_tile_scales(ea, eb, s, r0, c0, h, w))
    hi[r0 : r0 + h, c0 : c0 + w] = sh
    if lo is not None:
        lo[r0 : r0 + h, c0 : c0 + w] = sl
    return int(torch.count_nonzero(low))


def _scale_round_eager(hi: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int) -> torch.Tensor:
    h, _ = resolve("oracle.exact.gemm:_scale")(
        hi.clone(), None, pow2(ea - s).unsqueeze(1), pow2(eb - s).unsqueeze(0)
    )
    return canon_nan(to_f32_once(h))


def _scale_parts_eager(x: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int) -> torch.Tensor:
    resolve("oracle.exact.gemm:_scale")(x, None, pow2(ea - s).unsqueeze(1), pow2(eb - s).unsqueeze(0))
    return x


def _hilo_round_eager(
    top: torch.Tensor, mid: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor, s: int
) -> torch.Tensor | None:
    """gemm._hilo_finish, then exact_matmul's rounding; None where every low word is zero and a -0
    high word meets a +0 low word (the kernel declines that case)."""
    hi, lo = resolve("oracle.exact.gemm:_hilo_finish")(top.clone(), mid, ea.unsqueeze(1), eb.unsqueeze(0), s)
    if not bool(torch.any(lo != 0)):
        if bool(torch.any((hi == 0) & torch.signbit(hi) & ~torch.signbit(lo))):
            return None
        return to_f32_once(hi)
    return to_f32_once(hi, lo)


# --- optimizer updates -------------------------------------------------------------------------


def _declining_nan(path: str) -> Callable[..., Any]:
    """The update at `path` with the kernels off; None where an output holds a NaN (the kernel
    declines those)."""
    run = _off(path)

    def call(*args: Any) -> Any:
        out = run(*args)
        return None if any(bool(torch.isnan(t).any()) for t in out) else out

    return call


# --- the registry ------------------------------------------------------------------------------

TX = "oracle.exact.transcendental"
OPS = "oracle.exact.ops"

ENTRIES: dict[str, Entry] = {
    e.kernel: e
    for e in [
        Entry("exp", f"{TX}:exp32", tx.exp32, unary_cases),
        Entry("gelu", f"{TX}:gelu32", tx.gelu32, form_cases(grad=False)),
        Entry("gelu_grad", f"{TX}:gelu_grad32", tx.gelu_grad32, form_cases(grad=True)),
        Entry("sigmoid", f"{TX}:sigmoid32", tx.sigmoid32, unary_cases),
        Entry("sigmoid_grad", f"{TX}:sigmoid_grad32", tx.sigmoid_grad32, grad_cases),
        Entry("silu", f"{TX}:silu32", tx.silu32, unary_cases),
        Entry("silu_grad", f"{TX}:silu_grad32", tx.silu_grad32, grad_cases),
        Entry("softmax_rows", f"{OPS}:softmax_rows_eager", _off(f"{OPS}:softmax_rows_eager"), rows_cases),
        Entry(
            "log_softmax_rows",
            f"{OPS}:log_softmax_rows_eager",
            _off(f"{OPS}:log_softmax_rows_eager"),
            rows_cases,
        ),
        Entry(
            "softmax_bwd_rows",
            f"{OPS}:softmax_bwd_rows_eager",
            _off(f"{OPS}:softmax_bwd_rows_eager"),
            rows_bwd_cases(f"{OPS}:softmax_rows_eager"),
        ),
        Entry(
            "log_softmax_bwd_rows",
            f"{OPS}:log_softmax_bwd_rows_eager",
            _off(f"{OPS}:log_softmax_bwd_rows_eager"),
            rows_bwd_cases(f"{OPS}:log_softmax_rows_eager"),
        ),
        Entry("ce_rows", f"{OPS}:ce_rows_eager", _off(f"{OPS}:ce_rows_eager"), ce_cases),
        Entry("ce_bwd_rows", f"{OPS}:ce_bwd_rows_eager", _off(f"{OPS}:ce_bwd_rows_eager"), ce_bwd_cases),
        Entry("layer_norm_rows", f"{OPS}:layer_norm", _ln_eager, ln_cases),
        Entry("layer_norm_bwd_rows", f"{OPS}:_LayerNorm.backward", _ln_bwd_eager, ln_bwd_cases),
        Entry("seq_sums", f"{OPS}:_seq_sums", _off(f"{OPS}:_seq_sums"), seq_cases),
        Entry("sum_of_squares_chunks", f"{OPS}:sum_of_squares", _sos_eager, sos_cases),
        Entry("fold_into", "oracle.exact.accumulate:_fold_step", _fold_eager, fold_cases, nan_payload=False),
        Entry(
            "fold_result",
            "oracle.exact.accumulate:_round",
            _off("oracle.exact.accumulate:_round"),
            fold_pair_cases,
        ),
        Entry(
            "f64_to_f32",
            "oracle.exact.accumulate:_round",
            lambda x: _off("oracle.exact.accumulate:_round")(x, None),
            f64_cases,
        ),
        Entry("sqrt", "oracle.exact.sqrt:sqrt32", _sqrt_eager, sqrt_cases),
        Entry("quant_rows", "oracle.exact.quant:quantise", _quant_rows_eager, quant_rows_cases),
        Entry("quant_cols", "oracle.exact.quant:quantise", _quant_cols_eager, quant_cols_cases),
        Entry("quant_rows_hilo", "oracle.exact.quant:quantise_hilo", _hilo_rows_eager, hilo_rows_cases),
        Entry("quant_digits", "oracle.exact.gemm:_digits", _digits_eager, digits_cases),
        Entry("digits_round_tile", "oracle.exact.gemm:_scale", _round_tile_eager, tile_cases(parts=False)),
        Entry(
            "digits_parts_tile",
            "oracle.exact.gemm:_int64_to_parts",
            _parts_tile_eager,
            tile_cases(parts=True),
        ),
        Entry("scale_round_f32", "oracle.exact.gemm:_scale", _scale_round_eager, epilogue_cases),
        Entry("scale_parts", "oracle.exact.gemm:_scale", _scale_parts_eager, epilogue_cases),
        Entry("hilo_round_f32", "oracle.exact.gemm:_hilo_finish", _hilo_round_eager, hilo_round_cases),
        Entry("adamw", "oracle.optim:adamw", _declining_nan("oracle.optim:adamw"), optim_cases("adamw")),
        Entry("sgd", "oracle.optim:sgd", _declining_nan("oracle.optim:sgd"), optim_cases("sgd")),
    ]
}
