"""control-plane leadership: the one row holding the deciding replica's fencing epoch

Control-plane replicas on one PostgreSQL database elect one decider through an advisory lock
(platform/leadership.py); the one that takes it bumps `epoch` here before it decides, and every
write a decider makes checks the epoch is still its own. The row is created here with epoch 0,
so the first leader's epoch is 1. SQLite holds the row too; there the one replica is the leader
and never bumps it.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "control_plane_leadership",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_control_plane_leadership")),
    )
    op.bulk_insert(table, [{"id": 1, "epoch": 0, "holder": ""}])


def downgrade() -> None:
    op.drop_table("control_plane_leadership")
