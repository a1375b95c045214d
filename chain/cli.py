"""`pot chain`: run or inspect a dev chain, and print the protocol events of any chain.

Heavy modules load inside the commands so `pot --help` stays fast. Errors an operator can fix
(bad URL, unreadable file, bad parameters) print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Chains: run a dev chain, print protocol events.")

EXIT_USAGE = 2


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(EXIT_USAGE)


def _require_chain(url: str) -> None:
    """Refuse a dev chain file that does not exist: only `pot chain dev` (and `pot demo`) make one."""
    from chain.require import require_chain
    from chain.transport import TransportError

    try:
        require_chain(url)
    except TransportError as exc:  # NoChain, or a malformed dev URL
        _fail(str(exc))


def load_params(path: Path | None, transport: Any = None) -> Any:
    """Protocol parameters pinned by a TOML file (top level or a [protocol] table), or None.

    `transport` is accepted for older callers and not used: the chain's own parameters are settled
    by `chain.network.resolve_params`, which compares them with the pin.
    """
    import tomllib

    from chain.protocol import ProtocolParams

    if path is None:
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        _fail(f"{path}: cannot read protocol parameters: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        _fail(f"{path}: not valid TOML: {exc}")
    # Parameters may sit at the top level or under [protocol] of a larger config file.
    section = data.get("protocol", data)
    try:
        return ProtocolParams.from_dict(section)
    except (TypeError, ValueError) as exc:
        _fail(f"{path}: {exc}")


@app.command("dev")
def dev(
    db: Path = typer.Option(..., "--db", help="The dev chain file (created if missing, unless --inspect)."),
    interval: float = typer.Option(None, "--interval", help="Seal a block every S seconds until stopped."),
    inspect: bool = typer.Option(False, "--inspect", help="Print the chain's state and check its hashes."),
    params: Path = typer.Option(None, "--params", help="TOML of protocol parameters to record in the file."),
    as_json: bool = typer.Option(False, "--json", help="With --inspect: one JSON object."),
    authority: str = typer.Option(
        None,
        "--authority",
        help="A new file: the account that configures the network "
        "(default alice); an existing file: checked against the one it records.",
    ),
) -> None:
    """Run a dev chain (instant sealing, or --interval S), or --inspect one.

    The file records the network's authority when it is made: only that account's
    configure_network records count on the chain."""
    from chain.dev import DevTransport
    from chain.transport import TransportError

    if inspect and interval is not None:
        _fail("--inspect and --interval do not go together: inspect a chain, or run its sealer")
    if inspect and not db.exists():
        _fail(f"{db}: no such dev chain file")
    if interval is not None and not interval > 0:
        _fail(f"--interval must be a positive number of seconds, got {interval}")
    try:
        t = DevTransport(
            db, authority or "alice", sealing=None if inspect else ("interval" if interval else "instant")
        )
        recorded_authority = t.network_authority()
    except TransportError as exc:
        _fail(str(exc))
    if authority is not None and recorded_authority != authority:
        _fail(f"{db}: the chain's authority is {recorded_authority or '(none recorded: an older file)'}, not "
              f"{authority}; it is fixed when the file is made")
    if params is not None:
        recorded = t.protocol_params()
        pinned = load_params(params)
        if recorded is not None and recorded != pinned and t.finalized_head() > 0:
            _fail(
                f"{db}: the chain records other parameters since genesis "
                f"({'; '.join(pinned.differences(recorded))}"
                f" (file != chain)); change them from a later block with `pot chain configure`"
            )
        t.record_params(pinned)
    url = f"dev://{db.resolve()}"
    if inspect:
        _inspect(t, url, as_json)
        return
    if interval is None:
        typer.echo(f"dev chain {url}: instant sealing, head {t.finalized_head()}")
        return
    typer.echo(f"dev chain {url}: sealing a block every {interval:g} s (Ctrl-C stops)")
    try:
        t.chain.run_sealer(interval)
    except KeyboardInterrupt:
        typer.echo(f"stopped at block {t.finalized_head()}")
    finally:
        t.close()


def _inspect(t: Any, url: str, as_json: bool) -> None:
    chain = t.chain
    head = chain.head()
    recent = []
    for n in range(max(0, head - 4), head + 1):
        bhash, _, ts, txs = chain.raw_block(n)
        recent.append({"number": n, "hash": bhash.hex(), "timestamp": ts / 1000.0, "txs": len(txs)})
    from chain.network import read_network

    params = t.protocol_params()
    problems = chain.verify()
    network = protocol = None
    if not problems:
        rec = read_network(t, head)
        network = {"authority": rec.authority, "source": rec.source(),
                   "params": rec.current.to_dict() if rec.current is not None else None,
                   "scheduled": [[b, at] for b, at, _ in rec.state.schedule]}
        if rec.initial is not None:  # the chain's state, derived from its blocks as any follower does
            from chain.view import ChainView

            view = ChainView(t, rec.initial, keep_events=False)  # a fresh state: the chain's own authority
            view.sync(until=head)
            protocol = view.summary()
    info = {
        "url": url,
        "sealing": chain.sealing,
        "head": head,
        "pending": chain.pending(),
        "params": params.to_dict() if params is not None else None,
        "network": network,
        "protocol": protocol,
        "hashes_ok": not problems,
        "problems": problems,
        "recent_blocks": recent,
    }
    if as_json:
        typer.echo(json.dumps(info, sort_keys=True))
    else:
        typer.echo(
            f"{url}\n  sealing {info['sealing']}, head {head}, {info['pending']} pending transaction(s)"
        )
        typer.echo(f"  hashes: {'ok' if not problems else '; '.join(problems)}")
        typer.echo(f"  params of the file: {'none recorded' if params is None else info['params']}")
        if network is not None:
            typer.echo(f"  network: {'no parameters' if network['params'] is None else network['params']} "
                       f"(from {network['source']})")
        if protocol is not None:
            _echo_protocol(protocol)
        for b in reversed(recent):
            typer.echo(f"  block {b['number']:>6}  {b['hash'][:16]}  {b['txs']} tx  "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(b['timestamp']))} UTC")
    if problems:
        raise typer.Exit(1)


def _echo_protocol(p: dict[str, Any]) -> None:
    ch = p["challenges"]
    verdicts = ", ".join(f"{n} {v}" for v, n in ch["verdicts"].items()) or "none"
    typer.echo(
        f"  protocol: {p['runs']} run(s), {ch['open']} open challenge(s), {ch['resolved']} resolved "
        f"({verdicts})"
    )
    for c in p["open_challenges"]:
        first = "" if c["first"] is None else f" (first {c['first'][:16]})"
        typer.echo(
            f"    challenge {c['challenge_id'][:16]} run {c['run_id'][:16]} step {c['step']} "
            f"round {c['round']}{first}: committee {_shown(c['committee'])} ({len(c['committee'])}), "
            f"{'opened' if c['opened'] else 'not opened'}, {c['commitments']} committed, "
            f"{c['reveals']} revealed; due "
            f"{c['opening_deadline']}/{c['commit_deadline']}/{c['reveal_deadline']}"
        )
    for v in p["verifiers"]:
        waiting = ", ".join(f"{a} until block {r}" for r, a in v["unbonding"])
        typer.echo(
            f"    verifier {v['account']}: bond {v['bond']}{'' if v['eligible'] else ' (not eligible)'}"
            f"{', unbonding ' + waiting if waiting else ''}, penalized {v['penalized']}"
        )


def _shown(v: Any) -> str:
    """A field of an event or a state row as one short token: hashes cut to 16 hex digits (a
    witness pair's 128 too), lists joined by commas (pairs by ':'), None as '-'."""
    if v is None:
        return "-"
    if isinstance(v, str) and len(v) in (64, 128) and all(c in "0123456789abcdef" for c in v):
        return v[:16]
    if isinstance(v, list):
        if v and all(isinstance(x, list) for x in v):
            return ",".join(":".join(_shown(y) for y in x) for x in v)
        return ",".join(_shown(x) for x in v) or "-"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _print_event(ev: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(ev.to_json())
    else:
        d = ev.to_dict()
        name, block = d.pop("event"), d.pop("block")
        rest = " ".join(f"{k}={_shown(v)}" for k, v in d.items())
        typer.echo(f"block {block} {name} {rest}")
    sys.stdout.flush()


@app.command("events")
def events(
    chain: str = typer.Option(..., "--chain", help="dev:///path/to/chain.db or ws://host:port"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
    from_block: int = typer.Option(0, "--from", help="Print events from this block on."),
    follow: bool = typer.Option(False, "--follow", help="Keep printing as blocks are finalized."),
    params: Path = typer.Option(
        None,
        "--params",
        help="TOML of protocol parameters to pin: refused unless the "
        "chain records the same (needed only on a chain that records none).",
    ),
    authority: str = typer.Option(None, "--authority", help="Pin the account that configures the network."),
    poll: float = typer.Option(0.5, "--poll", help="Seconds between polls for new blocks with --follow."),
    kind: str = typer.Option("remark", "--kind", help="Substrate chains: 'remark' or 'pallet' transport."),
    key: str = typer.Option(
        None, "--key", help="Substrate chains: key URI to connect with (never signs here)."
    ),
) -> None:
    """Print the protocol events of a chain, derived from its finalized blocks."""
    from chain.connect import connect
    from chain.transport import TransportError
    from chain.view import ChainView
    from commitments.retry import Backoff

    if from_block < 0:
        _fail(f"--from must be a block number >= 0, got {from_block}")
    if not poll > 0:
        _fail(f"--poll must be a positive number of seconds, got {poll}")
    _require_chain(chain)
    try:
        # Reading never signs; Substrate transports still want a key, so a dev one stands in.
        transport = connect(chain, key=key or "//Alice", kind=kind)
    except (TransportError, ValueError) as exc:  # bad URL, unreachable node, unusable key
        _fail(str(exc))
    from chain.network import BlockMemo, NetworkParamsError, check_pinned, network_authority, read_network
    from chain.protocol import ProtocolState

    pinned = load_params(params)
    try:
        memo = BlockMemo(transport)
        rec = read_network(memo, memo.until, authority=authority)
        check_pinned(rec, pinned, pin_name="--params")
    except NetworkParamsError as exc:
        transport.close()
        _fail(str(exc))
    except TransportError as exc:
        transport.close()
        _fail(str(exc))
    initial = rec.initial or pinned
    view = ChainView(memo, initial,  # type: ignore[arg-type]
                     state=ProtocolState(params=initial, authority=network_authority(memo, authority)),
                     keep_events=False)
    failures = 0
    backoff = Backoff(base_s=poll, cap_s=30.0)
    try:
        while True:
            try:
                # The whole chain is replayed (the state needs it); only events from --from print.
                for ev in view.sync():
                    if ev.block >= from_block:
                        _print_event(ev, as_json)
                failures = 0
            except TransportError as exc:
                if not follow:
                    _fail(str(exc))
                failures += 1
                delay = backoff.delay(failures)
                typer.echo(f"warning: {exc}; retrying in {delay:.1f} s", err=True)
                time.sleep(delay)
                continue
            if not follow:
                return
            time.sleep(poll)
    except KeyboardInterrupt:
        return
    finally:
        transport.close()


@app.command("configure")
def configure(
    chain: str = typer.Option(..., "--chain", help="dev:///path/to/chain.db or ws://host:port"),
    params: Path = typer.Option(
        ..., "--params", help="TOML of the protocol parameters (top level or [protocol])."
    ),
    effective: int = typer.Option(
        None,
        "--effective",
        help="The block they take effect at (default: four blocks "
        "after the head, time for the record to land).",
    ),
    account: str = typer.Option(None, "--account", help="Dev chains: the authority's account name."),
    key: str = typer.Option(
        None, "--key", help="Substrate chains: the authority's key URI, mnemonic or keystore."
    ),
    kind: str = typer.Option("remark", "--kind", help="Substrate chains: 'remark' or 'pallet' transport."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the record's block."),
) -> None:
    """Record the network's protocol parameters on chain (a configure_network call).

    Only the network's authority sends them (a dev chain's creator; on a Substrate chain the account
    its nodes pin as [chain] authority); each changes the parameters from a later block. Nodes,
    miners and `pot chain events` read them.
    """
    from chain.calls import ConfigureNetwork
    from chain.connect import connect
    from chain.network import NetworkParamsError, read_network
    from chain.outcome import submit_and_read
    from chain.transport import TransportError
    from chain.view import ChainView

    pinned = load_params(params)
    _require_chain(chain)
    try:
        transport = connect(chain, account=account, key=key, kind=kind)
    except (TransportError, ValueError) as exc:
        _fail(str(exc))
    try:
        head = transport.finalized_head()
        at = head + 4 if effective is None else effective  # the record lands in head + 1 at the earliest
        if at <= head + 1:
            _fail(f"--effective {at} is not after the next block ({head + 1}): a change is never retroactive")
        rec = read_network(transport, head)
        if rec.authority is not None and rec.authority != transport.account:
            raise NetworkParamsError(f"the network's authority is {rec.authority}, not {transport.account}: "
                                     f"its records would be refused")
        # The chain as `pot chain events` derives it, to read what the protocol made of the record.
        initial = rec.initial or pinned
        view = ChainView(transport, initial, keep_events=False)  # a fresh state: the chain's own authority
        outcome = submit_and_read(
            transport, [ConfigureNetwork(params=pinned.to_cbor(), effective_block=at)], view, timeout=timeout
        )
    except (TransportError, NetworkParamsError) as exc:
        _fail(str(exc))
    finally:
        transport.close()
    (call,) = outcome.calls
    out = {"block": outcome.block, "effective_block": at, "authority": transport.account,
           "params_digest": pinned.digest().hex(), "params": pinned.to_dict(), "ok": call.ok,
           "outcome": call.words(), "refusal": None if call.ok else call.refusal.refusal}
    if as_json:
        typer.echo(json.dumps(out, sort_keys=True))
    elif call.ok:
        typer.echo(f"configure_network by {transport.account} in block {outcome.block}: "
                   f"parameters {out['params_digest'][:16]} take effect at block {at}")
    if not call.ok:
        hint = "; give a later --effective" if call.refusal.refusal == "RetroactiveChange" else ""
        typer.echo(f"error: {call.words()}{hint}", err=True)
        raise typer.Exit(1)
