"""Protocol v3: a challenge's escalation window and what this node did about it.

`escalate_deadline` is the last block an escalation of the round is accepted
(ChallengeIssued.escalate_deadline; the round resolves at the block after it). `escalation` is this
node's escalation of the round: journaled (the call is in txs, kind "escalate"), unaffordable (its
free bond did not cover escalation_stake), escalated (ChallengeEscalated on chain), returned or
forfeited (EscalationSettled). Fees, escalations and their settlements of this node's account go to
stake_events (VerifierPaid, ChallengeEscalated, EscalationSettled), whose columns already fit them.

Revision ID: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

CHALLENGE_COLUMNS = (("escalate_deadline", sa.BigInteger), ("escalation", sa.String(16)))


def upgrade() -> None:
    with op.batch_alter_table("challenges") as b:
        for name, kind in CHALLENGE_COLUMNS:
            b.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("challenges") as b:
        for name, _ in reversed(CHALLENGE_COLUMNS):
            b.drop_column(name)
