"""scheduler assignment: the one row naming the scheduler every control-plane replica uses

A control plane given several scheduler addresses (`--scheduler a,b`) uses one of them at a time,
the same one on every replica, so a tenant's share holds across replicas. The leader names it
here (platform/scheduler_assignment.py): the first that answers at start, the next that answers
when the named one has been silent for the silence timeout, each move with the next `epoch`.
The row is created empty (address "", epoch 0): nothing is named until a leader names one. A
control plane given one address never reads it.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "scheduler_assignment",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("address", sa.String(length=255), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("assigned_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scheduler_assignment")),
    )
    op.bulk_insert(table, [{"id": 1, "address": "", "epoch": 0}])


def downgrade() -> None:
    op.drop_table("scheduler_assignment")
