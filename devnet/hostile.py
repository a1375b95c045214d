"""Hostile input beyond forged openings: the remarks, registrations, provers, manifests and HTTP
requests an attacker aims at a verifier node. Each probe states what the node must do and checks
it on the node's real part (the chain view, the fetch, the validator, the API); `pot redteam`
lists them beside the edits. `python -m devnet.hostile read-chain PATH` is the bounded child that
reads a dev chain, so a decoder that never returns cannot stall the red team.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi.testclient import TestClient

from chain.calls import PREFIX, StartTrainingCommitment, SubmitCheckpointRoot, derive_run_id, encode_call
from chain.dev import DevTransport
from chain.view import ChainView
from challenges.opening import MAGIC as MAGIC_OPENING
from challenges.opening import load_opening
from commitments import cbor, merkle
from commitments.hashing import digest
from commitments.spec import Spec
from devnet.forge import max_opening_bytes
from devnet.lab import CHALLENGED, Lab, Prover, Serve, bond_seats
from devnet.procs import REPO, free_port
from node.api import create_app
from node.config import NodeConfig
from node.db import challenges, open_database, runs, witnesses
from node.egress import EgressPolicy
from node.fetch import FetchPolicy
from node.pipeline import stage_fetch, stage_validate

# A decoder gets this long to read a chain of three blocks; a linear one needs milliseconds.
READ_BUDGET_S = 5.0
# The slowloris probe: the fetch's own wall-clock budget, and what is allowed beyond it.
SLOW_BUDGET_S = 3.0
SLOW_SLACK_S = 2.0


@dataclass(frozen=True)
class Probe:
    name: str
    kind: str
    must: str  # what the node must do, in words
    check: Callable[[Lab], tuple[bool, str, str]]  # -> (held, stage, reason)


PROBES: list[Probe] = []


def probe(name: str, kind: str, must: str):
    def register(fn: Callable[[Lab], tuple[bool, str, str]]) -> Callable[[Lab], tuple[bool, str, str]]:
        PROBES.append(Probe(name, kind, must, fn))
        return fn
    return register


def config_refusal(path: Path, text: bytes, names: str) -> str | None:
    """Write `text` as a node config file at `path` and load it: None when it is refused with a
    ConfigError that names `names`, else what happened instead."""
    from node.config import ConfigError, load_config

    path.write_bytes(text)
    try:
        load_config(path, env={})
    except ConfigError as exc:
        return None if names in str(exc) else f"the error does not name {names}"
    except BaseException as exc:  # noqa: BLE001 - what escapes is the finding
        return f"raised {type(exc).__name__}"
    return "loaded"


# --- hostile CBOR, written byte by byte (our encoder refuses to write any of it) ----------------


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([(major << 5) | n])
    for code, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([(major << 5) | code]) + n.to_bytes(size, "big")
    raise ValueError("length beyond 64 bits")


def bignum(nbytes: int = 1800) -> bytes:
    """Tag 2 over `nbytes` of 0xff: an integer of thousands of decimal digits."""
    return b"\xc2" + _head(2, nbytes) + b"\xff" * nbytes


def value_sharing(levels: int = 60) -> bytes:
    """Tags 28/29: element k is shared and holds two references to element k-1, so a walk that
    treats the decoded value as a tree visits 2^levels nodes from ~11 bytes a level."""
    out = [_head(4, levels), b"\xd8\x1c\x81\x00"]
    for k in range(1, levels):
        ref = b"\xd8\x1d" + _head(0, k - 1)
        out.append(b"\xd8\x1c\x82" + ref + ref)
    return b"".join(out)


def deep_nesting(levels: int = 100_000) -> bytes:
    return b"\x81" * levels + b"\x00"


def call_with(name: str, field: str, raw_value: bytes) -> bytes:
    """A pot1 payload of call `name` whose one field is the raw CBOR `raw_value`."""
    return PREFIX + b"\x82" + cbor.encode(name) + b"\xa1" + cbor.encode(field) + raw_value


# --- reading a chain in a bounded child process ---------------------------------------------------


def read_chain(path: Path) -> dict[str, Any]:
    """Follow a dev chain from genesis with the chain view every node runs; report what it recorded."""
    t = DevTransport(path, "observer")
    view = ChainView(t, t.protocol_params())
    head = t.finalized_head()
    started = time.monotonic()
    error = None
    try:
        view.sync()
    except Exception as exc:  # what a node's loop would meet: report it, with where the cursor stopped
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
    return {
        "head": head,
        "cursor": view.cursor,
        "seconds": round(time.monotonic() - started, 3),
        "error": error,
        "events": [
            {
                "block": e.block,
                "name": type(e).__name__,
                "code": getattr(e, "code", None),
                "reason": str(getattr(e, "reason", ""))[:160],
            }
            for e in view.events
        ],
        "runs": sorted(r.hex() for r in view.state.runs),
    }


def read_chain_bounded(path: Path, budget_s: float = READ_BUDGET_S) -> dict[str, Any]:
    """`read_chain` in a child process, killed `budget_s` after its imports are done."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    # Unbuffered: a buffered readline would take the answer too, out of communicate()'s sight.
    proc = subprocess.Popen(
        [sys.executable, "-m", "devnet.hostile", "read-chain", str(path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        bufsize=0,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # printed once the imports are done: the budget is for the reading
        if ready.strip() != b"ready":
            proc.wait(10)
            return {"error": f"the reader did not start (exit {proc.returncode})", "timed_out": False}
        try:
            out, _ = proc.communicate(timeout=budget_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            return {"error": f"still reading after {budget_s:g} s (killed)", "timed_out": True}
        lines = out.decode(errors="replace").strip().splitlines()
        if proc.returncode != 0 or not lines:
            return {"error": f"the reader died (exit {proc.returncode}): the node's process would too",
                    "timed_out": False, "died": True}
        return {**json.loads(lines[-1]), "timed_out": False}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _owned(account: str, tag: str) -> tuple[bytes, bytes]:
    """(run_id, nonce) of a run `account` may register: derive_run_id(account, nonce)."""
    nonce = digest("pot/redteam/hostile-nonce/v1", tag)[:16]
    return derive_run_id(account, nonce), nonce


def _honest_registration(lab: Lab, run_id: bytes, nonce: bytes) -> list[Any]:
    leaves = lab.leaves
    return [StartTrainingCommitment(run_id, nonce, lab.honest.initial_hash, lab.honest.schedule.commitment,
                                    lab.dataset.dataset_hash, lab.spec.to_cbor(), lab.spec.steps,
                                    lab.prover.endpoint),
            SubmitCheckpointRoot(run_id, merkle.root(leaves), len(leaves), ())]


def _chain_with(lab: Lab, name: str, payloads: list[bytes]) -> tuple[Path, bytes]:
    """A fresh instant dev chain holding the hostile payloads in block 1, then an honest registration."""
    path = lab.dir / "hostile" / f"{name}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    attacker = DevTransport(path, "attacker", sealing="instant")
    attacker.record_params(lab.params)
    attacker.submit_payloads(payloads)
    bond_seats(path, lab.params)  # the committees' seats, so the honest run is challenged after the payloads
    run_id, nonce = _owned("miner", "honest-after-hostile")
    miner = DevTransport(path, "miner")
    miner.submit(_honest_registration(lab, run_id, nonce)[:1])
    miner.submit(_honest_registration(lab, run_id, nonce)[1:])
    for t in (attacker, miner):
        t.close()
    return path, run_id


def _ignored_in(events: list[dict[str, Any]], block: int) -> list[dict[str, Any]]:
    # The one record a skipped remark leaves: an event whose stable code names it ignored.
    return [e for e in events if e["block"] == block and "Ignored" in f"{e['name']}{e['code']}"]


def _skipped_and_advanced(lab: Lab, name: str, payload: bytes) -> tuple[bool, str, str]:
    path, run_id = _chain_with(lab, name, [payload])
    r = read_chain_bounded(path)
    if r.get("timed_out"):
        return False, "chain", f"the chain view {r['error']}: the cursor never leaves block 1"
    if r.get("died"):
        return False, "chain", r["error"]
    if r.get("error") and r.get("cursor", 0) < r.get("head", 0):
        return (
            False,
            "chain",
            f"block {r['cursor'] + 1} raised {r['error']}; the cursor stays at {r['cursor']}",
        )
    if r["cursor"] != r["head"]:
        return False, "chain", f"the cursor stopped at {r['cursor']} of {r['head']}"
    ignored = _ignored_in(r["events"], 1)
    if len(ignored) != 1:
        return (
            False,
            "chain",
            (
                f"read to the head in {r['seconds']:g} s, but block 1 left {len(ignored)} ignored "
                "records (one is due: the remark is skipped visibly)"
            ),
        )
    if run_id.hex() not in r["runs"]:
        return False, "chain", "the honest registration after the remark was not applied"
    return True, "chain", (f"skipped with {ignored[0]['code']} and read to the head in {r['seconds']:g} s; "
                           "the honest registration after it applied")


@probe("bignum-remark", "a hostile remark", "skip it with an ignored record and advance the cursor")
def _bignum_remark(lab: Lab) -> tuple[bool, str, str]:
    return _skipped_and_advanced(lab, "bignum-remark", call_with("submit_checkpoint_root", "size", bignum()))


@probe("value-sharing-remark", "a hostile remark", "skip it with an ignored record and advance the cursor")
def _sharing_remark(lab: Lab) -> tuple[bool, str, str]:
    return _skipped_and_advanced(lab, "value-sharing-remark",
                                 call_with("submit_checkpoint_root", "proof", value_sharing()))


@probe("deep-nesting-remark", "a hostile remark", "skip it with an ignored record and advance the cursor")
def _deep_remark(lab: Lab) -> tuple[bool, str, str]:
    return _skipped_and_advanced(lab, "deep-nesting-remark",
                                 call_with("submit_checkpoint_root", "proof", deep_nesting()))


@probe("oversized-spec-registration", "a hostile registration",
       "refuse it with a code and store none of its spec; advance the cursor")
def _oversized_spec(lab: Lab) -> tuple[bool, str, str]:
    # A spec that parses (torch-native, one hardware class) padded to 60 kB in a free-text field.
    d = lab.spec.canonical()
    d["profile"] = "torch-native"
    d["hardware"] = {"device": "cpu-" + "x" * 60_000}
    spec = Spec.from_dict(d).to_cbor()
    # The attacker's own run id (the payloads go on chain as its): the refusal is the spec's size.
    run_id, nonce = _owned("attacker", "oversized-spec")
    call = StartTrainingCommitment(run_id, nonce, lab.honest.initial_hash, lab.honest.schedule.commitment,
                                   lab.dataset.dataset_hash, spec, lab.spec.steps, lab.prover.endpoint)
    path, honest_id = _chain_with(lab, "oversized-spec-registration", [encode_call(call)])
    r = read_chain_bounded(path)
    if r.get("timed_out") or r.get("died") or r["cursor"] != r["head"]:
        return False, "chain", f"the chain view did not reach the head: {r.get('error')}"
    if run_id.hex() in r["runs"]:
        return False, "chain", f"a {len(spec)}-byte spec was registered and is kept in the protocol state"
    refused = [
        e for e in r["events"] if e["block"] == 1 and (e["name"] == "CallRefused" or _ignored_in([e], 1))
    ]
    if not refused:
        return False, "chain", "the registration left no refusal or ignored record"
    if refused[0]["code"] == "RunIdNotOwned":
        return (
            False,
            "chain",
            "refused for its run id, before its spec was looked at: the probe proves nothing",
        )
    if honest_id.hex() not in r["runs"]:
        return False, "chain", "the honest registration after it was not applied"
    return True, "chain", f"refused with {refused[0]['code']}: {refused[0]['reason'][:80]}"


# --- hostile endpoints and provers --------------------------------------------------------------


class _Connects:
    """Every socket.connect this process makes while recording (an audit hook: nothing is replaced)."""

    installed = False
    lock = threading.Lock()
    seen: list[Any] | None = None

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if event == "socket.connect" and cls.seen is not None:
            addr = args[1]
            cls.seen.append(tuple(addr[:2]) if isinstance(addr, tuple) else (addr, None))

    def __enter__(self) -> list[Any]:
        if not _Connects.installed:
            sys.addaudithook(_Connects.hook)
            _Connects.installed = True
        _Connects.seen = []
        return _Connects.seen

    def __exit__(self, *exc: Any) -> None:
        _Connects.seen = None


def fetch_policy(*, loopback_allowed: bool, slow: bool = False) -> Any:
    """The red team's fetch settings; the demo's allow-list (127.0.0.1) only where a probe needs it."""
    return FetchPolicy(connect_timeout_s=1, read_timeout_s=10, total_timeout_s=SLOW_BUDGET_S if slow else 30,
                       attempts=1, backoff_base_s=0.05, backoff_max_s=0.2,
                       egress=EgressPolicy.from_allow(["127.0.0.1"] if loopback_allowed else []))


def _fetch(lab: Lab, uri: str, tag: str, *, loopback_allowed: bool, slow: bool = False,
           max_bytes: int | None = None, facts: Any = None) -> Any:

    dest = lab.dir / "verifier" / f"{tag}.opening"
    # The node always fetches with the chain's facts of the challenge: here the honest run's.
    return stage_fetch(uri=uri, endpoint=lab.prover.endpoint, run_id=lab.honest.run_id, dest=dest,
                       leaves_dest=dest.with_suffix(".leaves"),
                       max_opening_bytes=max_bytes or max_opening_bytes(lab), max_leaves_bytes=1 << 20,
                       policy=fetch_policy(loopback_allowed=loopback_allowed, slow=slow),
                       facts=facts if facts is not None else _honest_facts(lab))


def _honest_facts(lab: Lab) -> Any:
    """The chain's facts of the honest run's challenge, read once per lab."""
    facts = getattr(lab, "_hostile_facts", None)
    if facts is None:
        facts = lab.facts(lab.view(), lab.honest.run_id, CHALLENGED, load_opening(lab.opening()).digest)
        lab._hostile_facts = facts  # type: ignore[attr-defined]
    return facts


def _control(lab: Lab) -> str | None:
    """Why the honest opening itself fails on the path a probe uses, or None: a refusal that would
    also stop honest work proves nothing."""
    uri = lab.prover.put("/openings/control", lab.opening())
    out = _fetch(lab, uri, "control", loopback_allowed=True)
    return (
        None
        if out.ok
        else f"the honest opening was refused on the same path: [{out.refusal_class}] {out.reason}"
    )


def _internal_targets(listener: Prover) -> list[tuple[str, str]]:
    """(label, URL) of addresses a verifier must never be made to reach: one answers on 127.0.0.2."""
    port = free_port()
    return [("loopback 127.0.0.2 (live)", f"{listener.endpoint}/openings/internal"),
            ("localhost", f"http://localhost:{port}/openings/x"),
            ("private 10.0.0.1", "http://10.0.0.1/openings/x"),
            ("private 192.168.0.1", "http://192.168.0.1/openings/x"),
            ("metadata 169.254.169.254", "http://169.254.169.254/latest/meta-data/"),
            ("unspecified 0.0.0.0", f"http://0.0.0.0:{port}/openings/x"),
            ("IPv6 loopback [::1]", f"http://[::1]:{port}/openings/x"),
            ("IPv4-mapped [::ffff:127.0.0.1]", f"http://[::ffff:127.0.0.1]:{port}/openings/x")]


def _host_of(url: str) -> str:
    return (urlsplit(url).hostname or "").strip("[]")


def _internal(lab: Lab, name: str, via_redirect: bool) -> tuple[bool, str, str]:
    if via_redirect and (why := _control(lab)) is not None:
        return False, "fetch", why
    listener = Prover(host="127.0.0.2")
    try:
        listener.put("/openings/internal", lab.opening())
        bad, classes = [], set()
        for label, target in _internal_targets(listener):
            uri = target
            if via_redirect:
                uri = lab.prover.serve(
                    f"/openings/redirect-{len(classes)}-{label.split()[0]}", Serve(redirect=target)
                )
            hits = listener.requests
            with _Connects() as seen:
                out = _fetch(lab, uri, f"{name}-{label.split()[0]}", loopback_allowed=via_redirect)
            host = _host_of(target)
            # Host and port: the allowed prover itself listens on 127.0.0.1 too.
            port = urlsplit(target).port or 80
            reached = [a for a, p in seen if p == port and (
                str(a) == host or (host == "localhost" and str(a).startswith(("127.", "::1"))))]
            if out.ok:
                bad.append(f"{label}: fetched")
            elif reached or listener.requests > hits:
                bad.append(f"{label}: connected before refusing ([{out.refusal_class}])")
            classes.add(out.refusal_class)
        if bad:
            return False, "fetch", "; ".join(bad)
        if classes != {"unavailable"}:
            return (
                False,
                "fetch",
                f"refused, but with the classes {sorted(map(str, classes))}: they tell networks apart",
            )
        how = "every redirect" if via_redirect else "every address"
        return (
            True,
            "fetch",
            f"{how} refused before connecting ({len(_internal_targets(listener))} targets), "
            "each as [unavailable]",
        )
    finally:
        listener.close()


@probe("ssrf-endpoint", "a hostile endpoint or prover",
       "refuse loopback, private, link-local, metadata and unspecified addresses (IPv6 forms too) "
       "without connecting, with the one class of any unavailable opening")
def _ssrf(lab: Lab) -> tuple[bool, str, str]:
    return _internal(lab, "ssrf", via_redirect=False)


@probe("redirect-to-internal", "a hostile endpoint or prover",
       "refuse a redirect (from an allowed prover) to loopback, private or metadata addresses without "
       "connecting")
def _redirect(lab: Lab) -> tuple[bool, str, str]:
    return _internal(lab, "redirect", via_redirect=True)


@probe("gzip-bomb-unwritten", "a hostile endpoint or prover",
       "refuse a Content-Encoding before writing anything it inflates to")
def _gzip_unwritten(lab: Lab) -> tuple[bool, str, str]:
    if (why := _control(lab)) is not None:
        return False, "fetch", why
    cap = max_opening_bytes(lab)
    bomb = gzip.compress(MAGIC_OPENING + b"\0" * (64 * cap), compresslevel=9)
    # The first kilobyte inflates to well under the cap; the rest comes after a pause in which the
    # verifier's files are measured.
    first = 1024
    uri = lab.prover.serve("/openings/gzip-unwritten", Serve(bomb, gz=True, stall_after=first, stall_s=1.5))
    dest = lab.dir / "verifier" / "gzip-unwritten.opening"
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            for p in (dest, dest.with_name(dest.name + ".part")):
                try:
                    peak[0] = max(peak[0], p.stat().st_size)
                except OSError:
                    pass
            done.wait(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out = _fetch(lab, uri, "gzip-unwritten", loopback_allowed=True)
    finally:
        done.set()
        watcher.join(2)
    if out.ok:
        return False, "fetch", f"fetched {out.data.get('bytes')} inflated bytes from {len(bomb)} on the wire"
    if peak[0] > first:
        return (
            False,
            "fetch",
            (
                f"[{out.refusal_class}] {out.reason[:60]}, but only after writing {peak[0]} inflated "
                f"bytes from {first} on the wire"
            ),
        )
    return True, "fetch", f"[{out.refusal_class}] {out.reason[:90]}; {peak[0]} bytes written"


@probe(
    "oversize-opening-for-spec",
    "a hostile endpoint or prover",
    "refuse at the fetch an opening larger than its spec allows (state + batch + proofs), under the operator "
    "cap",
)
def _oversize_for_spec(lab: Lab) -> tuple[bool, str, str]:
    if (why := _control(lab)) is not None:
        return False, "fetch", why
    honest = lab.opening()
    pad = min(256 * 1024, max_opening_bytes(lab) - len(honest) - 1)
    uri = lab.prover.put("/openings/oversize-for-spec", honest + b"\0" * pad)
    # The chain's facts give the node the digest and spec its opening is sized by.
    out = _fetch(lab, uri, "oversize-for-spec", loopback_allowed=True, max_bytes=opening_cap(lab))
    if out.ok:
        return (
            False,
            "fetch",
            (
                f"{len(honest) + pad} bytes fetched for a spec whose opening is {len(honest)}: "
                "the cap is the operator's, not the spec's"
            ),
        )
    if out.refusal_class != "unavailable" or not out.reason.startswith("too_large"):
        return False, "fetch", f"[{out.refusal_class}] {out.reason[:100]}"
    return True, "fetch", f"[{out.refusal_class}] {out.reason[:100]}"


def opening_cap(lab: Lab) -> int:
    """The byte cap the node fetches this run's opening under."""
    return max_opening_bytes(lab)


@probe("slowloris-prover", "a hostile endpoint or prover",
       "end the fetch within its wall-clock budget, whether the headers or the body trickle")
def _slowloris(lab: Lab) -> tuple[bool, str, str]:
    if (why := _control(lab)) is not None:
        return False, "fetch", why
    slow = Prover()
    try:
        body = lab.opening()
        cases = {"headers": slow.serve("/openings/slow-headers", Serve(body, header_trickle_s=0.2)),
                 "body": slow.serve("/openings/slow-body", Serve(body, body_trickle_s=0.2))}
        bad, took = [], {}
        for what, uri in cases.items():
            result: list[Any] = []
            started = time.monotonic()
            t = threading.Thread(target=lambda u=uri, w=what, r=result: r.append(
                _fetch(lab, u, f"slow-{w}", loopback_allowed=True, slow=True)), daemon=True)
            t.start()
            t.join(SLOW_BUDGET_S + SLOW_SLACK_S)
            took[what] = time.monotonic() - started
            if t.is_alive():
                bad.append(f"{what}: still fetching after {took[what]:.1f} s (budget {SLOW_BUDGET_S:g} s)")
            elif result and result[0].ok:
                bad.append(f"{what}: fetched")
        if bad:
            return False, "fetch", "; ".join(bad)
        return (
            True,
            "fetch",
            "ended within the budget: " + ", ".join(f"{w} {s:.1f} s" for w, s in took.items()),
        )
    finally:
        slow.close()


# --- a poison manifest ------------------------------------------------------------------------


@probe("poison-manifest", "a poison manifest",
       "refuse it with a class and a reason; never raise out of validation")
def _poison(lab: Lab) -> tuple[bool, str, str]:
    opening = lab.opening()
    (mlen,) = struct.unpack(">I", opening[len(MAGIC_OPENING):len(MAGIC_OPENING) + 4])
    mb = opening[len(MAGIC_OPENING) + 4:len(MAGIC_OPENING) + 4 + mlen]
    step_field = cbor.encode("step") + cbor.encode(CHALLENGED)
    if mb.count(step_field) != 1:
        return False, "validate", "cannot place the poison: the manifest's step field is not unique"
    poisoned = mb.replace(step_field, cbor.encode("step") + bignum())
    data = (
        MAGIC_OPENING + struct.pack(">I", len(poisoned)) + poisoned + opening[len(MAGIC_OPENING) + 4 + mlen :]
    )
    dest = lab.dir / "verifier" / "poison.opening"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    view = lab.view()
    facts = lab.facts(view, lab.honest.run_id, CHALLENGED, load_opening(lab.opening()).digest)
    try:
        out = stage_validate(dest, facts, max_bytes=opening_cap(lab))
    except Exception as exc:  # what the daemon would retry as a stage error until the window closes
        return False, "validate", f"stage_validate raised {type(exc).__name__}: {str(exc)[:90]}"
    if out.ok:
        return False, "validate", "the poisoned manifest validated"
    return True, "validate", f"[{out.refusal_class}] {str(out.reason)[:100]}"


# --- hostile HTTP requests against the node's API -----------------------------------------------


def _api(lab: Lab) -> tuple[Any, dict[str, bytes]]:
    """The node's API and dashboard over a fresh node database holding one challenge whose witness is
    journaled and committed but not yet revealed: what an attacker would like to read early."""
    db = lab.dir / "hostile" / "node.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)
    engine = open_database(f"sqlite:///{db}", init=True)
    now = time.time()
    secret = {
        "value_hash": bytes([0xD1]) * 32,
        "leaf": bytes([0xD2]) * 80,
        "state_digest": bytes([0xD3]) * 32,
    }
    cid, run_id = bytes([0xC7]) * 32, lab.honest.run_id
    with engine.begin() as conn:
        conn.execute(
            runs.insert().values(
                run_id=run_id,
                miner="miner",
                spec_digest=lab.spec.digest(),
                mode="value",
                declared_steps=lab.spec.steps,
                endpoint=lab.prover.endpoint,
                initial_hash=lab.honest.initial_hash,
                schedule_commitment=lab.honest.schedule.commitment,
                dataset_hash=lab.dataset.dataset_hash,
                registered_block=1,
                slashed=0,
            )
        )
        conn.execute(
            challenges.insert().values(
                challenge_id=cid,
                run_id=run_id,
                idx=0,
                step=CHALLENGED,
                root=bytes(32),
                size=len(lab.leaves),
                mode="value",
                endpoint=lab.prover.endpoint,
                issued_block=3,
                opening_deadline=9,
                commit_deadline=60,
                reveal_deadline=90,
                stage="reveal",
                opening_digest=bytes([4]) * 32,
                leaf=lab.leaves[CHALLENGED],
                leaf_hash=bytes([5]) * 32,
                matches_leaf=True,
                replay_leaf=secret["leaf"],
                replay_state_digest=secret["state_digest"],
                value_hash=secret["value_hash"],
                norm_bucket=12,
                attempts=0,
                next_attempt_at=0.0,
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            witnesses.insert().values(
                challenge_id=cid,
                verifier="verifier",
                salt=bytes(16),
                value_hash=secret["value_hash"],
                norm_bucket=12,
                commitment=bytes([6]) * 32,
                created_at=now,
            )
        )
    client = TestClient(create_app(engine, NodeConfig()), base_url="http://127.0.0.1:8700")
    return client, {**secret, "challenge_id": cid}


def _find_key(obj: Any, key: str) -> list[Any]:
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k == key] + [x for v in obj.values() for x in _find_key(v, key)]
    if isinstance(obj, list):
        return [x for v in obj for x in _find_key(v, key)]
    return []


@probe("early-disclosure-get", "a hostile API request",
       "show neither the witness value nor whether it matches the leaf before it is revealed on chain")
def _early_disclosure(lab: Lab) -> tuple[bool, str, str]:
    client, s = _api(lab)
    with client:
        cid = s["challenge_id"].hex()
        pages = {"/api/v1/challenges": None, f"/api/v1/challenges/{cid}": None, f"/challenges/{cid}": None}
        bad = []
        for path in pages:
            resp = client.get(path)
            if resp.status_code != 200:
                bad.append(f"GET {path}: HTTP {resp.status_code}")
                continue
            text = resp.text
            shown = [k for k in ("value_hash", "leaf", "state_digest") if s[k].hex() in text]
            if shown:
                bad.append(f"GET {path} shows the unrevealed {', '.join(shown)}")
            if path.startswith("/api/"):
                matches = [m for m in _find_key(resp.json(), "matches_leaf") if m is not None]
                if matches:
                    bad.append(f"GET {path} says matches_leaf={matches[0]}")
    if bad:
        return False, "api", "; ".join(bad)
    return True, "api", "the API and dashboard pages hide the value and the match until the reveal"


@probe("host-header-rebinding", "a hostile API request",
       "refuse a request whose Host header is not one of the node's names (DNS rebinding)")
def _rebinding(lab: Lab) -> tuple[bool, str, str]:
    client, _ = _api(lab)
    with client:
        own = client.get("/api/v1/status")
        bad = []
        for path in ("/api/v1/status", "/", "/metrics"):
            resp = client.get(path, headers={"Host": "attacker.example:8700"})
            if resp.status_code < 400:
                bad.append(f"GET {path} with Host attacker.example answered {resp.status_code}")
    if own.status_code != 200:
        return False, "api", f"the node's own name was refused too (HTTP {own.status_code})"
    if bad:
        return False, "api", "; ".join(bad)
    return True, "api", "a foreign Host is refused; the node's own name is served"


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "read-chain":
        print("ready", flush=True)
        print(json.dumps(read_chain(Path(argv[1]))), flush=True)
        return 0
    print("usage: python -m devnet.hostile read-chain PATH", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
