"""Identical bytes everywhere: a small GPT with dropout 0.1 walked under exact-v1 in child
processes at several thread counts and CPU dispatch levels gives bit-identical state digests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commitments.dataset import prepare_default_corpus

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
# gpt-tiny's settings, narrowed (2 layers, width 64, 8 x 64 tokens) to keep the children short.
SMALL_GPT = """
profile = "{profile}"
steps = 100
[model]
kind = "gpt"
vocab_size = 256
block_size = 64
n_layer = 2
n_head = 4
n_embd = 64
dropout = 0.1
[optimizer]
kind = "adamw"
lr = 1e-3
weight_decay = 0.1
grad_clip = 1.0
[batch]
batch_size = 8
seq_len = 64
[rng]
seed = 1337
schedule_seed = 1337
"""


def _small_spec(tmp_path: Path, profile: str = "exact-v1") -> Path:
    path = tmp_path / f"{profile}.toml"
    extra = '[hardware]\ndevice = "cpu"\n' if profile == "torch-native" else ""
    path.write_text(SMALL_GPT.format(profile=profile) + extra)
    return path


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _configs():
    flags = _cpu_flags()
    cfgs = [
        {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"},
        {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "default"},
    ]
    if "avx2" in flags:
        cfgs.append(
            {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
        )
    if "avx512f" in flags:
        cfgs.append({"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx512"})
    return cfgs


def _walk(env_extra: dict, data: Path, spec: Path, *extra: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "POT_EXACT_KERNELS")}
    env.update(env_extra)
    r = subprocess.run(
        [sys.executable, "-m", "pot", "oracle", "walk", "--spec", str(spec), "--data", str(data),
         "--steps", str(STEPS), "--json", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, f"{env_extra}: {r.stderr[-2000:]}"
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.slow
def test_identical_digests_across_threads_and_dispatch_levels(tmp_path):
    data = tmp_path / "corpus.npy"
    prepare_default_corpus(data, max_bytes=1 << 20)
    spec = _small_spec(tmp_path)
    cfgs = _configs()
    results = [_walk(c, data, spec) for c in cfgs]
    assert len(results[0]) == STEPS
    assert len({r["state_digest"] for r in results[0]}) == STEPS
    assert all(int(r["loss_bits"], 16) & 0x7F800000 != 0x7F800000 for r in results[0])  # finite losses
    for cfg, res in zip(cfgs[1:], results[1:], strict=True):
        assert res == results[0], f"{cfg} differs from {cfgs[0]}"


@pytest.mark.slow
def test_control_torch_native_differs_across_the_same_configurations(tmp_path):
    """The configurations really change the arithmetic: stock torch gives different bytes."""
    data = tmp_path / "corpus.npy"
    prepare_default_corpus(data, max_bytes=1 << 20)
    native = _small_spec(tmp_path, "torch-native")
    cfgs = _configs()
    if len(cfgs) < 3:
        pytest.skip("needs a CPU with more than one vector dispatch level")
    a = _walk(cfgs[0], data, native)
    b = _walk(cfgs[-1], data, native)
    assert a[-1]["state_digest"] != b[-1]["state_digest"]


# bf16-mixed with a warm-up and cosine decay, and float32 with a warm-up and linear decay, each
# committed with gradient accumulation; smaller than SMALL_GPT, as each spec walks six times.
MIXED_SPECS = {
    "bf16-cosine": """
dtype = "bf16-mixed"
steps = 100
[model]
vocab_size = 256
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.1
[optimizer]
lr = 3e-3
weight_decay = 0.1
schedule = "cosine"
warmup_steps = 1
decay_steps = 3
min_lr = 3e-4
[batch]
batch_size = 6
seq_len = 32
micro_batches = 2
[rng]
seed = 7
""",
    "f32-linear": """
steps = 100
[model]
vocab_size = 256
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
tie_weights = false
dropout = 0.1
[optimizer]
lr = 3e-3
weight_decay = 0.1
schedule = "linear"
warmup_steps = 2
decay_steps = 3
min_lr = 1e-4
[batch]
batch_size = 6
seq_len = 32
micro_batches = 3
[rng]
seed = 8
""",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MIXED_SPECS))
def test_schedule_and_bf16_specs_walk_to_identical_digests_everywhere(tmp_path, name):
    """Every thread count and dispatch level; one of them with the compiled kernels off, the last
    with another micro-batch split than the spec's (one child per configuration keeps it short)."""
    data = tmp_path / "corpus.npy"
    prepare_default_corpus(data, max_bytes=1 << 18)
    spec = tmp_path / f"{name}.toml"
    spec.write_text(MIXED_SPECS[name])
    runs = [(c, ()) for c in _configs()]
    runs[1] = (runs[1][0] | {"POT_EXACT_KERNELS": "0"}, ())
    runs[-1] = (runs[-1][0], ("--micro-batches", "1"))
    results = [_walk(c, data, spec, *extra) for c, extra in runs]
    assert len({r["state_digest"] for r in results[0]}) == STEPS
    assert all(int(r["loss_bits"], 16) & 0x7F800000 != 0x7F800000 for r in results[0])
    for (cfg, extra), res in zip(runs[1:], results[1:], strict=True):
        assert res == results[0], f"{cfg} {extra} differs from {runs[0][0]}"


# A Llama (grouped-query attention, untied head, dropout) and a GPT-2 fine-tune from a checkpoint
# saved by transformers and imported, each committed with gradient accumulation.
LLAMA_SPECS = {
    "llama": """
steps = 100
[model]
kind = "llama"
vocab_size = 256
block_size = 16
n_layer = 2
n_head = 4
n_kv_head = 2
n_embd = 32
intermediate_size = 64
tie_weights = false
dropout = 0.1
[optimizer]
lr = 3e-3
weight_decay = 0.1
[batch]
batch_size = 4
seq_len = 16
micro_batches = 2
[rng]
seed = 9
""",
    "gpt2-finetune": """
steps = 100
{tables}
[optimizer]
lr = 1e-3
weight_decay = 0.1
[batch]
batch_size = 4
seq_len = 16
micro_batches = 4
[rng]
seed = 10
""",
}


def _gpt2_checkpoint(tmp_path: Path) -> tuple[str, Path]:
    """The model and init tables of a GPT-2 saved by transformers and imported, and the file."""
    transformers = pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from miner.cli import model_app

    cfg = transformers.GPT2Config(vocab_size=256, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                  bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hf")
    init = tmp_path / "init.safetensors"
    r = CliRunner().invoke(
        model_app, ["import", str(tmp_path / "hf"), "--from", "hf-gpt2", "--out", str(init)]
    )
    assert r.exit_code == 0, r.output
    return r.stdout[r.stdout.index("[model]"):], init


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LLAMA_SPECS))
def test_llama_and_finetune_specs_walk_to_identical_digests_everywhere(tmp_path, name):
    """As above: every thread count and dispatch level, the kernels off in one, another split in
    the last."""
    data = tmp_path / "corpus.npy"
    prepare_default_corpus(data, max_bytes=1 << 18)
    spec = tmp_path / f"{name}.toml"
    init: tuple[str, ...] = ()
    text = LLAMA_SPECS[name]
    if name == "gpt2-finetune":
        tables, path = _gpt2_checkpoint(tmp_path)
        text, init = text.format(tables=tables), ("--init", str(path))
    spec.write_text(text)
    runs = [(c, init) for c in _configs()]
    runs[1] = (runs[1][0] | {"POT_EXACT_KERNELS": "0"}, init)
    runs[-1] = (runs[-1][0], (*init, "--micro-batches", "1"))
    results = [_walk(c, data, spec, *extra) for c, extra in runs]
    assert len({r["state_digest"] for r in results[0]}) == STEPS
    assert all(int(r["loss_bits"], 16) & 0x7F800000 != 0x7F800000 for r in results[0])
    for (cfg, extra), res in zip(runs[1:], results[1:], strict=True):
        assert res == results[0], f"{cfg} {extra} differs from {runs[0][0]}"
