"""Counters of the block work the chain follower contained (BlockWorkFailed events: a part of a
block's protocol work that failed inside the protocol and was undone), by stage. Kept in node_meta,
bumped in the same transaction as the block that recorded them, read by the metrics at scrape time:
a bounded set of rows (the stages of chain.protocol.events.BLOCK_WORK_STAGES, and "block")."""

from __future__ import annotations

from sqlalchemy import select, update

from node.db import node_meta

BLOCK_FAULT_KEY = "block_work_failed:"


def count_block_fault(conn, stage: str, n: int = 1) -> None:
    key = BLOCK_FAULT_KEY + stage
    row = conn.execute(select(node_meta.c.value).where(node_meta.c.key == key)).first()
    if row is None:
        conn.execute(node_meta.insert().values(key=key, value=str(n)))
    else:
        conn.execute(update(node_meta).where(node_meta.c.key == key).values(value=str(int(row.value) + n)))


def block_fault_counts(conn) -> dict[str, int]:
    rows = conn.execute(select(node_meta.c.key, node_meta.c.value).where(node_meta.c.key.like(BLOCK_FAULT_KEY + "%")))
    return {k[len(BLOCK_FAULT_KEY):]: int(v) for k, v in rows}
