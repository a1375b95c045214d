"""A chain without transport for protocol unit tests: blocks are made in memory, in order."""

from __future__ import annotations

from typing import Any

from chain.protocol import Event, ProtocolParams, ProtocolState, apply, apply_recorded, new_state, on_block
from chain.transport import Block
from commitments.hashing import digest


class PureChain:
    def __init__(self, params: ProtocolParams | None = None) -> None:
        self.state: ProtocolState = new_state(params)
        self.number = 0
        self.events: list[Event] = []

    def block(self, *calls: tuple[str, Any], strict: bool = True) -> list[Event]:
        """Make the next block with `calls` [(origin, call)]; strict: refusals raise."""
        self.number += 1
        blk = Block(self.number, digest("pot/test/block/v1", self.number), tuple(calls))
        out = on_block(self.state, blk)
        self.events += out
        for origin, call in calls:
            evs = (apply if strict else apply_recorded)(self.state, call, origin, blk)
            self.events += evs
            out += evs
        return out

    def advance_to(self, number: int) -> list[Event]:
        out: list[Event] = []
        while self.number < number:
            out += self.block()
        return out

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]
