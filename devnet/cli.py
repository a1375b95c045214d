"""`pot demo`, `pot redteam` and `pot devnet node`: the command-line faces of devnet.demo,
devnet.redteam and devnet.node_faults.

The commands import the network code (torch, SQLAlchemy, substrate-interface) when they run, so
that `pot --help` stays fast.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

demo_app = typer.Typer(add_completion=False, rich_markup_mode=None, help="Run the whole protocol on one machine.")
redteam_app = typer.Typer(no_args_is_help=False, add_completion=False, rich_markup_mode=None)
devnet_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)


@devnet_app.command("node")
def devnet_node(
    config: Path = typer.Option(..., "--config", help="The node's TOML, as for pot node run."),
    secrets: Path | None = typer.Option(None, "--secrets", help="The node's secrets TOML, as for pot node run."),
    init: bool = typer.Option(False, "--init", help="Create or migrate the database first."),
    fault: str = typer.Option("none", "--fault", help="none, noise (reveal random values) or lazy (no fetch, no "
                                                       "replay; reveal H(leaf t) with a made-up proof)."),
    kill_at: str | None = typer.Option(None, "--kill-at", help="SIGKILL the node right after this point became "
                                                                "durable (node.hooks.KILL_POINTS), like a power cut."),
) -> None:
    """For test and demo networks only: pot node run with an injected fault. A real node never runs this."""
    from devnet.node_faults import FaultHooks
    from node.commands import serve_node

    try:
        hooks = FaultHooks(fault, kill_at)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    serve_node(config, secrets, init, hooks)


@demo_app.callback(invoke_without_command=True)
def demo(
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object on the last line."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Dashboard/API port on 127.0.0.1 (0: any)."),
    no_serve: bool = typer.Option(False, "--no-serve", help="Exit after the summary instead of serving on."),
    chain: str | None = typer.Option(None, "--chain", help="ws://host:port of a Substrate chain (remark "
                                                             "transport) instead of the embedded dev chain."),
    workdir: Path | None = typer.Option(None, "--workdir", help="Keep the demo's files here (default: a "
                                                                 "temporary folder, removed at exit)."),
    steps: int = typer.Option(10, "--steps", min=2, max=200, help="Training steps per run."),
    substitute_at: int = typer.Option(7, "--substitute-at", min=1, help="The step trained on a substituted batch."),
    timeout: float = typer.Option(600.0, "--timeout", min=30, help="Give up after this many seconds."),
) -> None:
    """Run a miner (an honest and a substituted run) and four verifier nodes (two honest, one revealing noise,
    one lazy) on one chain."""
    from devnet.demo import Demo, DemoError
    from devnet.render import render

    if substitute_at > steps:
        typer.echo(f"error: --substitute-at {substitute_at} is outside steps 1..{steps}", err=True)
        raise typer.Exit(2)
    if chain is not None and not chain.startswith(("ws://", "wss://")):
        typer.echo(f"error: --chain takes ws://host:port or wss://host:port, got {chain!r}", err=True)
        raise typer.Exit(2)
    stream = sys.stderr if as_json else sys.stdout

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=stream, flush=True)

    started = time.monotonic()
    temp = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="pot-demo-")) if workdir is None else workdir.resolve()
    wd.mkdir(parents=True, exist_ok=True)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    d = Demo(wd, chain=chain, port=port, steps=steps, substitute_at=substitute_at, timeout=timeout, say=say,
             keep_workdir=not temp)
    code = 0
    summary = None
    try:
        say(f"work folder {wd}")
        summary = d.run()
        print(render(summary), file=stream, flush=True)
        if as_json:
            print(json.dumps(summary, sort_keys=True), flush=True)
        code = 0 if summary["ok"] else 1
        if not no_serve and d.api is not None:
            say(f"serving the dashboard at {d.dashboard_url} until Ctrl-C")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        if summary is None:  # interrupted mid-run; after the summary Ctrl-C is how serving ends
            say("interrupted: stopping every process the demo started")
            code = 130
        else:
            say("stopped serving")
    except DemoError as exc:
        say(f"error: {exc}")
        code = 1
    finally:
        d.close()
        signal.signal(signal.SIGTERM, previous)
        if temp and code in (0, 130):
            shutil.rmtree(wd, ignore_errors=True)
        elif temp:
            say(f"kept {wd} (logs in {wd / 'logs'})")
    raise typer.Exit(code)


@redteam_app.callback(invoke_without_command=True)
def redteam(json_out: bool = typer.Option(False, "--json", help="Print the result as JSON (last line)."),
            workdir: Path | None = typer.Option(None, "--workdir", help="Keep the run and chain here (default: a "
                                                "temporary directory, removed afterwards)."),
            only: list[str] = typer.Option([], "--only", help="Apply only this edit (repeatable); with --protocol, "
                                           "only this row."),
            protocol: bool = typer.Option(False, "--protocol", help="Play the protocol's adversary matrix instead "
                                          "(lazy, Sybil, stalling, grinding, front-running actors) on the state "
                                          "machine: each row's verdict and who pays."),
            verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress to stderr.")) -> None:
    """Train a fresh tiny run, forge it in every way the protocol must stop, and check each forgery
    through the verifier's real path. Exits 1 if an edit that changes bytes passes or an honest
    step is flagged. With --protocol: play every adversary row; exits 1 if a row's outcome is not
    the one the protocol must give."""
    if protocol:
        from devnet.protocol_matrix import format_matrix, run_matrix

        try:
            rows = run_matrix(only or None)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        ok = all(r.ok for r in rows)
        if json_out:
            typer.echo(format_matrix(rows), err=True)
            typer.echo(json.dumps({"rows": [r.as_json() for r in rows], "ok": ok}, sort_keys=True))
        else:
            typer.echo(format_matrix(rows))
        raise typer.Exit(0 if ok else 1)
    from devnet.redteam import RedTeamError, format_table, run_redteam

    def log(msg: str) -> None:
        if verbose:
            print(f"[redteam {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        if workdir is not None:
            workdir.mkdir(parents=True, exist_ok=True)
            report = run_redteam(workdir, log=log, only=only)
        else:
            with tempfile.TemporaryDirectory(prefix="pot-redteam-") as tmp:
                report = run_redteam(Path(tmp), log=log, only=only)
    except RedTeamError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(format_table(report), err=True)
        typer.echo(json.dumps(report.as_json(), sort_keys=True))
    else:
        typer.echo(format_table(report))
    raise typer.Exit(0 if report.ok else 1)

