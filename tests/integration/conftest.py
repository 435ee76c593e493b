"""Fixtures the integration tests share (the repository-wide ones are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gantry.controlplane.platform.database import Database


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """A migrated database on each store `database_url` names, closed afterwards."""
    db = Database.connect(database_url)
    await db.migrate()
    yield db
    await db.close()
