"""`pot node` (init the database, run the daemon, unbond) and `pot verify` (check one opening offline).

Heavy modules (torch, SQLAlchemy, substrate-interface) are imported inside the commands so that
`pot --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

node_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="The verifier node.")
verify_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="Offline checks.")

CONFIG_OPT = typer.Option(..., "--config", "-c", help="Node config TOML (see examples/node.toml).")
SECRETS_OPT = typer.Option(None, "--secrets", help="Secrets TOML; overrides node.secrets_file.")


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def _load(config: Path, secrets: Path | None):
    from node.config import ConfigError, check_signer, load_config, load_secrets

    try:
        cfg = load_config(config)
        sec = load_secrets(secrets or cfg.node.secrets_file or None)
        check_signer(cfg, sec)
    except ConfigError as exc:
        _fail(str(exc))
    return cfg, sec


@node_app.command("init")
def node_init(config: Path = CONFIG_OPT, secrets: Path | None = SECRETS_OPT) -> None:
    """Create or migrate the node's database (refuses a foreign one)."""
    from node.db import DatabaseError, head_revision, open_database

    cfg, _ = _load(config, secrets)
    try:
        engine = open_database(cfg.database_url, init=True)
    except DatabaseError as exc:
        _fail(str(exc))
    url = engine.url.render_as_string(hide_password=True)
    engine.dispose()
    typer.echo(json.dumps({"database": url, "revision": head_revision(), "ok": True}))


@node_app.command("run")
def node_run(config: Path = CONFIG_OPT, secrets: Path | None = SECRETS_OPT,
             init: bool = typer.Option(False, "--init", help="Create or migrate the database first.")) -> None:
    """Run the verifier daemon, serving its HTTP API and dashboard on http.listen, until SIGTERM/SIGINT."""
    serve_node(config, secrets, init)


def serve_node(config: Path, secrets: Path | None, init: bool, hooks: Any = None) -> None:
    """`pot node run`'s body; `hooks` (node.hooks.NodeHooks) is for test networks only
    (`pot devnet node`), and None is the production daemon."""
    import threading

    from chain.transport import TransportError
    from node.daemon import StartupError, VerifierNode, install_signal_handlers
    from node.db import DatabaseError, open_database
    from node.logs import setup_logging

    cfg, sec = _load(config, secrets)
    _require_chain(cfg.chain.url)
    setup_logging(cfg.node.log_level)
    try:
        engine = open_database(cfg.database_url, init=init)
    except DatabaseError as exc:
        _fail(str(exc))
    stop = threading.Event()
    install_signal_handlers(stop)
    node = VerifierNode(cfg, sec, engine, stop=stop, hooks=hooks)
    from node.api import start_api_server

    try:
        # The API and dashboard share the process (and the worker pool's view) with the daemon.
        server = start_api_server(cfg, engine, node=node)
    except (OSError, ValueError) as exc:
        engine.dispose()
        _fail(str(exc))
    try:
        node.run()
    except (StartupError, TransportError) as exc:
        _fail(str(exc))
    finally:
        server.stop()
        engine.dispose()
    _exit_stopped()


def _exit_stopped() -> None:
    """End the process of a node that stopped cleanly, now: its state is durable (node.daemon's
    shutdown), and what still runs is work it left to be redone on the next start (a validation
    thread, a digest pool the interpreter would otherwise join at exit, a fetch inside one read)."""
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it
            pass
    os._exit(0)


@node_app.command("unbond")
def node_unbond(config: Path = CONFIG_OPT, secrets: Path | None = SECRETS_OPT,
                amount: int = typer.Option(..., "--amount", min=1, help="Protocol units to unbond."),
                timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the block.")) -> None:
    """Start unbonding part of this node's verifier bond (unbond_verifier): it leaves committee
    draws at once and is released after the protocol's unbonding delay. Set [verifier] bond to
    what stays bonded first (0 to leave), or the running node tops the bond up again after its
    next restart or reconnect."""
    from chain.calls import UnbondVerifier
    from chain.outcome import follower_view, submit_and_read
    from chain.transport import TransportError
    from node.daemon import connect_transport

    cfg, sec = _load(config, secrets)
    _require_chain(cfg.chain.url)
    if not timeout > 0:
        _fail(f"--timeout must be a positive number of seconds, got {timeout}")
    try:
        transport = connect_transport(cfg, sec)
    except TransportError as exc:
        _fail(str(exc))
    try:
        # The chain as this node derives it, to read what the protocol made of the call.
        view = follower_view(transport, start_block=cfg.chain.start_block, authority=cfg.chain.authority or None,
                             pinned=cfg.pinned_params(), pin_name="this node's [protocol] section")
        outcome = submit_and_read(transport, [UnbondVerifier(amount)], view, timeout=timeout)
    except TransportError as exc:
        _fail(f"the unbond call has no outcome: {exc}")
    finally:
        transport.close()
    (call,) = outcome.calls
    out: dict[str, Any] = {"account": transport.account, "amount": amount, "block": outcome.block,
                           "tx_hash": outcome.receipt.tx_hash.hex(), "ok": call.ok, "outcome": call.words()}
    if call.ok:
        (ev,) = call.events
        out.update(release_block=ev.release_block, bond=ev.bond)
    else:
        out.update(refusal=call.refusal.refusal, reason=call.refusal.reason)
    typer.echo(json.dumps(out))
    if not call.ok:
        typer.echo(f"error: {call.words()}", err=True)
        raise typer.Exit(1)


def _require_chain(url: str) -> None:
    """Refuse a dev chain file that does not exist (only `pot chain dev` and `pot demo` make one)."""
    from chain.require import NoChain, require_chain
    from chain.transport import TransportError

    try:
        require_chain(url)
    except NoChain as exc:
        _fail(str(exc))
    except TransportError as exc:  # a malformed URL
        _fail(str(exc))


def _hex_arg(name: str, value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        b = bytes.fromhex(value.removeprefix("0x"))
    except ValueError:
        _fail(f"--{name} must be hex, got {value!r}")
    if len(b) != 32:
        _fail(f"--{name} must be 32 bytes (64 hex digits), got {len(b)}")
    return b


def chain_facts(url: str, challenge_id: bytes, config: Path | None) -> dict[str, Any]:
    """The chain's facts about a challenge (from its finalized blocks), as verify_opening_file kwargs."""
    from chain import protocol as P
    from chain.connect import connect
    from chain.network import BlockMemo, check_pinned, read_network
    from chain.view import ChainView

    params = None
    if config is not None:
        from node.config import load_config

        params = load_config(config).pinned_params()
    from chain.require import require_chain

    require_chain(url)
    # Reading needs no funds; a Substrate transport still wants a key, so give it a throwaway one.
    transport = connect(url) if url.startswith("dev://") else connect(url, key="//pot//verify-reader")
    try:
        memo = BlockMemo(transport)
        rec = read_network(memo, memo.until)
        check_pinned(rec, params, pin_name="the config's [protocol] section")
        view = ChainView(memo, rec.initial or params)
        view.sync()
    finally:
        transport.close()
    issued = [e for e in view.of(P.ChallengeIssued) if e.challenge_id == challenge_id]
    if not issued:
        raise LookupError(f"challenge {challenge_id.hex()} is not on this chain (wrong chain, parameters or id?)")
    ch = issued[0]
    run = next(e for e in view.of(P.RunRegistered) if e.run_id == ch.run_id)
    opened = [e for e in view.of(P.OpeningSubmitted) if e.challenge_id == challenge_id]
    if not opened:
        raise LookupError(f"challenge {challenge_id.hex()} has no opening on chain")
    return dict(expected_digest=opened[0].opening_digest, run_id=ch.run_id, step=ch.step,
                spec_digest=run.spec_digest, dataset_hash=run.dataset_hash,
                schedule_commitment=run.schedule_commitment, initial_hash=run.initial_hash, root=ch.root,
                size=ch.size)


@verify_app.command("opening")
def verify_opening(
    path: Path = typer.Argument(..., help="The opening file."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    chain: str | None = typer.Option(None, "--chain", help="Take the facts from this chain (dev:///... or ws://)."),
    challenge: str | None = typer.Option(None, "--challenge", help="Challenge id (hex), with --chain."),
    config: Path | None = typer.Option(None, "--config", help="Node config: [protocol] for --chain."),
    digest: str | None = typer.Option(None, "--digest", help="Expected opening digest (hex)."),
    run_id: str | None = typer.Option(None, "--run-id", help="Run id (hex)."),
    step: int | None = typer.Option(None, "--step", help="Challenged step."),
    spec_digest: str | None = typer.Option(None, "--spec-digest", help="The run's spec digest (hex)."),
    dataset_hash: str | None = typer.Option(None, "--dataset-hash", help="The run's dataset hash (hex)."),
    schedule_commitment: str | None = typer.Option(None, "--schedule-commitment", help="Schedule root (hex)."),
    initial_hash: str | None = typer.Option(None, "--initial-hash", help="The run's initial state digest (hex)."),
    root: str | None = typer.Option(None, "--root", help="Challenged checkpoint root (hex)."),
    size: int | None = typer.Option(None, "--size", help="Size of the challenged tree."),
) -> None:
    """Check one opening: validate it, replay its step, compare with leaf t. Exit 0 only if it verifies.
    With --chain and --challenge the replay also prints the witness pair's proof hash for that challenge.

    Facts not given (nor taken from --chain) come from the opening itself: the check then shows
    only that the opening is self-consistent and replays to its own leaf.
    """
    from challenges.replay import verify_opening_file

    if (chain is None) != (challenge is None):
        _fail("--chain and --challenge go together")
    if not path.is_file():
        _fail(f"{path} is not a file")
    facts: dict[str, Any] = {}
    source = "opening"
    challenge_id = None
    if chain is not None:
        challenge_id = _hex_arg("challenge", challenge)
        try:
            facts = chain_facts(chain, challenge_id, config)
        except (LookupError, ValueError, RuntimeError) as exc:
            _fail(str(exc))
        source = "chain"
    else:
        given = dict(expected_digest=_hex_arg("digest", digest), run_id=_hex_arg("run-id", run_id), step=step,
                     spec_digest=_hex_arg("spec-digest", spec_digest), dataset_hash=_hex_arg("dataset-hash", dataset_hash),
                     schedule_commitment=_hex_arg("schedule-commitment", schedule_commitment),
                     initial_hash=_hex_arg("initial-hash", initial_hash), root=_hex_arg("root", root), size=size)
        facts = {k: v for k, v in given.items() if v is not None}
        if facts:
            source = "given+opening"
    # With the challenge known, the replay also gives the witness pair's proof hash for it.
    ok, reason, result = verify_opening_file(path, challenge_id=challenge_id, **facts)
    verdict = "verified" if ok else ("refused" if result is None else "mismatch")
    out = {"ok": ok, "verdict": verdict, "reason": reason or "the replayed leaf equals the committed leaf t",
           "facts": source, "replay": None if result is None else result.as_json()}
    if as_json:
        typer.echo(json.dumps(out, sort_keys=True))
    else:
        typer.echo(f"{verdict}: {out['reason']}")
    sys.stdout.flush()
    raise typer.Exit(0 if ok else 1)
