"""What the HTTP API may read of a running daemon: one small, read-only interface.

The API and the daemon meet in the database; the only live facts the API needs are the ones a
database row cannot hold fresh: the account the daemon signs with, the finalized head it has
seen, its replay slots and whether it is stopping. `NodeStatus` names them, the daemon implements
it, and the API depends on nothing else of the daemon (import-linter keeps `node.api` and
`node.daemon` independent; the type checker holds the API to this protocol).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class StatusSnapshot:
    """The daemon's live facts at one moment.

    `account` is "" before the daemon has connected; `head` is -1 before it has read a finalized
    head; `workers` and `busy` count replay slots (busy <= workers); `stopping` is true from the
    first stop signal on."""

    account: str
    head: int
    workers: int
    busy: int
    stopping: bool

    def __post_init__(self) -> None:
        if self.head < -1:
            raise ValueError(f"head is a block number or -1 (none seen yet), got {self.head}")
        if not 0 <= self.busy <= self.workers:
            raise ValueError(f"busy replay slots must be in 0..workers ({self.workers}), got {self.busy}")


@runtime_checkable
class NodeStatus(Protocol):
    """A running daemon, as the API sees it: a snapshot of its live facts, read without a lock
    (each field is one atomic read of the daemon's own state)."""

    def status(self) -> StatusSnapshot: ...


__all__ = ["NodeStatus", "StatusSnapshot"]
