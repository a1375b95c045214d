"""Exact data parallelism: a step split over ranks gives the bytes of the one-process step.

The fold hand-over (a deferred accumulator continuing the fold state of the sequences before it)
is tested in process, inexact folds included; the whole step over gloo with real processes on
localhost (N = 3 and 4 on a batch of 8: shards 3/3/2 and 2/2/2/2) is the slow test; N = 2 runs
through `pot miner train --nproc 2` in tests/miner/test_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oracle.exact import ExactError, ExactGradAccumulator
from oracle.exact.grads import micro_batch_grads, run_micro_batches
from oracle.parallel import shards
from oracle.profiles import ProfileError
from oracle.step import StepError, init_state, step
from tests.oracle.test_exact_accumulate import B, _data, _forward, _params
from tests.oracle.vectors.edge import bits

ROOT = Path(__file__).resolve().parents[2]


def _chain(P, fwd, tgt, cuts, mb=1):
    """The fold handed along ranks in process: rank r covers cuts[r]..cuts[r+1]-1."""
    names = list(P)
    state = None
    for r in range(len(cuts) - 1):
        lo, hi = cuts[r], cuts[r + 1]
        leaves = {n: P[n].detach().clone().requires_grad_(True) for n in names}
        acc = ExactGradAccumulator([leaves[n] for n in names], deferred=r > 0)
        n_mb = min(mb, hi - lo)
        step_ = (hi - lo) // n_mb
        slices = [(lo + i * step_, hi if i == n_mb - 1 else lo + (i + 1) * step_) for i in range(n_mb)]
        run_micro_batches(acc, fwd, leaves, tgt, slices, rows=(lo, hi), total_count=tgt.numel())
        if state is not None:
            acc.continue_from(state)
        state = acc.fold_state()
    return acc.loss(), acc.grads()


@pytest.mark.parametrize("variant", ["single", "hilo"])
@pytest.mark.parametrize("cuts", [[0, 3, 6, 8], [0, 1, 8], [0, 2, 4, 6, 8]], ids=["3-3-2", "1-7", "2x4"])
def test_fold_handed_along_ranks_equals_one_process(variant, cuts):
    P = _params(7, tied=True)
    idx, tgt, mask = _data(8)

    def fwd(leaves, lo, hi):
        return _forward(leaves, idx[lo:hi], variant, mask[lo:hi])
    loss1, g1 = micro_batch_grads(fwd, P, tgt, [(0, B)])
    loss_n, g_n = _chain(P, fwd, tgt, cuts, mb=2)
    assert bits(loss_n) == bits(loss1)
    for a, b in zip(g1, g_n, strict=True):
        assert torch.equal(bits(a), bits(b))


def test_hand_over_keeps_the_bytes_of_an_inexact_fold():
    # 2^100, 1, 2^-100 in one element: the third add is inexact (f != 0). The fold handed over
    # after each prefix still gives the one-process bytes, because it runs the same operations.
    w = torch.zeros(2, dtype=torch.float32, requires_grad=True)
    vals = torch.tensor(
        [[2.0**100, 3.0], [1.0, 2.0**-30], [2.0**-100, -3.0], [-(2.0**100), 1.0]], dtype=torch.float64
    )

    def fold_in(acc, rows):
        with acc.micro_batch():
            acc.deposit(w, vals[rows[0]:rows[1]])

    one = ExactGradAccumulator([w])
    fold_in(one, (0, 4))
    assert one.inexact_count > 0
    for cut in (1, 2, 3):
        first = ExactGradAccumulator([w])
        fold_in(first, (0, cut))
        second = ExactGradAccumulator([w], deferred=True)
        fold_in(second, (cut, 4))
        second.continue_from(first.fold_state())
        assert torch.equal(bits(second.grads()[0]), bits(one.grads()[0])), cut
        assert second.inexact_count == one.inexact_count


def test_deferred_accumulator_refuses_results_before_the_hand_over():
    w = torch.zeros(2, dtype=torch.float32, requires_grad=True)
    acc = ExactGradAccumulator([w], deferred=True)
    with acc.micro_batch():
        acc.deposit(w, torch.ones(1, 2, dtype=torch.float64))
    for call in (acc.grads, acc.loss, acc.fold_state):
        with pytest.raises(ExactError, match="deferred"):
            call()
    with pytest.raises(ExactError, match="deferred=True"):
        ExactGradAccumulator([w]).continue_from(acc)


def test_shards_are_whole_sequences_and_refuse_more_ranks_than_sequences():
    assert shards(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert shards(8, 1) == [(0, 8)]
    with pytest.raises(ProfileError, match="each rank needs one"):
        shards(2, 3)


def test_step_refuses_parallel_torch_native_and_too_many_ranks():
    from commitments.spec import Spec
    from oracle.parallel import Ranks

    base = {
        "model": {"kind": "mlp", "block_size": 8, "hidden": [8]},
        "batch": {"batch_size": 2, "seq_len": 8},
    }
    native = Spec.from_dict(base | {"profile": "torch-native", "hardware": {"device": "cpu"}})
    batch = torch.zeros(2, 9, dtype=torch.int64)
    with pytest.raises(StepError, match="needs profile exact-v1"):
        step(init_state(native), batch, native, 1, ranks=Ranks(0, 2))
    exact = Spec.from_dict(base)
    with pytest.raises(StepError, match="3 ranks cannot share a batch of 2"):
        step(init_state(exact), batch, exact, 1, ranks=Ranks(0, 3))


SPEC = {"model": {"kind": "gpt", "vocab_size": 64, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16,
                  "dropout": 0.1},
        "optimizer": {"kind": "adamw", "lr": 1e-2, "weight_decay": 0.1, "grad_clip": 1.0},
        "batch": {"batch_size": 8, "seq_len": 8}, "rng": {"seed": 5}}
STEPS = 2


@pytest.mark.slow
def test_gloo_ranks_on_localhost_give_the_one_process_state(tmp_path, single_thread):
    """Real processes (one per rank, torchrun's environment), gloo over localhost."""
    from commitments.spec import Spec
    from devnet.procs import free_port
    from tests.oracle.dp_walk import batch

    spec = Spec.from_dict(SPEC)
    st = init_state(spec)
    want = []
    for t in range(1, STEPS + 1):
        st, loss = step(st, batch(spec, t), spec, t)
        want.append([st.digest().hex(), int(loss.view(torch.int32).item())])
    procs = []
    for n, mb in ((3, 2), (4, 1)):
        port = free_port()
        for r in range(n):
            env = os.environ | {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
            procs.append((n, subprocess.Popen(
                [sys.executable, "-m", "tests.oracle.dp_walk", json.dumps(SPEC), str(STEPS), str(mb),
                 str(tmp_path / f"w{n}")], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)))
    for n, p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, f"world {n}: {err[-2000:]}"
    for n in (3, 4):
        for r in range(n):
            got = json.loads((tmp_path / f"w{n}.{r}.json").read_text())
            assert got == want, f"world {n}, rank {r}"


BF16_SPEC = SPEC | {
    "dtype": "bf16-mixed",
    "optimizer": SPEC["optimizer"]
    | {"schedule": "cosine", "warmup_steps": 1, "decay_steps": 4, "min_lr": 1e-3},
    "batch": SPEC["batch"] | {"micro_batches": 2},
}


@pytest.mark.slow
def test_gloo_ranks_walk_a_bf16_cosine_spec_to_the_one_process_state(tmp_path, single_thread):
    """The ranks run the spec's op namespace (bf16-mixed here), not float32's."""
    from commitments.spec import Spec
    from devnet.procs import free_port
    from tests.oracle.dp_walk import batch

    spec = Spec.from_dict(BF16_SPEC)
    st = init_state(spec)
    want = []
    for t in range(1, STEPS + 1):
        st, loss = step(st, batch(spec, t), spec, t)
        want.append([st.digest().hex(), int(loss.view(torch.int32).item())])
    f32 = Spec.from_dict(BF16_SPEC | {"dtype": "float32"})
    assert step(init_state(f32), batch(f32, 1), f32, 1)[0].digest().hex() != want[0][0]
    n, port = 2, free_port()
    procs = []
    for r in range(n):
        env = os.environ | {"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                            "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.oracle.dp_walk", json.dumps(BF16_SPEC), str(STEPS), "3",
             str(tmp_path / "w")], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    for r in range(n):
        assert json.loads((tmp_path / f"w.{r}.json").read_text()) == want, f"rank {r}"
