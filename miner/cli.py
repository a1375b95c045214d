"""`pot miner` (train with commitments, serve openings) and `pot recipe` (write/verify run documents).

`pot` imports this module to mount it, so it imports only typer at module level: the rest of
miner/ loads torch, the chain and the server, and comes in inside the commands, keeping
`pot --help` fast. Exit codes: 0 success, 1 a check came out negative (a DIFFERENT promise, a
fraud verdict), 2 refused input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

miner_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                        help="Miners: train with commitments, serve openings.")
recipe_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                         help="Run documents: write and verify promised digests.")
model_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                        help="Pretrained checkpoints: import them as the initial state of a fine-tune.")


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _domain_errors() -> tuple[type[BaseException], ...]:
    # Lazy (start-up speed of `pot`, see the module docstring), like every import in the commands.
    from chain.transport import TransportError
    from challenges.opening import OpeningRefused
    from commitments.errors import CommitmentError
    from miner.recipe import RecipeRefused
    from miner.trainer import TrainerError
    from oracle.state import StateError
    from oracle.step import StepError

    return (
        CommitmentError,
        OpeningRefused,
        RecipeRefused,
        TrainerError,
        TransportError,
        StateError,
        StepError,
        OSError,
        ValueError,
    )


def _open(spec_path: Path, data: Path) -> tuple[Any, Any]:
    from commitments.dataset import Dataset
    from commitments.spec import Spec

    spec = Spec.from_toml(spec_path)
    return spec, Dataset.open(data, spec.sample_len, vocab_size=spec.model.vocab_size)


# --- pot miner ----------------------------------------------------------------------------------


@miner_app.command()
def train(
    spec_path: Path = typer.Option(..., "--spec", help="execution spec (TOML)"),
    data: Path = typer.Option(..., "--data", help="token corpus (.npy)"),
    out: Path = typer.Option(..., "--out", help="run directory (states, leaves, transcript, openings)"),
    chain: str = typer.Option(..., "--chain", help="chain URL: dev:///path/chain.db or ws://host:port"),
    account: str | None = typer.Option(None, "--account", help="dev-chain account name"),
    key: str | None = typer.Option(None, "--key", help="Substrate key URI, mnemonic or keystore file"),
    endpoint: str | None = typer.Option(
        None, "--endpoint", help="public URL of the prover (default: --host/--port)"
    ),
    mirror: list[str] = typer.Option(
        [],
        "--mirror",
        help="another base URL serving copies of this run's openings under /openings/<digest> "
        "(repeatable, at most 4): each opening on chain names them beside --endpoint; "
        "copying the files there is the miner's own job",
    ),
    serve: bool = typer.Option(True, "--serve/--no-serve", help="serve openings from this process"),
    host: str = typer.Option("127.0.0.1", "--host", help="prover bind address"),
    port: int = typer.Option(8760, "--port", help="prover port"),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="POT_PROVER_TOKEN",
        help="bearer token of the prover's private routes (/admin/*)",
    ),
    keep_every: int = typer.Option(
        10,
        "--keep-every",
        min=1,
        help="keep the full state every K steps; the registration declares K as the run's "
        "checkpoint_interval, and the opening window is sized for it",
    ),
    adapt_keep_every: bool = typer.Option(
        True,
        "--adapt-keep-every/--no-adapt-keep-every",
        help="lower --keep-every when regenerating a step would not fit in half the opening window (at "
             "start, and "
        "again once step times are measured); off: refuse to start instead, and only warn during training",
    ),
    root_every: int | None = typer.Option(None, "--root-every", min=1, help="submit the root every N steps"),
    substitute_batch_at: int | None = typer.Option(
        None,
        "--substitute-batch-at",
        min=1,
        help="FAULT INJECTION (tests, demos): train step T on another batch than the committed one",
    ),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="answer challenges until they resolve"),
    timeout: float | None = typer.Option(None, "--timeout", help="give up following after this many seconds"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary line"),
    params_path: Path | None = typer.Option(
        None,
        "--params",
        help="pin the protocol parameters (TOML, top level or a protocol table): refused unless "
        "the chain records the same; needed only on a chain that records none",
    ),
    nproc: int = typer.Option(
        1,
        "--nproc",
        min=1,
        help="data-parallel ranks on this machine (started through torchrun; gloo on CPU, "
        "NCCL on GPUs); under torchrun the ranks come from its environment",
    ),
    init: Path | None = typer.Option(
        None,
        "--init",
        help="fine-tuning: the parameters file the spec's [init] commits to (from `pot model import`)",
    ),
) -> None:
    """Train with commitments, then answer the run's challenges until they resolve."""
    import os

    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        _relaunch(nproc)
    server = None
    trainer = None
    ranks = None
    try:
        from chain.connect import connect
        from miner.trainer import Trainer
        from oracle.parallel import Ranks

        ranks = Ranks.from_env()
        if ranks is not None and nproc > 1 and ranks.world != nproc:
            _fail(f"--nproc {nproc} but torchrun started {ranks.world} ranks")
        if ranks is not None and not ranks.leader:
            # the other ranks only compute their shards of each step: rank 0 commits and serves
            spec, ds = _open(spec_path, data)
            Trainer(spec, ds, out, None, substitute_batch_at=substitute_batch_at, progress=False,
                    ranks=ranks, pretrained=init).run(follow=False)
            return
        spec, ds = _open(spec_path, data)
        from chain.require import require_chain

        require_chain(chain)  # a missing dev chain file is refused, never created
        transport = connect(chain, account=account, key=key)
        # The chain's record is the rulebook; a pin is checked against it before training starts.
        params = None
        if params_path is not None:
            from chain.cli import load_params

            params = load_params(params_path)
        if serve:
            from miner.prover import BackgroundServer

            out.mkdir(parents=True, exist_ok=True)
            server = BackgroundServer(out, host, port, token).start()
        trainer = Trainer(
            spec,
            ds,
            out,
            transport,
            endpoint=endpoint or f"http://{host}:{port}",
            keep_every=keep_every,
            root_every=root_every,
            substitute_batch_at=substitute_batch_at,
            params=params,
            progress=not as_json,
            ranks=ranks,
            pretrained=init,
            mirrors=mirror,
            adapt_keep_every=adapt_keep_every,
        )
        if substitute_batch_at is not None:
            typer.echo(f"FAULT INJECTION: step {substitute_batch_at} trains on a substituted batch", err=True)
        verdicts = trainer.run(follow=follow, timeout=timeout)
        code = report(trainer, verdicts, out, as_json=as_json)
        if code:
            raise typer.Exit(code)
    except _domain_errors() as exc:
        _fail(str(exc))
    finally:
        if trainer is not None:
            trainer.close()
        if server is not None:
            server.stop()
        if ranks is not None:
            ranks.close()


def report(trainer: Any, verdicts: dict[bytes, str], out: Path, *, as_json: bool = False) -> int:
    """Print what a trained and followed run came to (one JSON line, or lines of text) and every
    refusal of a call the trainer sent (its code and reason, on stderr; they were logged as read
    too), and return the exit status: 1 when a check came out negative (a fraud verdict, a call the
    chain refused, an opening refused as late (OpeningTooLate) among them, or a challenge left
    unopened), else 0."""
    final = trainer.final_verdicts()
    # "verdicts": every round's; "final": each challenge (by its first round's id) as its last
    # round left it, a re-challenged step once.
    summary = {"run_id": trainer.run_id.hex(), "account": trainer.account, "nonce": trainer.nonce.hex(),
               "root": trainer.tree.root().hex(), "size": trainer.tree.size,
               "run_dir": str(out), "openings": {c.hex(): d.hex() for c, d in trainer.answered.items()},
               "verdicts": {c.hex(): v for c, v in verdicts.items()},
               "final": {c.hex(): v for c, v in final.items()},
               "rounds": {c.hex(): r for c, (_, r) in trainer.rounds.items()},
               "mirrors": list(trainer.mirrors),
               "keep_every": trainer.store.keep_every, "checkpoint_interval": trainer.checkpoint_interval,
               "opening_blocks": trainer.window_blocks,
               "unanswered": {c.hex(): why for c, why in trainer.failed.items()},
               "refusals": list(trainer.refusals)}
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        typer.echo(f"run {summary['run_id']}: {summary['size'] - 1} steps, root {summary['root']}")
        for c, v in summary["verdicts"].items():
            r = summary["rounds"].get(c, 1)
            typer.echo(f"challenge {c[:16]}{f' (round {r})' if r > 1 else ''}: {v}")
        for c, why in summary["unanswered"].items():
            typer.echo(f"challenge {c[:16]}: not opened: {why}")
    for r in trainer.refusals:
        typer.echo(f"refused: {r['what']}: {r['refusal']}: {r['reason']} (block {r['block']})", err=True)
    negative = (any(v == "fraud" for v in verdicts.values()) or trainer.refusals or trainer.refused
                or trainer.failed)
    return 1 if negative else 0


def _relaunch(nproc: int) -> None:
    """Run this very command as `nproc` ranks under torchrun (standalone: a local rendezvous on
    a free port) and exit with its status."""
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "pot", "--", *sys.argv[1:]]
    raise typer.Exit(subprocess.call(cmd))


@miner_app.command("serve")
def serve_cmd(
    run_dir: Path = typer.Argument(..., help="run directory written by `pot miner train`"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8760, "--port"),
    token: str | None = typer.Option(
        None, "--token", envvar="POT_PROVER_TOKEN",
        help="bearer token of the private routes (/admin/*); openings, leaves and /healthz stay public"),
) -> None:
    """Serve a run directory's openings and leaves over HTTP (public: verifiers send no token)."""
    from miner.checkpoints import CheckpointError, read_run_meta
    from miner.prover import serve

    try:
        meta = read_run_meta(run_dir)
    except CheckpointError as exc:
        _fail(str(exc))
    if meta is None:
        _fail(f"{run_dir}: not a run directory (no meta.cbor)")
    typer.echo(f"serving run {meta['run_id'].hex()} on http://{host}:{port}", err=True)
    serve(run_dir, host, port, token)


# --- pot recipe ---------------------------------------------------------------------------------


@recipe_app.command("write")
def recipe_write(
    spec_path: Path = typer.Option(..., "--spec", help="execution spec (TOML)"),
    data: Path = typer.Option(..., "--data", help="token corpus (.npy)"),
    steps: int = typer.Option(..., "--steps", min=1, help="walk this many steps from the seed"),
    out: Path = typer.Option(..., "--out", help="where to write the document"),
    key_file: Path | None = typer.Option(None, "--key-file", help="Ed25519 signing key (created if missing)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON summary line"),
) -> None:
    """Walk N steps and write the signed document promising the state digests at chosen steps."""
    try:
        from commitments.files import atomic_write_bytes
        from miner.recipe import load_recipe, write_recipe

        key = None
        if key_file is not None:
            from commitments.transcript import load_session_key, save_session_key

            if key_file.exists():
                key = load_session_key(key_file)
            else:
                from nacl.signing import SigningKey

                key = SigningKey.generate()
                save_session_key(key_file, key)
        spec, ds = _open(spec_path, data)
        doc = write_recipe(spec, ds, steps, signing_key=key, progress=not as_json)
        atomic_write_bytes(out, doc)
        recipe = load_recipe(doc)
        summary = {"out": str(out), "bytes": len(doc), "digest": recipe.digest.hex(),
                   "public_key": recipe.public_key.hex(), "promised_steps": [t for t, _ in recipe.promises]}
        typer.echo(json.dumps(summary) if as_json else
                   f"wrote {out} ({len(doc)} bytes), promising steps {summary['promised_steps']}")
    except _domain_errors() as exc:
        _fail(str(exc))


@recipe_app.command("verify")
def recipe_verify(
    doc: Path = typer.Argument(..., help="run document written by `pot recipe write`"),
    data: Path = typer.Option(..., "--data", help="token corpus (.npy)"),
    expect_key: str | None = typer.Option(
        None, "--expect-key", help="hex public key the document must be signed by"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON report"),
) -> None:
    """Recompute the run from its seed; exit 0 only when every promised digest is EQUAL."""
    from miner.recipe import RecipeRefused, load_recipe, verify_recipe

    def refuse(reason: str) -> None:
        if as_json:
            typer.echo(json.dumps({"ok": False, "refused": reason}))
        _fail(reason)

    try:
        key = bytes.fromhex(expect_key) if expect_key else None
    except ValueError:
        refuse("--expect-key must be hex")
    try:
        raw = doc.read_bytes()
    except OSError as exc:
        refuse(f"{doc}: cannot read: {exc.strerror or exc}")
    try:
        # Tampering is refused here, before the corpus is even opened.
        recipe = load_recipe(raw, expect_key=key)
        from commitments.dataset import Dataset

        ds = Dataset.open(data, recipe.spec.sample_len, vocab_size=recipe.spec.model.vocab_size)
        report = verify_recipe(raw, ds, expect_key=key, progress=not as_json)
    except RecipeRefused as exc:
        refuse(str(exc))
    except _domain_errors() as exc:
        refuse(str(exc))
    if as_json:
        typer.echo(json.dumps(report.as_json()))
    else:
        for r in report.results:
            typer.echo(f"step {r.step:>7}  {r.result:<9}  {r.computed.hex()}")
        typer.echo("all promises EQUAL" if report.ok else "some promises DIFFERENT", err=True)
    sys.stdout.flush()
    if not report.ok:
        raise typer.Exit(1)


__all__ = ["miner_app", "recipe_app", "report"]


# --- pot model ----------------------------------------------------------------------------------


@model_app.callback()
def _model_group() -> None:
    """Pretrained checkpoints: import them as the initial state of a fine-tune."""


@model_app.command("import")
def model_import(
    directory: Path = typer.Argument(..., help="checkpoint directory (config.json, model.safetensors)"),
    source: str = typer.Option(..., "--from", help="checkpoint layout: hf-gpt2 or hf-llama"),
    out: Path = typer.Option(..., "--out", help="parameters file to write (.safetensors)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON line"),
) -> None:
    """Import a Hugging Face checkpoint (safetensors layout, transformers' parameter names) as a
    parameters file, and print the spec's model and init tables that commit to it."""
    try:
        from oracle.importer import SOURCES, ImportRefused, import_checkpoint, model_toml, write_params

        if source not in SOURCES:
            _fail(f"--from must be one of {', '.join(SOURCES)}, got {source!r}")
        try:
            model, params = import_checkpoint(source, directory)
        except ImportRefused as exc:
            _fail(str(exc))
        digest = write_params(out, model, params).hex()
        n = sum(t.numel() for t in params.values())
        if as_json:
            typer.echo(json.dumps({"out": str(out), "params_digest": digest, "parameters": n,
                                   "model": model.table()}))
            return
        typer.echo(f"wrote {out}: {len(params)} tensors, {n:,} parameters", err=True)
        typer.echo("# paste into the fine-tune spec; train with --init " + str(out))
        typer.echo(model_toml(model))
        typer.echo(f'[init]\nkind = "pretrained"\nparams_digest = "{digest}"')
    except _domain_errors() as exc:
        _fail(str(exc))
