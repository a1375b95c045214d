"""The conformance cases of kernels.registry: argument tuples for each kernel wrapper, built from
edge values (both zeros, subnormals, the normal boundary, exp's and GELU's range bounds, the
largest finite values, inf, NaN with and without a payload), random values over wide exponent
ranges, non-finite blocks, empty inputs, and sizes around the kernels' block and tile widths.

Each `*_cases` function yields fresh tensors on every call. The eager code the cases need
(ops.ce_rows_eager to build the backward's inputs, ops._ln_stats, optim.Hyper) is imported by
name when a case is built (`resolve`): those modules import the kernels.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import torch

from oracle.exact.kernels._pool import PARALLEL_MIN_ELEMS
from oracle.exact.quant import F32, F64, sum_bits

Args = tuple[Any, ...]
I64 = torch.int64


def module(name: str) -> ModuleType:
    return importlib.import_module(name)


def resolve(path: str) -> Any:
    """The object a "module:name.attr" path names."""
    name, _, attr = path.partition(":")
    obj: Any = module(name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


_BASE = [0.0, 1e-45, 3e-45, 1.1754942e-38, 1.1754944e-38, 1e-30, 1e-8, 2.0**-24, 0.25, 0.5, 0.70710677, 1.0,
         1.5, 2.0, 2.5, 3.0, 5.656854, 6.0, 10.0, 14.0, 20.0, 38.9, 87.33655, 88.72283, 88.7229, 103.97208,
         150.0, 1e10, 1e30, 3.4028235e38]


def edge32() -> torch.Tensor:
    """float32 edge values: both zeros, subnormals, the normal boundary, the bounds of exp's and
    GELU's ranges, the largest finite value, each with both signs and its float32 neighbours;
    then inf, -inf, the canonical NaN and a negative NaN with a payload."""
    base = np.array(_BASE, dtype=np.float32)
    with np.errstate(over="ignore"):
        near = np.concatenate(
            [base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))]
        )
    vals = np.concatenate(
        [
            near,
            -near,
            np.array([np.inf, -np.inf, np.nan], np.float32),
            np.array([0xFFC01234], np.uint32).view(np.float32),
        ]
    )
    return torch.from_numpy(vals.astype(np.float32))


def rand32(n: int, seed: int, wide: bool = True) -> torch.Tensor:
    """n random float32 values: normal ones times 4, and (wide) as many over exponents +-43."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g) * 4
    if not wide:
        return a
    b = torch.exp(torch.rand(n, generator=g) * 60 - 30) * torch.sign(torch.randn(n, generator=g))
    return torch.cat([a, b]).to(F32)


def _mixed(n: int, seed: int) -> torch.Tensor:
    """edge32() and random values, shuffled, n of them (n <= the pool)."""
    pool = torch.cat([edge32(), rand32(max(n, 64), seed)])
    return pool[torch.randperm(pool.numel(), generator=torch.Generator().manual_seed(seed))][:n].contiguous()


def _rand(shape: tuple[int, ...], seed: int, scale: float = 1.0, dtype: torch.dtype = F32) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * scale).to(dtype)


def _finite_rows(seed: int) -> list[torch.Tensor]:
    """float32 matrices with finite values: random, wide exponents, subnormal, zero and single rows."""
    wide = rand32(320, seed)[320:].reshape(16, 20)
    zeros = torch.zeros(3, 7)
    zeros[1] = -0.0
    return [
        _rand((16, 40), seed, 3.0),
        wide,
        _rand((4, 33), seed + 1, 1e-39),
        zeros,
        _rand((5, 1), seed + 2),
        _rand((2, 70), seed + 3, 1e30),
    ]


def _with_nonfinite(x: torch.Tensor, v: float) -> torch.Tensor:
    y = x.clone()
    y.view(-1)[y.numel() // 2] = v
    return y


def unary_cases() -> Iterator[Args]:
    yield (torch.cat([edge32(), rand32(20000, 1)]),)
    yield (_mixed(513, 2).reshape(27, 19),)
    yield (torch.empty(0),)
    yield (torch.empty(3, 0),)
    yield (rand32(PARALLEL_MIN_ELEMS // 2 + 1, 8),)  # large enough for more than one thread


def grad_cases() -> Iterator[Args]:
    x = torch.cat([edge32(), rand32(20000, 3)])
    yield x, torch.cat([edge32().flip(0), rand32(20000, 4)])
    yield x, torch.ones_like(x)
    yield _mixed(513, 5), _mixed(513, 6)
    yield torch.empty(0), torch.empty(0)


def form_cases(grad: bool) -> Callable[[], Iterator[Args]]:
    def cases() -> Iterator[Args]:
        for form in ("tanh", "erf"):
            for args in grad_cases() if grad else unary_cases():
                yield (*args, form)
        for n in (1, 511, 512, 1537):  # the erf kernels work in blocks of 512
            x = _mixed(n, n)
            yield ((x, _mixed(n, n + 1), "erf") if grad else (x, "erf"))

    return cases


def _row_inputs() -> Iterator[torch.Tensor]:
    inf, nan = math.inf, math.nan
    for row in (
        [0.0, 0.0, 0.0],
        [-0.0, 0.0],
        [1.0],
        [1e-45, -1e-45, 0.0],
        [100.0, -100.0, 50.0],
        [3.4e38, -3.4e38, 0.0],
        [-inf, 0.0, 1.0],
        [inf, 0.0],
        [inf, inf],
        [-inf, -inf],
        [nan, 1.0],
        [inf, -inf, 0.0],
    ):
        yield torch.tensor([row], dtype=F32)
    yield _rand((64, 33), 7, 5.0)
    yield _rand((8, 1000), 8, 30.0)
    yield _rand((4, 17), 9, 1e-38)
    yield _mixed(128, 10).reshape(8, 16)


def rows_cases() -> Iterator[Args]:
    yield from ((x,) for x in _row_inputs())
    yield (torch.empty(0, 5),)


def rows_bwd_cases(forward: str) -> Callable[[], Iterator[Args]]:
    def cases() -> Iterator[Args]:
        f = resolve(forward)
        for i, x in enumerate(_row_inputs()):
            y = f(x)
            yield y, _rand(tuple(x.shape), 20 + i, 2.0)
            yield y, _mixed(x.numel(), 40 + i).reshape(x.shape)
        yield torch.empty(0, 5), torch.empty(0, 5)

    return cases


def ce_cases() -> Iterator[Args]:
    for x in _row_inputs():
        yield x, torch.arange(x.shape[0]) % x.shape[1]
    yield torch.empty(0, 5), torch.empty(0, dtype=I64)


def ce_bwd_cases() -> Iterator[Args]:
    ce = resolve("oracle.exact.ops:ce_rows_eager")
    for x, t in ce_cases():
        _, m, S = ce(x, t)
        for g, total in ((1.0, 7.0), (0.37, 1000.0), (-2.0, 3.0)):
            yield x, t, m, S, (torch.tensor(g, dtype=F64), torch.tensor(total, dtype=F64))


def ln_cases() -> Iterator[Args]:
    for i, x in enumerate([*_finite_rows(50), _mixed(96, 51).reshape(6, 16), torch.empty(0, 8)]):
        C = x.shape[1]
        w, b = _rand((C,), 60 + i, 1.5), _rand((C,), 70 + i)
        yield x, w, b, 1e-5
        yield x, None, None, 1e-6
        yield x, w, None, 1e-5


def ln_bwd_cases() -> Iterator[Args]:
    ops = module("oracle.exact.ops")
    for i, (x, w, _, eps) in enumerate(ln_cases()):
        mu, rstd = ops._ln_stats(x.to(F64), eps)
        yield x, _rand(tuple(x.shape), 80 + i, 0.7), w, mu, rstd


def seq_cases() -> Iterator[Args]:
    g = torch.Generator().manual_seed(90)
    v = torch.randn(3, 50, 7, generator=g, dtype=F64) * torch.exp(
        torch.randn(3, 50, 7, generator=g, dtype=F64) * 30
    )
    yield (v,)
    v2 = v.clone()
    v2[0, 3, 1], v2[1, 4, 2], v2[1, 5, 2], v2[2, 0, 0] = math.inf, math.inf, -math.inf, math.nan
    yield (v2,)
    yield (_rand((2, 9, 5), 91, 3.0),)  # float32 values
    yield (torch.zeros(2, 0, 3, dtype=F64),)
    yield (torch.empty(0, 4, 3, dtype=F64),)


def sos_cases() -> Iterator[Args]:
    for x in (
        rand32(70000, 92),
        _rand((1000,), 93, 1e-20),
        torch.zeros(10),
        _mixed(300, 94).nan_to_num(0.0, 0.0, 0.0),
        _with_nonfinite(_rand((500,), 95), math.inf),
        _with_nonfinite(_rand((500,), 96), math.nan),
    ):
        yield x, 1 << 16, sum_bits(1 << 16)
        yield x, 100, sum_bits(100)
    yield torch.zeros(0), 1 << 16, sum_bits(1 << 16)


def _fold_values(seed: int, nb: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp(torch.randn(nb, n, generator=g, dtype=F64) * 40)  # wide exponents: some inexact
    return torch.randn(nb, n, generator=g, dtype=F64) * mag


def fold_cases() -> Iterator[Args]:
    vals = _fold_values(100, 9, 2000)
    vals[3, :5] = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 1e308])
    vals[4, :5] = torch.tensor([-math.inf, 1.0, 2.0, -0.0, 1e308])
    yield torch.zeros(2000, dtype=F64), torch.zeros(2000, dtype=F64), vals
    h, lo = vals[0].clone(), _fold_values(101, 1, 2000)[0] * 1e-17
    yield h, lo, vals[5:]
    yield torch.zeros(0, dtype=F64), torch.zeros(0, dtype=F64), torch.zeros(3, 0, dtype=F64)


def fold_pair_cases() -> Iterator[Args]:
    for seed in (110, 111):
        v = _fold_values(seed, 2, 3000)
        h = v[0] + v[1]
        yield h, v[1] * 2.0**-53
    e = edge32().to(F64)
    yield e, torch.full_like(e, 2.0**-60)
    yield e, -e * 2.0**-30
    yield e, e.flip(0)
    yield torch.zeros(0, dtype=F64), torch.zeros(0, dtype=F64)


def f64_cases() -> Iterator[Args]:
    e = edge32().to(F64)
    yield (
        torch.cat(
            [
                e,
                e * (1 + 2.0**-30),
                e * (1 - 2.0**-40),
                torch.tensor([1e-320, 2.0**-150, 3.4028236e38, 1e300]),
            ]
        ),
    )
    yield (torch.tensor([0x7FF0000000000123, -0x0008000000000001], dtype=I64).view(F64),)  # NaN payloads
    yield (_fold_values(120, 1, 5000)[0],)
    yield (torch.zeros(0, dtype=F64),)


def sqrt_cases() -> Iterator[Args]:
    yield (torch.cat([edge32(), rand32(5000, 130).abs()]),)
    yield from f64_cases()
    yield (torch.empty(0),)


def quant_rows_cases() -> Iterator[Args]:
    for i, x in enumerate(_finite_rows(140)):
        yield x, 22
        yield x, 7, None, False
        yield x, 22, torch.empty(tuple(x.shape), dtype=F64), True
        yield _with_nonfinite(x, (math.inf, math.nan)[i % 2]), 22
    yield torch.empty(0, 6), 22


def quant_cols_cases() -> Iterator[Args]:
    for i, x in enumerate(_finite_rows(150)):
        yield x, 22
        yield x.t().contiguous(), 9, None, False
        yield torch.stack([x, -x, x * 0.5]), 22, torch.empty(3, *x.shape, dtype=F64)
        yield _with_nonfinite(x, (math.inf, math.nan)[i % 2]), 22
    yield _rand((40, 2100), 151, 2.0), 22  # wider than one column tile
    yield torch.empty(5, 0), 22


def hilo_rows_cases() -> Iterator[Args]:
    for i, x in enumerate(_finite_rows(160)):
        yield x, 22
        yield x, 12
        yield _with_nonfinite(x, (math.inf, math.nan)[i % 2]), 22
    yield torch.empty(0, 3), 22


def digits_cases() -> Iterator[Args]:
    for i, x in enumerate(_finite_rows(170)):
        for rows in (True, False):
            for rev in (False, True):
                blocks = x.shape[0] if rows else x.shape[1]
                k = x.shape[1] if rows else x.shape[0]
                yield x, (22, 7)[i % 2], rows, rev, torch.zeros(blocks, 3 * k, dtype=torch.int8)
        yield (
            _with_nonfinite(x, math.inf),
            22,
            True,
            False,
            torch.zeros(x.shape[0], 3 * x.shape[1], dtype=torch.int8),
        )
    yield (
        _rand((20, 1100), 171),
        22,
        False,
        False,
        torch.zeros(1100, 60, dtype=torch.int8),
    )  # three column tiles
    yield torch.empty(0, 4), 22, True, False, torch.zeros(0, 12, dtype=torch.int8)
    yield torch.empty(0, 4), 22, False, True, torch.zeros(4, 0, dtype=torch.int8)


def tile_cases(parts: bool) -> Callable[[], Iterator[Args]]:
    def cases() -> Iterator[Args]:
        g = torch.Generator().manual_seed(180 + parts)
        M, N = 40, 30
        for h, w, r0, c0, top in ((16, 30, 8, 0, 1 << 18), (5, 7, 33, 20, 1 << 18), (16, 30, 0, 0, 1 << 26)):
            P = torch.randint(-(1 << 24), 1 << 24, (5, h, w), generator=g, dtype=torch.int32)
            P[4] = torch.randint(-top, top, (h, w), generator=g, dtype=torch.int32)
            P[:, 0, :3] = 0
            ea = torch.randint(-40, 40, (M,), generator=g)
            eb = torch.randint(-40, 40, (N,), generator=g)
            if parts:
                yield (
                    P,
                    ea,
                    eb,
                    22,
                    torch.full((M, N), 7.0, dtype=F64),
                    torch.full((M, N), 7.0, dtype=F64),
                    r0,
                    c0,
                )
                yield P, ea, eb, 22, torch.full((M, N), 7.0, dtype=F64), None, r0, c0
            else:
                yield P, ea, eb, 22, torch.full((M, N), 7.0), r0, c0

    return cases


def epilogue_cases() -> Iterator[Args]:
    g = torch.Generator().manual_seed(190)
    for M, N in ((16, 30), (70, 5), (1, 1)):
        hi = torch.randint(-(1 << 50), 1 << 50, (M, N), generator=g).to(F64)
        yield hi, torch.randint(-60, 60, (M,), generator=g), torch.randint(-60, 60, (N,), generator=g), 22
    hi = torch.tensor([[0.0, -0.0, 1.0, -3.0], [2.0**52, 5.0, 7.0, 1.0]], dtype=F64)
    yield (
        hi,
        torch.tensor([-1000, 100]),
        torch.tensor([-60, 0, 60, -126]),
        22,
    )  # subnormal and overflowing results
    yield torch.zeros(0, 4, dtype=F64), torch.zeros(0, dtype=I64), torch.zeros(4, dtype=I64), 22


def hilo_round_cases() -> Iterator[Args]:
    g = torch.Generator().manual_seed(200)
    for M, N, lo_zero in ((16, 30, False), (9, 4, True), (1, 1, False)):
        top = torch.randint(-(1 << 40), 1 << 40, (M, N), generator=g).to(F64)
        mid = torch.randint(-(1 << 45), 1 << 45, (M, N), generator=g).to(F64)
        if lo_zero:
            mid = mid.round_(decimals=-6)
        yield (
            top,
            mid,
            torch.randint(-50, 50, (M,), generator=g),
            torch.randint(-50, 50, (N,), generator=g),
            22,
        )
    z = torch.full((2, 3), -0.0, dtype=F64)
    yield z, z.clone(), torch.zeros(2, dtype=I64), torch.zeros(3, dtype=I64), 22  # the declined sign case
    yield (
        torch.zeros(0, 2, dtype=F64),
        torch.zeros(0, 2, dtype=F64),
        torch.zeros(0, dtype=I64),
        torch.zeros(2, dtype=I64),
        22,
    )


def _hyper(kind: str, t: int, wd: float) -> Any:
    spec = module("commitments.spec").OptimizerSpec(
        kind=kind, lr=3e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=wd, momentum=0.9
    )
    return resolve("oracle.optim:Hyper").of(spec, t, "cpu")


def optim_cases(kind: str) -> Callable[[], Iterator[Args]]:
    def cases() -> Iterator[Args]:
        n = 3000
        p, g, m = _mixed(n, 210), _mixed(n, 211), rand32(n, 212, wide=False)
        v = rand32(n // 2, 213).abs()
        finite = [t.nan_to_num(0.0, 0.0, 0.0) for t in (p, g, m, v)]
        for t, wd, decay in ((1, 0.0, False), (1, 0.1, True), (1000, 0.1, False), (1000, 0.1, True)):
            hp = _hyper(kind, t, wd)
            for a in (finite, [p, g, m, v]):
                yield (*a, hp, decay) if kind == "adamw" else (a[0], a[1], a[2], hp, decay)
        z = torch.zeros(0)
        yield (
            (z, z, z, z, _hyper(kind, 1, 0.1), True)
            if kind == "adamw"
            else (z, z, z, _hyper(kind, 1, 0.1), True)
        )

    return cases
