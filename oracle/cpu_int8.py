"""Whether this CPU's int8 GEMM (torch._int_mm) can serve exact-v1's integer products.

Outside the exact path: it only decides which route computes the exact integer (every route
gives the same bytes, docs/exact-v1.md §13), so it may use any torch operation. The CPU slice
route needs an int8 GEMM that is exact in int32 for the sums it asks for (up to 2^31 - 2^14) and
many times faster than the float64 GEMM: oneDNN's AMX kernels are; AVX-512 VNNI ones are exact
but, at nine digit products per product, no faster than DGEMM; AVX2 ones saturate int16 pair sums.
"""

from __future__ import annotations

import torch

I64 = torch.int64


def int_mm_probe() -> bool:
    """torch._int_mm on this CPU against exact integer products: the extreme digit products the
    CPU route concatenates (sums up to 2^31 - 2^14, where a saturating or 16-bit-pair kernel
    fails) and random digits of every sign, in the layouts the route passes (the second operand
    column-major)."""
    k = (1 << 17) - 1
    for x, y in ((-128, -128), (127, -128), (-128, 127), (64, -128)):
        a = torch.full((17, k), x, dtype=torch.int8)
        b = torch.full((8, k), y, dtype=torch.int8).t()
        if not bool(torch.all(torch._int_mm(a, b).to(I64) == k * x * y)):
            return False
    g = torch.Generator().manual_seed(20261202)
    for m, kk, n in ((33, 1000, 24), (1, 7, 1), (40, 333, 65)):
        a = torch.randint(-128, 128, (m, kk), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (n, kk), generator=g, dtype=torch.int8).t()
        want = (a.to(I64).unsqueeze(2) * b.to(I64).unsqueeze(0)).sum(1)
        if not torch.equal(torch._int_mm(a, b).to(I64), want):
            return False
    return True


def has_amx() -> bool:
    """AMX tiles on this CPU, as torch (its oneDNN) sees them."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def fast_and_exact() -> bool:
    """torch reaches oneDNN, the CPU has AMX tiles, and torch._int_mm passes the probe (a build
    whose torch._int_mm refuses CPU tensors counts as no)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and has_amx()):
        return False
    try:
        return int_mm_probe()
    except (RuntimeError, NotImplementedError):
        return False
