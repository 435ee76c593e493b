"""autoscale bounds and placement policy on deployments

Every deployment row holds explicit bounds: CreateDeployment resolves "0 = replicas" before it
writes, and this revision gives rows made before it min = max = replicas (no autoscale), which is
what they were promised. The server default 0 is only there to add the NOT NULL columns; the
control plane still reads a stored 0 as "= replicas".

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(
            sa.Column("min_replicas", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("max_replicas", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column(
                "placement_policy", sa.String(length=16), nullable=False, server_default="BIN_PACK"
            )
        )
    op.execute("UPDATE deployments SET min_replicas = replicas, max_replicas = replicas")


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("placement_policy")
        batch.drop_column("max_replicas")
        batch.drop_column("min_replicas")
