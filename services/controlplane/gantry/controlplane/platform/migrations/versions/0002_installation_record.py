"""installation record: one row saying which installation this is and what migrated it

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 17:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "installation",
        sa.Column("installation_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schema_revision", sa.String(length=32), nullable=False),
        sa.Column("gantry_version", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("installation_id", name=op.f("pk_installation")),
    )


def downgrade() -> None:
    op.drop_table("installation")
