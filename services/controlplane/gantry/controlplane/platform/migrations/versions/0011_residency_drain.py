"""a draining residency's deadline

A residency that drains before it unloads (DrainDeployment, a scale down) is DRAINING until its
calls in flight have finished or `drain_deadline_at` passes, whichever comes first. Rows made
before this revision hold NULL: none of them is DRAINING (nothing entered that state before).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("residencies") as batch:
        batch.add_column(sa.Column("drain_deadline_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("residencies") as batch:
        batch.drop_column("drain_deadline_at")
