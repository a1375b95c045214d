"""Derive the protocol state from a chain: follow finalized blocks and apply them in order.

Every node computes the same state this way, whatever the transport. A refused call becomes a
recorded `CallRefused` event, never an exception; a payload the transport could not decode becomes
a `RemarkIgnored` event, a call whose application crashed inside the protocol a `CallRefused`
with the `ProtocolError` code, and a part of the block's own protocol work that crashed a
`BlockWorkFailed` event; the cursor moves past every block whatever its payloads hold.

The state and cursor can be saved to a snapshot file (written atomically), so a restarted follower
resumes where it stopped. A snapshot carries a keyed BLAKE3 digest under the node's snapshot key
(`snapshot_key`: 32 random bytes in the snapshot's folder, mode 0600, made on first use) and is
checked field by field when read: a snapshot that was altered, written under another key, or is
malformed is refused (`load`), or discarded and the state derived again from genesis (`resume`).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import stat
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3

from chain.calls import IGNORE_REASONS
from chain.protocol.events import BlockWorkFailed, CallRefused, Event, RemarkIgnored
from chain.protocol.params import ProtocolParams
from chain.protocol.refusals import ProtocolError
from chain.protocol.rules import apply_recorded, on_block
from chain.protocol.state import ChallengeState, ProtocolState, SnapshotError, new_state
from chain.transport import Block, Transport
from commitments import cbor
from commitments.errors import CommitmentError
from commitments.files import PRIVATE, atomic_write_bytes
from commitments.hashing import structure_bytes

SNAPSHOT_DOMAIN = "pot/chain-view/v2"
# Snapshot files of earlier nodes, written without a key digest: refused, and derived again.
UNKEYED_DOMAINS = ("pot/chain-view/v1",)
SNAPSHOT_KEY_FILE = "snapshot.key"
SNAPSHOT_KEY_BYTES = 32
TAG_BYTES = 32
log = logging.getLogger(__name__)


class SnapshotKeyError(RuntimeError):
    """The snapshot key file exists but cannot serve as a key (its size, a read error), with the fix."""


def snapshot_key(directory: str | Path) -> bytes:
    """The snapshot key kept in `directory` (SNAPSHOT_KEY_FILE): 32 random bytes, mode 0600,
    created on first use (atomically: of two processes starting at once, both read the same key).
    A key file readable by others is narrowed to 0600 with a warning."""
    path = Path(directory) / SNAPSHOT_KEY_FILE
    if not path.exists():
        with contextlib.suppress(FileExistsError):  # a concurrent creator won: read its key
            atomic_write_bytes(path, secrets.token_bytes(SNAPSHOT_KEY_BYTES), mode=PRIVATE, replace=False)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            os.chmod(path, PRIVATE)
            log.warning("%s: the snapshot key was readable by others (mode %o): narrowed to 0600", path, mode)
        key = path.read_bytes()
    except OSError as exc:
        raise SnapshotKeyError(f"the snapshot key {path} cannot be read: {exc}") from None
    if len(key) != SNAPSHOT_KEY_BYTES:
        raise SnapshotKeyError(
            f"the snapshot key {path} holds {len(key)} bytes, not {SNAPSHOT_KEY_BYTES}: remove it "
            f"(a new one is made, and the snapshots signed with the old one are derived again)"
        )
    return key


def snapshot_tag(key: bytes, domain: str, *fields: Any) -> bytes:
    """BLAKE3 in keyed mode under `key` over the canonical structure [domain, *fields]."""
    if not isinstance(key, bytes) or len(key) != SNAPSHOT_KEY_BYTES:
        raise SnapshotKeyError(f"a snapshot key is {SNAPSHOT_KEY_BYTES} bytes")
    return blake3.blake3(structure_bytes(domain, *fields), key=key).digest()


def seal_snapshot(key: bytes, domain: str, *fields: Any) -> bytes:
    """CBOR [domain, *fields, tag]: the fields with their keyed digest (`open_snapshot` checks it)."""
    return cbor.encode([domain, *fields, snapshot_tag(key, domain, *fields)])


def open_snapshot(key: bytes, data: bytes, domain: str, count: int,
                  unkeyed: tuple[str, ...] = ()) -> list[Any]:
    """The `count` fields of a `seal_snapshot` record, once its digest checks under `key`; else
    SnapshotError naming what is wrong (not a record, another kind, no digest, a wrong digest)."""
    try:
        obj = cbor.decode(bytes(data))
    except (CommitmentError, ValueError, TypeError) as exc:
        raise SnapshotError(f"not a {domain} snapshot: {exc}") from None
    kind = obj[0] if isinstance(obj, list) and obj else obj.get("version") if isinstance(obj, dict) else None
    if kind in unkeyed or (isinstance(kind, str) and kind.startswith("pot/protocol-state/")):
        raise SnapshotError(
            f"a {kind} snapshot, written without a key digest (by an older node): it cannot be "
            f"trusted; the state is derived again from the chain"
        )
    if not isinstance(obj, list) or kind != domain:
        raise SnapshotError(f"not a {domain} snapshot")
    if len(obj) != count + 2:
        raise SnapshotError(f"a {domain} snapshot has {count + 2} fields, this one {len(obj)}")
    tag = obj[-1]
    if not isinstance(tag, bytes) or len(tag) != TAG_BYTES:
        raise SnapshotError(f"the snapshot's key digest is not {TAG_BYTES} bytes")
    try:
        want = snapshot_tag(key, domain, *obj[1:-1])
    except (CommitmentError, ValueError, TypeError) as exc:
        raise SnapshotError(f"the snapshot's fields cannot be digested: {exc}") from None
    if not hmac.compare_digest(tag, want):
        raise SnapshotError(
            "the snapshot's key digest does not match this node's snapshot key: it was altered, "
            "or written under another key"
        )
    return obj[1:-1]


class ChainView:
    """The protocol state of one chain, as of `cursor` (the last block applied)."""

    def __init__(self, transport: Transport, params: ProtocolParams | None = None, *,
                 cursor: int = 0, state: ProtocolState | None = None, keep_events: bool = True) -> None:
        # Block 0 is genesis and carries no calls, so a fresh view starts after it.
        self.transport = transport
        if state is not None and params is not None and state.params != params:
            raise SnapshotError("the snapshot was made with other protocol parameters than the ones given")
        if state is None:  # a fresh state knows the authority the chain names (a dev chain's creator)
            state = new_state(params)
            state.authority = transport.network_authority()
        self.state = state
        self.cursor = cursor
        self.cursor_hash: bytes | None = None  # hash of block `cursor`, when known
        self.keep_events = keep_events
        self.events: list[Event] = []
        self.discarded: str | None = None  # why `resume` discarded the snapshot (None: used, or none)

    @property
    def params(self) -> ProtocolParams:
        return self.state.params

    def process(self, block: Block) -> list[Event]:
        """Apply one finalized block: protocol work first, then its calls in chain order."""
        if block.number != self.cursor + 1:
            raise ValueError(f"block {block.number} does not follow the cursor {self.cursor}")
        try:
            events = on_block(self.state, block)
        except Exception as exc:  # on_block contains each item itself; this is the last line
            log.exception("block %d: the protocol work of the block failed", block.number)
            events = [BlockWorkFailed(block.number, "block", "", type(exc).__name__)]
        for ev in events:
            if isinstance(ev, BlockWorkFailed):
                log.error(
                    "block %d: %s work on %s failed inside the protocol (%s); undone, the follower goes on",
                    block.number,
                    ev.stage,
                    ev.subject or "the stage",
                    ev.error_type,
                )
        block = self.transport.settle(block, self.state)  # calls that count under the parameters in force
        for ig in block.ignored:
            log.warning(
                "block %d: payload %d from %s ignored: %s", block.number, ig.position, ig.origin, ig.reason
            )
            events.append(RemarkIgnored(block.number, ig.position, ig.origin, ig.reason,
                                        IGNORE_REASONS.get(ig.reason, ""), ig.size, ig.payload_digest,
                                        ig.detail))
        for origin, call in block.calls:
            try:
                events += apply_recorded(self.state, call, origin, block)
            except Exception as exc:  # a protocol bug must not stop the node at this block forever
                # Only the exception's type is recorded: its text may hold the call's values, and
                # the record must be the same, and as small, on every node.
                log.exception("block %d: call from %s failed inside the protocol", block.number, origin)
                name = getattr(call, "NAME", None)
                name = name if isinstance(name, str) else "unknown"
                events.append(CallRefused(block.number, origin, name, ProtocolError.code,
                                          f"internal protocol error: {type(exc).__name__}"))
        self.cursor, self.cursor_hash = block.number, block.hash
        if self.keep_events:
            self.events += events
        return events

    def sync(self, until: int | None = None) -> list[Event]:
        """Apply every finalized block after the cursor (up to `until`); return their events."""
        head = self.transport.finalized_head()
        if until is not None:
            head = min(head, until)
        out: list[Event] = []
        while self.cursor < head:
            out += self.process(self.transport.block(self.cursor + 1))
        return out

    def follow(self, *, poll: float = 0.5, stop: Callable[[], bool] | None = None) -> Iterator[Event]:
        """Yield events as finalized blocks arrive, forever (or until `stop()`)."""
        for block in self.transport.follow(self.cursor, poll=poll, stop=stop):
            yield from self.process(block)

    # --- queries --------------------------------------------------------------------------
    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]

    def summary(self) -> dict[str, Any]:
        """What the state holds as of the cursor, JSON-ready: runs, the challenges still open
        (round, committee, how many committed and revealed, deadlines), the verdicts so far, and
        every verifier's active bond, unbonding amounts and penalties."""
        s = self.state
        open_ = sorted((c for c in s.challenges.values() if c.verdict is None),
                       key=lambda c: (c.issued, c.run_id, c.index, c.round))
        verdicts = Counter(c.verdict for c in s.challenges.values() if c.verdict is not None)
        return {
            "cursor": self.cursor,
            "runs": len(s.runs),
            "challenges": {
                "open": len(open_),
                "resolved": sum(verdicts.values()),
                "verdicts": dict(sorted(verdicts.items())),
            },
            "open_challenges": [_challenge_row(c) for c in open_],
            "verifiers": [
                {
                    "account": a,
                    "bond": s.vbonds.get(a, 0),
                    "eligible": s.vbonds.get(a, 0) >= s.params.verifier_stake,
                    "unbonding": [[release, amount] for release, amount in s.unbonding.get(a, [])],
                    "penalized": s.slashed.get(a, 0),
                }
                for a in s.verifiers
            ],
        }

    # --- snapshots ------------------------------------------------------------------------
    def save(self, path: str | Path, *, key: bytes | None = None) -> None:
        """Write (cursor, state) to `path` atomically and durably (commitments.files), with its
        keyed digest under `key` (default: `snapshot_key` of the file's folder).

        Mode 0600: only the follower that wrote a snapshot reads it back, and the state it holds
        (verifier accounts, reveals) is nobody else's business on a shared host.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        key = snapshot_key(path.parent) if key is None else key
        data = seal_snapshot(key, SNAPSHOT_DOMAIN, self.cursor, self.cursor_hash, self.state.to_cbor())
        atomic_write_bytes(path, data, mode=PRIVATE)

    @classmethod
    def load(cls, transport: Transport, path: str | Path, params: ProtocolParams | None = None,
             *, key: bytes | None = None, **kw) -> ChainView:
        """Resume from a snapshot written by `save`; a missing file starts from genesis.

        Refused (SnapshotError, naming the file and what is wrong): a digest that does not check
        under `key` (default: `snapshot_key` of the file's folder), a state that is malformed field
        by field (ProtocolState.from_cbor), a state ahead of its cursor. The snapshot remembers the
        hash of its cursor block: a snapshot of another chain (a recreated dev file, another
        network) is refused instead of silently mixing states.
        """
        path = Path(path)
        if not path.exists():
            return cls(transport, params, **kw)
        try:
            key = snapshot_key(path.parent) if key is None else key
            cursor, cursor_hash, state_bytes = open_snapshot(key, path.read_bytes(), SNAPSHOT_DOMAIN, 3,
                                                             UNKEYED_DOMAINS)
            if not isinstance(cursor, int) or isinstance(cursor, bool) or not 0 <= cursor < 1 << 63:
                raise SnapshotError("its cursor is not a block number")
            if cursor_hash is not None and not (isinstance(cursor_hash, bytes) and len(cursor_hash) == 32):
                raise SnapshotError("its cursor hash is not 32 bytes")
            if not isinstance(state_bytes, bytes):
                raise SnapshotError("its state is not a byte string")
            state = ProtocolState.from_cbor(state_bytes)
            if state.head > cursor:
                raise SnapshotError(f"its state is of block {state.head}, after its cursor {cursor}")
        except SnapshotError as exc:
            raise SnapshotError(f"{path}: unusable chain-view snapshot: {exc}") from None
        except OSError as exc:
            raise SnapshotError(f"{path}: the snapshot cannot be read: {exc}") from None
        if cursor_hash is not None:
            if transport.finalized_head() < cursor:
                raise SnapshotError(f"{path}: the snapshot is at block {cursor}, beyond this chain's head")
            if transport.block(cursor).hash != cursor_hash:
                raise SnapshotError(f"{path}: block {cursor} of this chain differs from the snapshot's")
        view = cls(transport, params, cursor=cursor, state=state, **kw)
        view.cursor_hash = cursor_hash
        return view

    @classmethod
    def resume(cls, transport: Transport, path: str | Path, params: ProtocolParams | None = None,
               *, key: bytes | None = None, **kw) -> ChainView:
        """`load`, except that a snapshot it refuses is discarded, never trusted and never fatal:
        the file is moved aside (to `<name>.refused`), a warning names what was wrong, and the view
        starts from genesis, so that `sync` derives the state again from the chain. The reason is
        kept in `discarded` (None when the snapshot was used or there was none)."""
        try:
            return cls.load(transport, path, params, key=key, **kw)
        except SnapshotError as exc:
            reason = str(exc)
        path = Path(path)
        with contextlib.suppress(OSError):
            os.replace(path, path.with_name(path.name + ".refused"))
        log.warning(
            "%s; the snapshot is discarded (kept as %s.refused) and the state derived again from genesis",
            reason,
            path.name,
        )
        view = cls(transport, params, **kw)
        view.discarded = reason
        return view


def _challenge_row(c: ChallengeState) -> dict[str, Any]:
    return {
        "challenge_id": c.challenge_id.hex(),
        "run_id": c.run_id.hex(),
        "step": c.step,
        "index": c.index,
        "round": c.round,
        "first": c.first.hex() if c.first is not None else None,
        "committee": list(c.committee),
        "opened": c.opening is not None,
        "commitments": len(c.commitments),
        "reveals": len(c.reveals),
        "opening_deadline": c.opening_deadline,
        "commit_deadline": c.commit_deadline,
        "reveal_deadline": c.reveal_deadline,
    }
