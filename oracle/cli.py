"""`pot oracle`: walk a run forward from its seed, or replay one step from a saved state.

Both print one JSON line per step with --json: {"step", "loss_bits", "state_digest"} (plus
"norm_bucket" for a replayed step). torch is imported inside the commands so `pot --help` is fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="The exact-v1 oracle: walk a run, replay one step.")


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def _load(spec_path: Path, data_path: Path):
    from commitments.dataset import Dataset, train_validation_split
    from commitments.schedule import derive_schedule
    from commitments.spec import Spec

    spec = Spec.from_toml(spec_path)
    ds = Dataset.open(data_path, spec.sample_len, vocab_size=spec.model.vocab_size)
    train, _ = train_validation_split(ds.num_samples)
    schedule = derive_schedule(spec.rng.schedule_seed, len(train), spec.steps, spec.batch.batch_size)
    return spec, ds, schedule


def _threads(n: int | None) -> None:
    if n is None:
        return
    import numba
    import torch

    torch.set_num_threads(n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))


def _domain_errors() -> tuple[type[BaseException], ...]:
    from commitments.errors import CommitmentError
    from oracle.importer import ImportRefused
    from oracle.models import ModelError
    from oracle.optim import OptimError
    from oracle.profiles import ProfileError
    from oracle.rng import RngError
    from oracle.state import StateError
    from oracle.step import StepError

    return (
        CommitmentError,
        ImportRefused,
        ModelError,
        OptimError,
        ProfileError,
        RngError,
        StateError,
        StepError,
        OSError,
    )


def _line(t: int, loss, state_digest: bytes, **extra) -> dict:
    from commitments.leaves import loss_bits

    return {"step": t, "loss_bits": f"0x{loss_bits(loss):08x}", "state_digest": state_digest.hex(), **extra}


@app.command()
def walk(
    spec_path: Path = typer.Option(..., "--spec", help="execution spec (TOML)"),
    data: Path = typer.Option(..., "--data", help="token corpus (.npy)"),
    steps: int = typer.Option(..., "--steps", min=1, help="number of steps to walk from the seed"),
    as_json: bool = typer.Option(False, "--json", help="one JSON line per step"),
    save_dir: Path | None = typer.Option(None, "--save-dir", help="write state_<t>.safetensors for t = 0..N"),
    device: str = typer.Option("cpu", "--device", help="torch device (cpu, cuda, ...)"),
    threads: int | None = typer.Option(None, "--threads", min=1, help="intra-op CPU threads (same bytes)"),
    micro_batches: int | None = typer.Option(
        None, "--micro-batches", min=1,
        help="split each batch (exact-v1: any split, same bytes); default: the spec's batch.micro_batches"),
    init: Path | None = typer.Option(None, "--init", help="parameters file of a fine-tune spec's [init] "
                                                          "(from `pot model import`)"),
) -> None:
    """Walk a run from its spec's initial state (the seed's, or the pretrained parameters of its
    [init]), printing each step's loss bits and state digest."""
    try:
        import torch
        from tqdm import tqdm

        from oracle.step import init_state, step

        _threads(threads)
        spec, ds, schedule = _load(spec_path, data)
        if steps > spec.steps:
            _fail(f"--steps {steps} exceeds the spec's declared steps ({spec.steps})")
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
        state = init_state(spec, device=torch.device(device), pretrained=init)
        if save_dir is not None:
            state.to_safetensors(save_dir / "state_0.safetensors")
        bar = tqdm(range(1, steps + 1), desc="walk", unit="step", file=sys.stderr, disable=as_json)
        for t in bar:
            state, loss = step(state, ds.batch(schedule.batch(t)), spec, t, micro_batches=micro_batches)
            line = _line(t, loss, state.digest())
            if save_dir is not None:
                state.to_safetensors(save_dir / f"state_{t}.safetensors")
            if as_json:
                typer.echo(json.dumps(line))
            else:
                bar.write(
                    f"step {t:>6}  loss {float(loss):.6f} ({line['loss_bits']})  state {line['state_digest']}"
                )
    except _domain_errors() as exc:
        _fail(str(exc))


@app.command("step")
def step_cmd(
    state_path: Path = typer.Option(..., "--state", help="state before the step (.safetensors)"),
    spec_path: Path = typer.Option(..., "--spec", help="execution spec (TOML)"),
    data: Path = typer.Option(..., "--data", help="token corpus (.npy)"),
    t: int = typer.Option(..., "--step", min=1, help="the step to replay (1-based)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON line"),
    out: Path | None = typer.Option(None, "--out", help="write the state after the step here"),
    micro_batches: int | None = typer.Option(
        None, "--micro-batches", min=1,
        help="split the batch (exact-v1: any split, same bytes); default: the spec's batch.micro_batches"),
    device: str = typer.Option("cpu", "--device", help="torch device (cpu, cuda, ...)"),
    threads: int | None = typer.Option(None, "--threads", min=1, help="intra-op CPU threads (same bytes)"),
) -> None:
    """Replay step T from a saved state on the schedule's batch of step T."""
    try:
        import torch

        from oracle.norm_bucket import norm_bucket
        from oracle.state import TrainState
        from oracle.step import step

        _threads(threads)
        spec, ds, schedule = _load(spec_path, data)
        before = TrainState.from_safetensors(state_path, spec, device=torch.device(device))
        after, loss = step(before, ds.batch(schedule.batch(t)), spec, t, micro_batches=micro_batches)
        line = _line(t, loss, after.digest(), norm_bucket=norm_bucket(before, after))
        if out is not None:
            after.to_safetensors(out)
        if as_json:
            typer.echo(json.dumps(line))
        else:
            typer.echo(f"step {t}  loss {float(loss):.6f} ({line['loss_bits']})  state {line['state_digest']}"
                       f"  norm bucket {line['norm_bucket']}")
    except _domain_errors() as exc:
        _fail(str(exc))
