"""Write exact_v1.json: conformance vectors of exact-v1 from the eager reference definitions.

Every value is a float32 bit pattern in hex (float64 ones as 16 hex digits). Another
implementation conforms if it reproduces every output from the inputs. Regenerate only when the
specification changes (docs/exact-v1.md), never to make a failing test pass:

    .venv/bin/python -m tests.oracle.vectors.make_vectors
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from oracle.exact import gemm as G
from oracle.exact import kernels, ops
from oracle.exact import quant as Q
from oracle.exact import sqrt as xsqrt
from oracle.exact import transcendental as tx
from tests.oracle.vectors.edge import edge_rows, edge_values

PATH = Path(__file__).with_name("exact_v1.json")


def hx(t: torch.Tensor) -> list[str]:
    t = t.contiguous()
    if t.dtype == torch.float64:
        return [f"{v:016x}" for v in t.view(torch.int64).reshape(-1).numpy().astype(np.uint64).tolist()]
    return [f"{v:08x}" for v in t.view(torch.int32).reshape(-1).numpy().astype(np.uint32).tolist()]


def unhx(vals: list[str], shape=None) -> torch.Tensor:
    if vals and len(vals[0]) == 16:
        arr = np.array([int(v, 16) for v in vals], dtype=np.uint64).view(np.float64)
    else:
        arr = np.array([int(v, 16) for v in vals], dtype=np.uint32).view(np.float32)
    t = torch.from_numpy(arr.copy())
    return t.reshape(shape) if shape is not None else t


def elementwise_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(20261129)
    rnd = torch.cat(
        [
            torch.randn(200, generator=g) * 3,
            torch.exp(torch.rand(100, generator=g) * 160 - 80) * torch.sign(torch.randn(100, generator=g)),
        ]
    )
    return torch.cat([edge_values(), rnd.float()])


ELEMENTWISE = {
    "exp": tx.exp32, "log": tx.log32, "tanh": tx.tanh32, "erf": tx.erf32, "sin": tx.sin32, "cos": tx.cos32,
    "gelu_tanh": lambda x: tx.gelu32(x, "tanh"), "gelu_erf": lambda x: tx.gelu32(x, "erf"),
    "sigmoid": tx.sigmoid32, "silu": tx.silu32,
}
# gradients g * f'(x) of the elementwise functions with a float64 derivative
ELEMENTWISE_GRAD = {"sigmoid_grad": tx.sigmoid_grad32, "silu_grad": tx.silu_grad32}


def grad_inputs(x: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return (torch.randn(x.shape, generator=g) * 2).float()


def row_cases():
    g = torch.Generator().manual_seed(11)
    cases = [r.unsqueeze(0) for r in edge_rows()]
    cases.append((torch.randn(4, 37, generator=g) * 6).float())
    return cases


def matmul_cases():
    g = torch.Generator().manual_seed(13)
    inf, nan = float("inf"), float("nan")
    out = []
    for m, k, n, spread in ((3, 5, 4, 1.0), (2, 600, 3, 4.0), (4, 7, 2, 30.0)):
        a = (torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g) * spread)).float()
        b = (torch.randn(k, n, generator=g) * torch.exp(torch.randn(k, n, generator=g) * spread)).float()
        out.append((a, b))
    out.append((((torch.rand(3, 6, generator=g) + 0.5) * 2.0**-70).float(),
                ((torch.rand(6, 3, generator=g) - 0.5) * 2.0**-70).float()))
    out.append((torch.tensor([[inf, 1.0], [inf, 0.0], [nan, 1.0], [1.0, 2.0]]),
                torch.tensor([[2.0, 0.0, -1.0], [1.0, 1.0, 1.0]])))
    out.append((torch.full((1, 4), 3e38), torch.full((4, 1), 2.0)))
    return out


def sum_cases():
    g = torch.Generator().manual_seed(17)
    return [
        (torch.randn(5, 300, generator=g) * torch.exp(torch.randn(5, 300, generator=g) * 5)).float(),
        torch.tensor([[1.0, float("inf"), 2.0], [float("inf"), float("-inf"), 0.0], [1e-45, 3e38, -3e38]]),
    ]


def _with_neighbours(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.concatenate(
            [a, np.nextafter(a, a.dtype.type(np.inf)), np.nextafter(a, a.dtype.type(-np.inf))]
        )


def sqrt_inputs32() -> torch.Tensor:
    """Edge values, exact squares (of integers and of 12-bit significands at many scales) and their
    neighbours, the ends of the binades [1, 2) and [2, 4) at several scales, random magnitudes."""
    g = np.random.default_rng(20261201)
    ints = np.arange(1, 4097, 37, dtype=np.float64) ** 2
    sig = (g.integers(2048, 4096, 40) * 2.0**-11) ** 2 * 4.0 ** g.integers(-70, 60, 40)
    ends = np.array([1.0, 2.0, 4.0, 2.0**-126, 2.0**-148, 2.0**-149, 2.0**126, 2.0**127])
    rnd = np.exp(g.uniform(-100, 88, 200)) * np.sign(g.standard_normal(200))
    vals = np.concatenate([_with_neighbours(np.concatenate([ints, sig, ends]).astype(np.float32)),
                           rnd.astype(np.float32)])
    return torch.cat([edge_values(), torch.from_numpy(vals)])


def sqrt_inputs64() -> torch.Tensor:
    """The same kinds of cases in binary64: zeros, subnormals, the normal/subnormal boundary,
    exact squares and their neighbours, binade ends, the largest finite values, non-finite."""
    g = np.random.default_rng(20261202)
    ints = g.integers(1, 2**26, 60).astype(np.float64) ** 2
    sig = (g.integers(2**25, 2**26, 40) * 2.0**-25) ** 2 * 4.0 ** g.integers(-530, 500, 40)
    ends = np.array(
        [
            1.0,
            2.0,
            4.0,
            0.25,
            2.0**-1022,
            2.0**-1074,
            2.0**-1073,
            2.0**-1050,
            2.0**1022,
            2.0**1023,
            float.fromhex("0x1.fffffffffffffp+1023"),
            float.fromhex("0x0.fffffffffffffp-1022"),
        ]
    )
    bits = g.integers(0, 0x7FF0000000000000, 200, dtype=np.int64).view(np.float64)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -2.0**-1074])
    payload = np.array([0xFFF8000000001234], dtype=np.uint64).view(np.float64)
    return torch.from_numpy(np.concatenate([_with_neighbours(np.concatenate([ints, sig, ends])), bits,
                                            special, payload]))


def layer_norm_cases():
    """(x, w, b) rows: the edge rows that hold no NaN or inf, and random rows at several scales."""
    g = torch.Generator().manual_seed(19)
    out = [(r.unsqueeze(0), None, None) for r in edge_rows() if bool(torch.isfinite(r).all())]
    for n, c, scale in ((4, 37, 6.0), (3, 64, 1e-3), (2, 768, 30.0)):
        x = (torch.randn(n, c, generator=g) * scale).float()
        out.append(
            (
                x,
                (1.0 + 0.1 * torch.randn(c, generator=g)).float(),
                (0.1 * torch.randn(c, generator=g)).float(),
            )
        )
    return out


def rms_norm_cases():
    """(x, w) rows: every edge row (non-finite ones included), a zero row, subnormal and huge rows,
    random rows at several scales with and without a weight."""
    g = torch.Generator().manual_seed(23)
    out = [(r.unsqueeze(0), None) for r in edge_rows()]
    out.append((torch.zeros(1, 5), None))
    out.append((torch.tensor([[1e-45, -3e-45, 1e-40, 0.0]]), None))
    out.append((torch.tensor([[3.4e38, -3.4e38, 1.0]]), None))
    for n, c, scale in ((4, 37, 6.0), (3, 64, 1e-3), (2, 768, 30.0)):
        x = (torch.randn(n, c, generator=g) * scale).float()
        out.append((x, (1.0 + 0.1 * torch.randn(c, generator=g)).float()))
    return out


def rope_cases():
    """(x [T, D], cos, sin): random rows on real tables (two bases), and edge values rotated."""
    g = torch.Generator().manual_seed(29)
    out = []
    for t, d, theta in ((7, 8, 10000.0), (5, 16, 500000.0)):
        c, s = tx.rope_tables(t, d, theta)
        out.append(((torch.randn(t, d, generator=g) * 3).float(), c, s))
    e = edge_values()
    n = (e.numel() // 8) * 8
    x = e[:n].reshape(-1, 8)
    c, s = tx.rope_tables(x.shape[0], 8, 10000.0)
    out.append((x, c, s))
    return out


ROPE_TABLES = ((64, 8, 10000.0), (33, 64, 500000.0), (4096, 2, 10000.0))


def build() -> dict:
    with kernels.disabled():
        x = elementwise_inputs()
        gi = grad_inputs(x)
        doc: dict = {"spec": "exact-v1", "note": "float32 bit patterns in hex; see docs/exact-v1.md",
                     "elementwise": {"x": hx(x), "g": hx(gi)}, "rows": [], "matmul": [], "sum": []}
        for name, fn in ELEMENTWISE.items():
            doc["elementwise"][name] = hx(fn(x))
        for form in ("tanh", "erf"):
            doc["elementwise"][f"gelu_{form}_grad"] = hx(tx.gelu_grad32(x, gi, form))
        for name, fn in ELEMENTWISE_GRAD.items():
            doc["elementwise"][name] = hx(fn(x, gi))
        for r in row_cases():
            gr = grad_inputs(r)
            p, y = ops.softmax_rows_eager(r), ops.log_softmax_rows_eager(r)
            doc["rows"].append({
                "shape": list(r.shape), "x": hx(r), "g": hx(gr), "softmax": hx(p), "log_softmax": hx(y),
                "softmax_bwd": hx(ops.softmax_bwd_rows_eager(p, gr)),
                "log_softmax_bwd": hx(ops.log_softmax_bwd_rows_eager(y, gr)),
            })
        for a, b in matmul_cases():
            doc["matmul"].append({"a_shape": list(a.shape), "b_shape": list(b.shape), "a": hx(a), "b": hx(b),
                                  "single": hx(G.exact_matmul(a, b, "single")),
                                  "hilo": hx(G.exact_matmul(a, b, "hilo"))})
        x32, x64 = sqrt_inputs32(), sqrt_inputs64()
        doc["sqrt"] = {"x32": hx(x32), "sqrt32": hx(xsqrt.sqrt32(x32)),
                       "x64": hx(x64), "sqrt64": hx(xsqrt.sqrt64(x64))}
        doc["layer_norm"] = []
        for x, w, b in layer_norm_cases():
            case = {"shape": list(x.shape), "eps": 1e-5, "x": hx(x), "y": hx(ops.layer_norm(x, w, b, 1e-5))}
            if w is not None:
                case |= {"w": hx(w), "b": hx(b)}
            doc["layer_norm"].append(case)
        doc["rms_norm"] = []
        for x, w in rms_norm_cases():
            gr = grad_inputs(x)
            y, rstd = ops.rms_norm_eager(x, w, 1e-6)
            dx, prod = ops.rms_norm_bwd_eager(x, gr, w, rstd)
            case = {"shape": list(x.shape), "eps": 1e-6, "x": hx(x), "g": hx(gr), "y": hx(y), "dx": hx(dx)}
            if w is not None:
                case |= {"w": hx(w), "dw": hx(Q.exact_sum64(prod, 0).float())}
            doc["rms_norm"].append(case)
        doc["rope"] = []
        for x, c, sn in rope_cases():
            gr = grad_inputs(x)
            doc["rope"].append({"shape": list(x.shape), "x": hx(x), "cos": hx(c), "sin": hx(sn), "g": hx(gr),
                                "y": hx(ops.rope_eager(x, c, sn)), "dx": hx(ops.rope_bwd_eager(gr, c, sn))})
        doc["rope_tables"] = []
        for t, d, theta in ROPE_TABLES:
            c, sn = tx.rope_tables(t, d, theta)
            doc["rope_tables"].append(
                {"n_pos": t, "head_dim": d, "theta": theta, "cos": hx(c), "sin": hx(sn)}
            )
        for s in sum_cases():
            doc["sum"].append(
                {
                    "shape": list(s.shape),
                    "x": hx(s),
                    "sum_dim1": hx(Q.exact_sum64(s, 1).float()),
                    "sum_all": hx(Q.exact_sum64(s, None).float()),
                }
            )
    return doc


if __name__ == "__main__":
    PATH.write_text(json.dumps(build(), indent=0) + "\n")
    print(f"wrote {PATH}")
