"""Protocol v2: committees and rounds of a challenge, the witness pair's proof hash, opening
mirrors, penalties, and this node's stake events (bonds, unbonding, releases, penalties).

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CHALLENGE_COLUMNS = (
    ("round", sa.Integer), ("first_id", sa.LargeBinary), ("committee", sa.Text), ("on_committee", sa.Boolean),
    ("rechallenge", sa.LargeBinary), ("opening_mirrors", sa.Text), ("opening_source", sa.Text),
    ("replay_proof_hash", sa.LargeBinary), ("proof_hash", sa.LargeBinary), ("penalty", sa.Integer),
    ("penalty_why", sa.String(16)),
)


def upgrade() -> None:
    with op.batch_alter_table("challenges") as b:
        for name, kind in CHALLENGE_COLUMNS:
            b.add_column(sa.Column(name, kind, nullable=True))
    with op.batch_alter_table("witnesses") as b:
        b.add_column(sa.Column("proof_hash", sa.LargeBinary, nullable=True))
    with op.batch_alter_table("witness_conflicts") as b:
        b.add_column(sa.Column("journaled_proof_hash", sa.LargeBinary, nullable=True))
        b.add_column(sa.Column("recomputed_proof_hash", sa.LargeBinary, nullable=True))
    op.create_table(
        "stake_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("block", sa.Integer, nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("verifier", sa.String(128), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
        sa.Column("bond", sa.Integer, nullable=True),
        sa.Column("release_block", sa.Integer, nullable=True),
        sa.Column("challenge_id", sa.LargeBinary, nullable=True),
        sa.Column("why", sa.String(16), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_stake_events_verifier", "stake_events", ["verifier"])


def downgrade() -> None:
    op.drop_index("ix_stake_events_verifier", table_name="stake_events")
    op.drop_table("stake_events")
    with op.batch_alter_table("witness_conflicts") as b:
        b.drop_column("recomputed_proof_hash")
        b.drop_column("journaled_proof_hash")
    with op.batch_alter_table("witnesses") as b:
        b.drop_column("proof_hash")
    with op.batch_alter_table("challenges") as b:
        for name, _ in reversed(CHALLENGE_COLUMNS):
            b.drop_column(name)
