"""Edge-case float32 inputs shared by the exact-v1 tests: zeros, subnormals, ties, extreme
exponents, overflow/underflow boundaries of exp and GELU, and non-finite values."""

from __future__ import annotations

import math

import numpy as np
import torch


def _neighbours(vals):
    out = []
    with np.errstate(over="ignore"):
        return _nb(vals, out)


def _nb(vals, out):
    for v in vals:
        f = np.float32(v)
        out += [f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))]
    return out


BASE = [
    0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 1.17549435e-38, 2.0**-149 * 3,
    1e-30, 1e-8, -1e-8, 2.0**-24, 0.5, -0.5, 1.0, -1.0, 1.5, 2.0, -2.0, 2.5, 3.0, 2.8284271, -2.8284271,
    5.656854, -5.656854, 10.0, -10.0, 14.0, -14.0, 20.0, -20.0, 38.89, -38.89,
    88.72283, 88.72284, 88.7229, 89.0, -87.33655, -103.97208, -104.0, -150.0, 200.0, -200.0,
    1e10, -1e10, 1e30, -1e30, 3.4028235e38, -3.4028235e38, 0.34657359, -0.34657359, 0.70710677, 1.4142135,
]
SPECIAL = [math.inf, -math.inf, math.nan]


def edge_values() -> torch.Tensor:
    vals = _neighbours(BASE) + [np.float32(v) for v in SPECIAL]
    arr = np.array(vals, dtype=np.float32)
    # a NaN with a payload and a negative sign: outputs must still be the canonical NaN
    odd_nan = np.array([0xFFC01234], dtype=np.uint32).view(np.float32)
    return torch.from_numpy(np.concatenate([arr, odd_nan]))


def random_values(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g) * 4
    b = torch.exp(torch.rand(n, generator=g) * 60 - 30) * torch.sign(torch.randn(n, generator=g))
    return torch.cat([a, b]).to(torch.float32)


def edge_rows() -> list[torch.Tensor]:
    """Rows for softmax-family kernels."""
    inf, nan = math.inf, math.nan
    rows = [
        [0.0, 0.0, 0.0, 0.0],
        [-0.0, 0.0, -0.0],
        [1.0],
        [1e-45, -1e-45, 0.0, 2e-45],
        [100.0, -100.0, 0.0, 50.0],
        [3.4e38, -3.4e38, 0.0],
        [-inf, 0.0, 1.0, -inf],
        [-inf, -inf, -inf],
        [inf, 0.0, 1.0],
        [nan, 0.0, 1.0],
        [1.0, 1.0 + 2**-23, 1.0 - 2**-24, 1.0],
        [88.0, -88.0, 20.0, -20.0, 0.5],
        [-1e30, -1e30, -1e30],
    ]
    return [torch.tensor(r, dtype=torch.float32) for r in rows]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)
