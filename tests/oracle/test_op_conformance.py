"""Op-level conformance at every ATEN_CPU_CAPABILITY this CPU offers: every allowed arithmetic op
of exact-v1 (oracle.exact.allowed_ops) equals a reference correct by construction, result for
result, on >= 2^16 random and edge inputs, contiguous and strided (tests/oracle/op_conformance.py,
one child process per capability). A twice-rounded square root is the positive control; stock
torch.sqrt, the op that broke exact-v1 on x86, is measured."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oracle.exact import allowed_ops as A
from tests.oracle import op_conformance as C

ROOT = Path(__file__).resolve().parents[2]


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def capabilities() -> list[dict]:
    """Environment of each child: every dispatch level ATen has that this CPU can run (its own
    choice, torch.backends.cpu.get_cpu_capability(), among them), MKL held to AVX2 with AVX2."""
    flags = _cpu_flags()
    out = [{"ATEN_CPU_CAPABILITY": "default"}]
    if platform.machine() in ("x86_64", "AMD64"):
        if {"avx2", "fma"} <= flags:
            out.append({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"})
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            out.append({"ATEN_CPU_CAPABILITY": "avx512"})
    own = torch.backends.cpu.get_cpu_capability().lower()
    if own not in {c["ATEN_CPU_CAPABILITY"] for c in out}:
        out.append({"ATEN_CPU_CAPABILITY": own})
    return out


def _child(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "tests.oracle.op_conformance"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{env_extra}: {r.stderr[-2000:]}"
    return json.loads(r.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def results():
    return [(c, _child(c)) for c in capabilities()]


def test_every_checked_op_has_a_case():
    covered = {n for covers, _ in C.CASES.values() for n in covers}
    checked = {n for table in (A.TORCH_NAMES, A.TENSOR_METHODS, A.OPERATORS) for n, cls in table.items()
               if cls in A.CHECKED}
    assert checked <= covered, f"allowed ops without a conformance case: {sorted(checked - covered)}"
    assert "oracle.exact.sqrt" in covered


def test_allowed_ops_equal_the_reference_at_every_capability(results):
    for env, res in results:
        want = env["ATEN_CPU_CAPABILITY"].upper()
        assert res["capability"].upper() == want, f"asked for {want}, torch runs {res['capability']}"
        bad = {k: v for k, v in res["mismatches"].items() if v}
        assert not bad, f"{want}: results that differ from the reference: {bad}"
        # (reductions count their outputs; each reduces >= 2^16 inputs)
        small = {k: v for k, v in res["elements"].items()
                 if v < 1 << 16 and not k.startswith(("exact_sums", "reduce"))}
        assert not small, f"cases below 2^16 elements (the libraries' vectorised paths): {small}"
        assert res["spot_checks"] == 0, f"{want}: numpy's references disagree with Python floats/fractions"


def test_the_harness_catches_a_twice_rounded_sqrt(results):
    """Positive control: a square root rounded twice (x * rsqrt(x)) differs from the correctly
    rounded one on some of 2^16 inputs on every machine, and the harness sees it at every
    capability, contiguous and strided. (Stock torch.sqrt, the op that broke exact-v1 on x86,
    is still measured, `torch.sqrt_f32` among the controls, but not asserted: through MKL's
    vector library it was not correctly rounded on the AMD machines it was first measured on,
    while Intel Xeons at AVX2 round it correctly. That it depends on the CPU is why exact paths
    never use it; oracle.exact.sqrt is the definition.)"""
    for env, res in results:
        c = res["controls"]
        assert c["rsqrt_mul_f32"] > 0 and c["rsqrt_mul_f32_strided"] > 0, env

