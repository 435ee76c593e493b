"""the worker streams each control-plane replica holds

Every worker holds a stream to every control-plane replica; a node is connected while some
replica's row here, of the node's current generation, was heard within the staleness grace. A
replica writes its row at the stream's Hello, refreshes `heard_at` when it flushes `last_seen_at`
and deletes the row when the stream ends. Rows made before this revision: none (the table is new,
and a replica that starts on it finds its workers' Hellos write their rows).

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_streams",
        sa.Column("node_id", sa.String(length=36), nullable=False),
        sa.Column("replica_id", sa.String(length=255), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("heard_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("node_id", "replica_id", name=op.f("pk_node_streams")),
    )


def downgrade() -> None:
    op.drop_table("node_streams")
