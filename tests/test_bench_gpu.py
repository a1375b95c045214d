"""bench/gpu.sh's CPU half: without CUDA it walks a narrowed gpt-tiny on the CPU on every
integer-GEMM route (float64 GEMMs, 7- and 8-bit int8 slices) and the digests must agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_sh_cpu_half_gives_identical_digests_on_every_route():
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--quick", "--cpu-only"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"] and not out["cuda"] and out["quick"]
    (walks,) = out["digests"].values()
    assert walks["identical"] and walks["steps"] == 2
    runs = walks["runs"]
    assert [(x["device"], x["route"]) for x in runs] == [("cpu", "dgemm"), ("cpu", "int7"), ("cpu", "int8")]
    assert all(x["match"] and len(x["digests"]) == 3 for x in runs)
    assert len(set(runs[0]["digests"])) == 3  # init and two distinct steps
    assert "digests" in r.stderr and "all digests identical" in r.stderr
