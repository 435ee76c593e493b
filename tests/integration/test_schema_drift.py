"""The ORM models and the Alembic head describe the same schema, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from gantry.controlplane.platform.database import Database, head_revision
from gantry.controlplane.platform.models import Base


def _differences(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(
        connection,
        opts={"compare_type": True, "target_metadata": Base.metadata},
    )
    return list(compare_metadata(context, Base.metadata))


async def test_autogenerate_finds_nothing_between_the_models_and_the_migrations(
    database_url: str,
) -> None:
    database = Database.connect(database_url)
    try:
        assert await database.migrate() == head_revision()
        async with database.engine.connect() as connection:
            differences = await connection.run_sync(_differences)
    finally:
        await database.close()
    # A difference here means a model changed without a migration (or the reverse): write the
    # revision that makes them agree.
    assert differences == []


async def test_the_migrations_have_one_head_and_the_database_reaches_it(database_url: str) -> None:
    database = Database.connect(database_url)
    try:
        await database.migrate()
        assert await database.schema_revisions() == (head_revision(),)
    finally:
        await database.close()
