"""The database seam: engine, sessions and migrations for SQLite (default) or PostgreSQL."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    # WAL lets readers run beside the one writer; foreign keys are off by default in SQLite.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


@dataclass(slots=True)
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    @classmethod
    def connect(cls, url: str) -> Database:
        engine = create_async_engine(url, pool_pre_ping=True)
        if engine.dialect.name == "sqlite":
            event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return cls(engine=engine, sessions=async_sessionmaker(engine, expire_on_commit=False))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """One unit of work: repository functions flush, this commits (or rolls back on error)."""
        async with self.sessions() as session, session.begin():
            yield session

    async def migrate(self) -> None:
        """Upgrade the schema to the newest Alembic revision (from empty on first start)."""
        async with self.engine.begin() as connection:
            await connection.run_sync(_upgrade)

    async def close(self) -> None:
        await self.engine.dispose()


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "head")
