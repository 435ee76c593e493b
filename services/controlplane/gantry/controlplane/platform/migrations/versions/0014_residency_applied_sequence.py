"""the worker message a residency was last changed by

A worker stamps every inventory and job result with one sequence per process (Inventory.sequence,
JobResult.sequence). A residency records the generation and sequence of the last result or
inventory applied to it, so a replica that reads an older inventory late (it was stopped, or its
stream backed up) leaves the residency alone (nodes/inventory_rules.py). Rows made before this
revision hold 0: never judged newer than any inventory.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("residencies") as batch:
        batch.add_column(
            sa.Column("applied_generation", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("applied_sequence", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("residencies") as batch:
        batch.drop_column("applied_sequence")
        batch.drop_column("applied_generation")
