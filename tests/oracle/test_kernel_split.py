"""The kernels that split a serial body over threads (kernels._split): the same bytes at any
thread count and split, with the eager definitions as the reference, and a part that raises is
waited for and reported."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from oracle.exact import kernels, quant

pytestmark = pytest.mark.skipif(not kernels.enabled(), reason="compiled kernels are off")

THREADS = (1, 2, 3, 4, 7)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _hostile(g, shape):
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-40, 40, shape, generator=g).float())
    flat = x.view(-1)
    flat[::97] = 0.0
    flat[5::131] = -0.0
    flat[7::173] = 1e-41  # subnormal
    return x


@pytest.mark.parametrize("shape", [(8, 40), (13, 3000), (257, 1031), (1024, 768)])
def test_quant_rows_is_the_same_at_every_split(shape):
    g = torch.Generator().manual_seed(3)
    x = _hostile(g, shape)
    ref_q, ref_e = quant.quantise(x, -1, 22)
    one = kernels.quant_rows.__wrapped__(x, 22, threads=1)
    for t in THREADS:
        q, e, ss = kernels.quant_rows.__wrapped__(x, 22, threads=t)
        assert _bits(q) == _bits(ref_q) and torch.equal(e, ref_e), t
        assert ss == one[2], t  # the same largest row sum of squares, added in lane order


@pytest.mark.parametrize("shape", [(16, 40), (768, 769), (3, 300, 2050), (2, 64, 64), (1, 5000, 17)])
def test_quant_cols_is_the_same_at_every_split(shape):
    g = torch.Generator().manual_seed(4)
    x = _hostile(g, shape)
    ref_q, ref_e = quant.quantise(x, -2, 22)
    one = kernels.quant_cols.__wrapped__(x, 22, threads=1)
    for t in THREADS:
        q, e, ss = kernels.quant_cols.__wrapped__(x, 22, threads=t)
        assert _bits(q) == _bits(ref_q) and torch.equal(e, ref_e), t
        assert ss == one[2], t  # the same largest column sum of squares, added in k order


def test_col_tiles_cover_every_column_and_divide_the_work():
    for B, N, t in [(1, 768, 2), (1, 3072, 2), (1, 40, 2), (3, 768, 2), (1, 50304, 4), (1, 16, 8), (5, 1, 3)]:
        tile = kernels._col_tile(B, N, t)
        assert 16 <= tile <= kernels._COL_TILE or (N < 16 and tile == 16)
        assert -(-N // tile) >= min(-(-N // kernels._COL_TILE), 1)


def test_a_block_holding_nan_or_inf_gives_none_at_every_split():
    x = torch.randn(512, 700)
    x[301, 5] = float("nan")
    xc = torch.randn(700, 512)
    xc[699, 511] = float("inf")  # the last column, in the last tile
    for t in THREADS:
        assert kernels.quant_rows.__wrapped__(x, 22, threads=t) is None
        assert kernels.quant_cols.__wrapped__(xc, 22, threads=t) is None


def test_epilogues_are_the_same_at_every_split():
    g = torch.Generator().manual_seed(5)
    m, n = 531, 777
    hi = torch.randint(-2**40, 2**40, (m, n), generator=g).double()
    ea = torch.randint(-150, 120, (m,), generator=g)
    eb = torch.randint(-150, 120, (n,), generator=g)
    ref = ((hi * quant.pow2(ea - 22)[:, None]) * quant.pow2(eb - 22)[None, :])
    for t in THREADS:
        out = kernels.scale_round_f32.__wrapped__(hi, ea, eb, 22, threads=t)
        assert _bits(out) == _bits(quant.canon_nan(ref.to(torch.float32))), t
        x = hi.clone()
        kernels.scale_parts.__wrapped__(x, ea, eb, 22, threads=t)
        assert _bits(x) == _bits(ref), t


def test_hilo_epilogue_is_the_same_at_every_split():
    from oracle.exact import gemm

    g = torch.Generator().manual_seed(6)
    m, n, s = 301, 419, 21
    top = torch.randint(-2**50, 2**50, (m, n), generator=g).double()
    mid = torch.randint(-2**52, 2**52, (m, n), generator=g).double()
    ea = torch.randint(-60, 60, (m,), generator=g)
    eb = torch.randint(-60, 60, (n,), generator=g)
    hi, lo = gemm._hilo_finish(top.clone(), mid, ea[:, None], eb[None, :], s)
    ref = quant.to_f32_once(hi, lo)
    for t in THREADS:
        assert _bits(kernels.hilo_round_f32.__wrapped__(top, mid, ea, eb, s, threads=t)) == _bits(ref), t


def test_a_part_that_raises_is_waited_for_and_reported():
    finished = []
    gate = threading.Event()

    def part(tag, i0, i1):
        if i0 == 0:
            gate.wait(5)  # the first part is still running when the last one raises
            finished.append((i0, i1))
            return 1
        if i1 == 30:
            gate.set()
            raise ValueError(f"bad part {tag}")
        return 1

    with pytest.raises(ValueError, match="bad part x"):
        kernels._split(part, ("x",), 30, 3)
    assert finished == [(0, 10)]  # the raise waited for the other parts
    assert kernels._split(lambda i0, i1: i1 - i0, (), 100, 4, align=8) == 100
    assert kernels._split(lambda i0, i1: None, (), 0, 4) == 0
    seen = []
    kernels._split(lambda i0, i1: seen.append((i0, i1)), (), 100, 4, align=8)
    assert sorted(seen) == [(0, 32), (32, 64), (64, 96), (96, 100)]


def test_concurrent_callers_share_the_pool():
    x = torch.randn(1024, 1024)
    ref = _bits(kernels.quant_rows.__wrapped__(x, 22, threads=1)[0])
    errors, outs = [], []

    def run():
        try:
            for _ in range(5):
                outs.append(_bits(kernels.quant_rows.__wrapped__(x, 22, threads=2)[0]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run) for _ in range(4)]
    for th in ts:
        th.start()
    for th in ts:
        th.join(60)
    assert not errors and len(outs) == 20 and set(outs) == {ref}
    assert np.isfinite(x.numpy()).all()


FORK_SCRIPT = """
import hashlib, os, signal, sys, torch
from oracle.exact import kernels
signal.alarm(40)  # a hung child or parent ends here, not in the test's timeout
x = torch.randn(1024, 512, generator=torch.Generator().manual_seed(1))
def digest():  # no torch op in the child: torch's OpenMP pool does not survive a fork
    return hashlib.sha256(kernels.quant_rows.__wrapped__(x, 22, threads=2)[0].numpy().tobytes()).hexdigest()
ref = digest()  # the parent's pool threads are up
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(30)
    os.write(w, str(digest()).encode())  # a child with none of those threads
    os._exit(0)
os.close(w)
got = os.read(r, 100).decode()
_, status = os.waitpid(pid, 0)
print(ref, got, status)
sys.exit(0 if got == str(ref) and status == 0 else 1)
"""


def test_a_forked_child_gets_a_pool_of_its_own():
    # In a fresh process, so that only this module's threads exist when it forks (a fork of the
    # suite's process inherits the locks of every thread the earlier tests left behind).
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", FORK_SCRIPT], cwd=root, capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
