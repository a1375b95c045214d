"""Counters of the block work the chain follower contained (BlockWorkFailed events: a part of a
block's protocol work that failed inside the protocol and was undone), by stage. Kept in node_meta,
bumped in the same transaction as the block that recorded them, read by the metrics at scrape time:
a bounded set of rows (the stages of chain.protocol.events.BLOCK_WORK_STAGES, and "block")."""

from __future__ import annotations

from node.db import bump_counter, counters

BLOCK_FAULT_KEY = "block_work_failed:"


def count_block_fault(conn, stage: str, n: int = 1) -> None:
    bump_counter(conn, BLOCK_FAULT_KEY, stage, n)


def block_fault_counts(conn) -> dict[str, int]:
    return counters(conn, BLOCK_FAULT_KEY)
