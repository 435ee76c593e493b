"""Alembic environment: migrations run on the connection Database.migrate hands in."""

from __future__ import annotations

from alembic import context

from gantry.controlplane.platform.models import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through gantry.controlplane.platform.database.Database")

context.configure(
    connection=connection,
    target_metadata=target_metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
