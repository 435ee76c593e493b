"""One database per test module, for module-scoped harnesses that walk a model to READY once per
store instead of once per test: the conftest's `database_url` is per test, so a module fixture
takes `MODULE_DATABASES` as its params and opens its store with `module_database`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import _fresh_postgres_database

# The same two stores, marked the same way, as the conftest's `database_url`.
MODULE_DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextlib.asynccontextmanager
async def module_database(kind: str, directory: Path) -> AsyncIterator[str]:
    """A SQLite file in `directory`, or a fresh PostgreSQL database dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite+aiosqlite:///{directory / 'gantry.db'}"
        return
    async for url in _fresh_postgres_database():
        yield url
