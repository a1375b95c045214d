"""The determinism alarm: witness_conflicts, one row per journal repeat with a different value.

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "witness_conflicts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("challenge_id", sa.LargeBinary, nullable=False),
        sa.Column("verifier", sa.String(128), nullable=False),
        sa.Column("journaled_value_hash", sa.LargeBinary, nullable=False),
        sa.Column("journaled_norm_bucket", sa.Integer, nullable=False),
        sa.Column("recomputed_value_hash", sa.LargeBinary, nullable=False),
        sa.Column("recomputed_norm_bucket", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("acknowledged_at", sa.Float, nullable=True),
    )
    op.create_index("ix_witness_conflicts_challenge", "witness_conflicts", ["challenge_id"])


def downgrade() -> None:
    op.drop_index("ix_witness_conflicts_challenge", table_name="witness_conflicts")
    op.drop_table("witness_conflicts")
