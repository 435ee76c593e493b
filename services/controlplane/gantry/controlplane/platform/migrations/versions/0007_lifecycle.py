"""operator lifecycle: soft deletion and the state-transition history

Deleted deployments, artifact sets and nodes keep their rows (deleted_at set), so their history,
audit trail and evidence stay readable and `gantry up` can tell "deleted" from "never made". A
node name is unique only among nodes that are not deleted. `state_transitions` is append-only.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_LIVE = sa.text("deleted_at IS NULL")


def upgrade() -> None:
    for table in ("deployments", "artifact_sets"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
        batch.drop_constraint("uq_nodes_name", type_="unique")
    op.create_index(
        "uq_nodes_live_name",
        "nodes",
        ["name"],
        unique=True,
        sqlite_where=_LIVE,
        postgresql_where=_LIVE,
    )
    op.create_table(
        "state_transitions",
        sa.Column("transition_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("subject_kind", sa.String(length=50), nullable=False),
        sa.Column("subject_id", sa.String(length=200), nullable=False),
        sa.Column("deployment_id", sa.String(length=36), nullable=True),
        sa.Column("from_state", sa.String(length=32), nullable=False),
        sa.Column("to_state", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("transition_id", name=op.f("pk_state_transitions")),
    )
    op.create_index(
        "ix_state_transitions_subject", "state_transitions", ["subject_kind", "subject_id"]
    )
    op.create_index(
        op.f("ix_state_transitions_deployment_id"), "state_transitions", ["deployment_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_state_transitions_deployment_id"), table_name="state_transitions")
    op.drop_index("ix_state_transitions_subject", table_name="state_transitions")
    op.drop_table("state_transitions")
    op.drop_index("uq_nodes_live_name", table_name="nodes")
    with op.batch_alter_table("nodes") as batch:
        batch.create_unique_constraint("uq_nodes_name", ["name"])
        batch.drop_column("deleted_at")
    for table in ("artifact_sets", "deployments"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("deleted_at")
