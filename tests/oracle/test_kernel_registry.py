"""Every kernel wrapper of oracle.exact.kernels equals its eager twin bit for bit, on the cases
oracle.exact.kernels.registry gives it; and every wrapper has an entry there (DESIGN §3 rule 6).

The tests are generated from the registry: one per entry, each running all its cases, comparing
what the wrapper returns and what it writes into its arguments with what the eager definition
returns and writes. A wrapper added to the package without an entry, or an entry without cases
or with an eager definition that does not resolve, fails here.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch

from oracle.exact import kernels
from oracle.exact.kernels import _wrap
from oracle.exact.kernels.registry import ENTRIES, Entry, resolve

pytestmark = pytest.mark.skipif(not kernels.enabled(), reason="numba kernels not available")

_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def _difference(a: Any, b: Any, nan_payload: bool, where: str = "result") -> str | None:
    """None if a and b are the same bytes (tensors: dtype, shape and bits; NaN payloads of float64
    tensors only if nan_payload), else where they first differ."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} against {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype} {list(a.shape)} against {b.dtype} {list(b.shape)}"
        if a.dtype in _INT:
            ab, bb = a.contiguous().view(_INT[a.dtype]), b.contiguous().view(_INT[b.dtype])
            if not nan_payload and a.dtype == torch.float64:
                na, nb = torch.isnan(a), torch.isnan(b)
                if not torch.equal(na, nb):
                    return f"{where}: NaN at different places"
                ab, bb = ab[~na], bb[~nb]
        else:
            ab, bb = a, b
        diff = (ab != bb).nonzero()
        return (
            None
            if diff.numel() == 0
            else f"{where}: {diff.shape[0]} elements differ, first at {diff[:3].tolist()}"
        )
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = _difference(x, y, nan_payload, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, float) and isinstance(b, float):
        same = math.isnan(a) and math.isnan(b) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        return None if same else f"{where}: {a!r} against {b!r}"
    return None if type(a) is type(b) and a == b else f"{where}: {a!r} against {b!r}"


def _copy(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _describe(args: tuple[Any, ...]) -> str:
    return ", ".join(
        f"{a.dtype} {list(a.shape)}" if isinstance(a, torch.Tensor) else repr(a)[:40] for a in args
    )


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_kernel_equals_its_eager_twin(name):
    entry = ENTRIES[name]
    wrapper = getattr(kernels, name)
    n = 0
    for i, args in enumerate(entry.cases()):
        k_args, e_args = _copy(args), _copy(args)
        got = wrapper(*k_args)
        want = entry.run_eager(*e_args)
        d = _difference(got, want, entry.nan_payload)
        if d is None and got is not None:  # a declined call may leave its outputs half written
            d = _difference(k_args, e_args, entry.nan_payload, "arguments after the call")
        assert d is None, f"{name} case {i} ({_describe(args)}): {d}"
        n += 1
    assert n >= 3, f"{name}: only {n} cases"


def _public_functions() -> set[str]:
    names = set()
    for m in kernels.KERNEL_MODULES:
        for n, f in vars(m).items():
            if inspect.isfunction(f) and f.__module__ == m.__name__ and not n.startswith("_"):
                names.add(n)
    return names


def test_every_kernel_wrapper_has_an_entry():
    public = _public_functions()
    wrapped = {n for n in _wrap.WRAPPERS if not n.startswith("_")}
    # kernels.sqrt dispatches (CPU kernel or definition); its compiled wrapper is sqrt's private one
    assert public == wrapped | {"sqrt"}, public ^ (wrapped | {"sqrt"})
    assert set(ENTRIES) == public, set(ENTRIES) ^ public
    for n in public:
        assert getattr(kernels, n) is not None, f"kernels.{n} is not re-exported"


def test_every_entry_names_a_resolvable_definition_and_empty_input():
    for name, entry in ENTRIES.items():
        assert isinstance(entry, Entry) and entry.kernel == name
        assert callable(resolve(entry.eager)), entry.eager
        cases = list(entry.cases())
        assert cases, f"{name} has no cases"
        if name not in ("digits_round_tile", "digits_parts_tile"):  # fixed-size tiles of a GEMM's output
            firsts = [next(a for a in c if isinstance(a, torch.Tensor)) for c in cases]
            assert any(t.numel() == 0 for t in firsts), f"{name}: no empty-input case"


def test_difference_sees_one_bit():
    a = torch.tensor([1.0, -0.0, math.nan])
    assert _difference(a, a.clone(), True) is None
    assert _difference(a, torch.tensor([1.0, 0.0, math.nan]), True) is not None
    b = a.clone()
    b.view(torch.int32)[0] += 1
    assert _difference(a, b, True) is not None
    x = torch.tensor([math.nan], dtype=torch.float64)
    y = torch.tensor([0x7FF0000000000123], dtype=torch.int64).view(torch.float64)
    assert _difference(x, y, True) is not None and _difference(x, y, False) is None
    assert _difference((1, None), (1, None), True) is None and _difference(0.0, -0.0, True) is not None


def test_a_wrong_kernel_fails_the_comparison():
    """The comparison the generated tests run catches a kernel that differs in one element."""
    entry = ENTRIES["exp"]
    (x,) = next(entry.cases())
    wrong = kernels.exp(x)
    wrong[7] = torch.nextafter(wrong[7], torch.tensor(math.inf))
    assert _difference(wrong, entry.run_eager(x), True) is not None
