"""adopted endpoints: external OpenAI-compatible servers Gantry routes to but never runs

A deployment gains `origin` ("pipeline" or "adopted") and may have no artifact set (an adopted
one). `adopted_endpoints` holds each server's node, URL, model and sealed credential.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batch mode: SQLite rebuilds the table to change a column's nullability.
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(
            sa.Column("origin", sa.String(length=16), server_default="pipeline", nullable=False)
        )
        batch.alter_column("artifact_set_id", existing_type=sa.String(length=36), nullable=True)
    op.create_table(
        "adopted_endpoints",
        sa.Column("endpoint_id", sa.String(length=36), nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=False),
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("credential_sealed", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.deployment_id"],
            name=op.f("fk_adopted_endpoints_deployment_id_deployments"),
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.node_id"], name=op.f("fk_adopted_endpoints_node_id_nodes")
        ),
        sa.PrimaryKeyConstraint("endpoint_id", name=op.f("pk_adopted_endpoints")),
        sa.UniqueConstraint("deployment_id", name=op.f("uq_adopted_endpoints_deployment_id")),
    )
    op.create_index(op.f("ix_adopted_endpoints_node_id"), "adopted_endpoints", ["node_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_adopted_endpoints_node_id"), table_name="adopted_endpoints")
    op.drop_table("adopted_endpoints")
    # An adopted deployment has no artifact set: NOT NULL fails while one is recorded, on
    # purpose (its history would otherwise be dropped silently).
    with op.batch_alter_table("deployments") as batch:
        batch.alter_column("artifact_set_id", existing_type=sa.String(length=36), nullable=False)
        batch.drop_column("origin")
