"""tenant policies: the scheduler's per-tenant weight, depth, quota, budget and priorities

Every column has a server default equal to the policy default, so a tenant row made before this
revision (or by CreateApiKey, which names no policy) reads as the default policy. A NULL
updated_at says no operator has stored a policy for the tenant yet.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_POLICY_COLUMNS = (
    ("weight", sa.Integer(), "1"),
    ("max_queue_depth", sa.Integer(), "0"),
    ("max_concurrency", sa.Integer(), "0"),
    ("budget_units", sa.BigInteger(), "0"),
    ("budget_window_seconds", sa.Integer(), "60"),
    ("allowed_priorities", sa.JSON(), "[]"),
    ("updated_by", sa.String(length=200), ""),
)


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        for name, type_, default in _POLICY_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=False, server_default=default))
        batch.add_column(sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("updated_at")
        for name, _, _ in reversed(_POLICY_COLUMNS):
            batch.drop_column(name)
