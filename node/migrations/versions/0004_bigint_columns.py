"""64-bit columns: block numbers, deadlines, stakes, amounts, penalties and sizes as BIGINT.

Protocol parameters reach 2^54 blocks and bonds 2^48 units (chain/protocol/params.py), so every
block number and amount the protocol derives needs 63 bits; PostgreSQL's INTEGER holds 31. Steps,
tree sizes, indexes, rounds, norm buckets and counters stay INTEGER: their caps are below 2^31.
SQLite keeps 64-bit integers in any INTEGER column; its tables are rebuilt (batch mode) so their
declared types match the model.

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# table -> [(column, nullable)]
BIGINT_COLUMNS = {
    "chain_cursor": [("block", False)],
    "chain_events": [("block", False)],
    "runs": [("registered_block", False), ("slashed", False)],
    "challenges": [
        ("issued_block", False),
        ("opening_deadline", False),
        ("commit_deadline", False),
        ("reveal_deadline", False),
        ("opening_block", True),
        ("opening_bytes", True),
        ("replay_loss_bits", True),
        ("resolved_block", True),
        ("miner_slashed", True),
        ("penalty", True),
    ],
    "stake_events": [("block", False), ("amount", False), ("bond", True), ("release_block", True)],
    "txs": [("sent_block", True), ("block", True)],
}


def _alter(old: type, new: type) -> None:
    for table, columns in BIGINT_COLUMNS.items():
        with op.batch_alter_table(table) as b:
            for name, nullable in columns:
                b.alter_column(name, type_=new, existing_type=old, existing_nullable=nullable)


def upgrade() -> None:
    _alter(sa.Integer, sa.BigInteger)


def downgrade() -> None:
    _alter(sa.BigInteger, sa.Integer)
