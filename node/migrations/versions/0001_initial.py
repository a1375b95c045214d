"""Initial node schema: cursor, events, runs, challenge jobs, stage log, witness journal, txs.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "chain_cursor",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("block", sa.Integer, nullable=False),
        sa.Column("block_hash", sa.LargeBinary, nullable=True),
        sa.Column("snapshot", sa.LargeBinary, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "chain_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("block", sa.Integer, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("challenge_id", sa.LargeBinary, nullable=True),
        sa.Column("run_id", sa.LargeBinary, nullable=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.UniqueConstraint("block", "position", name="uq_chain_events_block_position"),
    )
    op.create_index("ix_chain_events_challenge", "chain_events", ["challenge_id"])
    op.create_table(
        "runs",
        sa.Column("run_id", sa.LargeBinary, primary_key=True),
        sa.Column("miner", sa.String(128), nullable=False),
        sa.Column("spec_digest", sa.LargeBinary, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("declared_steps", sa.Integer, nullable=False),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("initial_hash", sa.LargeBinary, nullable=False),
        sa.Column("schedule_commitment", sa.LargeBinary, nullable=False),
        sa.Column("dataset_hash", sa.LargeBinary, nullable=False),
        sa.Column("registered_block", sa.Integer, nullable=False),
        sa.Column("slashed", sa.Integer, nullable=False),
    )
    op.create_table(
        "challenges",
        sa.Column("challenge_id", sa.LargeBinary, primary_key=True),
        sa.Column("run_id", sa.LargeBinary, sa.ForeignKey("runs.run_id"), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("root", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("issued_block", sa.Integer, nullable=False),
        sa.Column("opening_deadline", sa.Integer, nullable=False),
        sa.Column("commit_deadline", sa.Integer, nullable=False),
        sa.Column("reveal_deadline", sa.Integer, nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("opening_digest", sa.LargeBinary, nullable=True),
        sa.Column("opening_uri", sa.Text, nullable=True),
        sa.Column("leaf", sa.LargeBinary, nullable=True),
        sa.Column("leaf_hash", sa.LargeBinary, nullable=True),
        sa.Column("opening_block", sa.Integer, nullable=True),
        sa.Column("opening_path", sa.Text, nullable=True),
        sa.Column("opening_bytes", sa.Integer, nullable=True),
        sa.Column("refusal_class", sa.String(32), nullable=True),
        sa.Column("refusal_reason", sa.Text, nullable=True),
        sa.Column("loss_checks", sa.Text, nullable=True),
        sa.Column("replay_leaf", sa.LargeBinary, nullable=True),
        sa.Column("replay_state_digest", sa.LargeBinary, nullable=True),
        sa.Column("replay_loss_bits", sa.Integer, nullable=True),
        sa.Column("matches_leaf", sa.Boolean, nullable=True),
        sa.Column("value_hash", sa.LargeBinary, nullable=True),
        sa.Column("norm_bucket", sa.Integer, nullable=True),
        sa.Column("fault", sa.String(16), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("verdict_reason", sa.Text, nullable=True),
        sa.Column("resolved_block", sa.Integer, nullable=True),
        sa.Column("winning_value", sa.Text, nullable=True),
        sa.Column("in_winning_cluster", sa.Boolean, nullable=True),
        sa.Column("outlier", sa.Boolean, nullable=True),
        sa.Column("miner_slashed", sa.Integer, nullable=True),
        sa.Column("status", sa.Text, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_challenges_stage", "challenges", ["stage"])
    op.create_table(
        "stage_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("challenge_id", sa.LargeBinary, sa.ForeignKey("challenges.challenge_id"), nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
    )
    op.create_index("ix_stage_log_challenge", "stage_log", ["challenge_id"])
    op.create_table(
        "witnesses",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("challenge_id", sa.LargeBinary, nullable=False),
        sa.Column("verifier", sa.String(128), nullable=False),
        sa.Column("salt", sa.LargeBinary, nullable=False),
        sa.Column("value_hash", sa.LargeBinary, nullable=False),
        sa.Column("norm_bucket", sa.Integer, nullable=False),
        sa.Column("commitment", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("challenge_id", "verifier", name="uq_witnesses_challenge_verifier"),
    )
    op.create_table(
        "txs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("challenge_id", sa.LargeBinary, nullable=False),
        sa.Column("verifier", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("origin", sa.String(128), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tx_hash", sa.LargeBinary, nullable=True),
        sa.Column("sent_block", sa.Integer, nullable=True),
        sa.Column("block", sa.Integer, nullable=True),
        sa.Column("sends", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("challenge_id", "verifier", "kind", name="uq_txs_challenge_verifier_kind"),
    )


def downgrade() -> None:
    for name in ("txs", "witnesses", "stage_log", "challenges", "runs", "chain_events", "chain_cursor",
                 "node_meta"):
        op.drop_table(name)
