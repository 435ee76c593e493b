"""self-healing: restart and adoption facts on residencies, load failures, disabled reason

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_RESIDENCY_COLUMNS = (
    ("restart_count", sa.Integer(), "0"),
    ("last_failure_reason", sa.String(length=64), ""),
    ("last_failure_message", sa.Text(), ""),
    ("artifact_digest", sa.String(length=64), ""),
    ("adapter_digest", sa.String(length=64), ""),
    ("environment_fingerprint", sa.String(length=64), ""),
)


def upgrade() -> None:
    with op.batch_alter_table("residencies") as batch:
        for name, type_, default in _RESIDENCY_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=False, server_default=default))
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(
            sa.Column("load_failure_count", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("disabled_reason", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("disabled_reason")
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("load_failure_count")
    with op.batch_alter_table("residencies") as batch:
        for name, _, _ in reversed(_RESIDENCY_COLUMNS):
            batch.drop_column(name)
