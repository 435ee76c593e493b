"""an operator's placement constraints on deployments

A deployment may require a GPU model, a minimum compute capability, a minimum of free VRAM and
node labels of the node each replica goes to (CreateDeployment's `constraints`, checked before
they are written). They are one JSON object, PlacementConstraints as MessageToDict writes it;
rows made before this revision hold `{}`: no constraint, placed as they always were.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(
            sa.Column("placement_constraints", sa.JSON(), nullable=False, server_default="{}")
        )


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("placement_constraints")
