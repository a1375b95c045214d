"""Derive the protocol state from a chain: follow finalized blocks and apply them in order.

Every node computes the same state this way, whatever the transport. A refused call becomes a
recorded `CallRefused` event, never an exception; a payload the transport could not decode becomes
a `RemarkIgnored` event, and a call whose application crashed inside the protocol a `CallRefused`
with the `ProtocolError` code; the cursor moves past every block whatever its payloads hold. The state and cursor can be saved to a
snapshot file (written atomically) so a restarted follower resumes where it stopped.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chain.calls import IGNORE_REASONS
from chain.protocol.events import CallRefused, Event, RemarkIgnored
from chain.protocol.params import ProtocolParams
from chain.protocol.refusals import ProtocolError
from chain.protocol.rules import apply_recorded, on_block
from chain.protocol.state import ChallengeState, ProtocolState, SnapshotError, new_state
from chain.transport import Block, Transport
from commitments import cbor
from commitments.errors import CommitmentError
from commitments.files import PRIVATE, atomic_write_bytes

SNAPSHOT_DOMAIN = "pot/chain-view/v1"
log = logging.getLogger(__name__)


class ChainView:
    """The protocol state of one chain, as of `cursor` (the last block applied)."""

    def __init__(self, transport: Transport, params: ProtocolParams | None = None, *,
                 cursor: int = 0, state: ProtocolState | None = None, keep_events: bool = True) -> None:
        # Block 0 is genesis and carries no calls, so a fresh view starts after it.
        self.transport = transport
        if state is not None and params is not None and state.params != params:
            raise SnapshotError("the snapshot was made with other protocol parameters than the ones given")
        self.state = state if state is not None else new_state(params)
        self.cursor = cursor
        self.cursor_hash: bytes | None = None  # hash of block `cursor`, when known
        self.keep_events = keep_events
        self.events: list[Event] = []

    @property
    def params(self) -> ProtocolParams:
        return self.state.params

    def process(self, block: Block) -> list[Event]:
        """Apply one finalized block: protocol work first, then its calls in chain order."""
        if block.number != self.cursor + 1:
            raise ValueError(f"block {block.number} does not follow the cursor {self.cursor}")
        events = on_block(self.state, block)
        for ig in block.ignored:
            log.warning("block %d: payload %d from %s ignored: %s", block.number, ig.position, ig.origin, ig.reason)
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
            "challenges": {"open": len(open_), "resolved": sum(verdicts.values()), "verdicts": dict(sorted(verdicts.items()))},
            "open_challenges": [_challenge_row(c) for c in open_],
            "verifiers": [
                {"account": a, "bond": s.vbonds.get(a, 0), "eligible": s.vbonds.get(a, 0) >= s.params.verifier_stake,
                 "unbonding": [[release, amount] for release, amount in s.unbonding.get(a, [])],
                 "penalized": s.slashed.get(a, 0)}
                for a in s.verifiers
            ],
        }

    # --- snapshots ------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write (cursor, state) to `path` atomically and durably (commitments.files).

        Mode 0600: only the follower that wrote a snapshot reads it back, and the state it holds
        (verifier accounts, reveals) is nobody else's business on a shared host.
        """
        data = cbor.encode([SNAPSHOT_DOMAIN, self.cursor, self.cursor_hash, self.state.to_cbor()])
        atomic_write_bytes(path, data, mode=PRIVATE)

    @classmethod
    def load(cls, transport: Transport, path: str | Path, params: ProtocolParams | None = None,
             **kw) -> ChainView:
        """Resume from a snapshot written by `save`; a missing file starts from genesis.

        The snapshot remembers the hash of its cursor block: a snapshot of another chain (a
        recreated dev file, another network) is refused instead of silently mixing states.
        """
        path = Path(path)
        if not path.exists():
            return cls(transport, params, **kw)
        try:
            domain, cursor, cursor_hash, state_bytes = cbor.decode(path.read_bytes())
            if domain != SNAPSHOT_DOMAIN or not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
                raise SnapshotError(f"not a {SNAPSHOT_DOMAIN} snapshot")
        except (CommitmentError, ValueError, TypeError) as exc:
            raise SnapshotError(f"{path}: unusable chain-view snapshot: {exc}") from None
        try:
            state = ProtocolState.from_cbor(state_bytes)
        except SnapshotError as exc:  # e.g. a snapshot of protocol v1: say which file
            raise SnapshotError(f"{path}: {exc}") from None
        if cursor_hash is not None:
            if transport.finalized_head() < cursor:
                raise SnapshotError(f"{path}: the snapshot is at block {cursor}, beyond this chain's head")
            if transport.block(cursor).hash != cursor_hash:
                raise SnapshotError(f"{path}: block {cursor} of this chain differs from the snapshot's")
        view = cls(transport, params, cursor=cursor, state=state, **kw)
        view.cursor_hash = cursor_hash
        return view


def _challenge_row(c: ChallengeState) -> dict[str, Any]:
    return {
        "challenge_id": c.challenge_id.hex(), "run_id": c.run_id.hex(), "step": c.step, "index": c.index,
        "round": c.round, "first": c.first.hex() if c.first is not None else None, "committee": list(c.committee),
        "opened": c.opening is not None, "commitments": len(c.commitments), "reveals": len(c.reveals),
        "opening_deadline": c.opening_deadline, "commit_deadline": c.commit_deadline,
        "reveal_deadline": c.reveal_deadline,
    }
