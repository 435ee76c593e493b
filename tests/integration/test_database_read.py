"""`Database.read`: a unit of work that only reads, for the reads on a client's path.

On SQLite it takes no write turn (a deferred BEGIN; WAL reads beside the one writer), so it is not
held up by a writer and never holds one up; it sees the last commit, never a change in flight; a
change made in it is refused and not kept; the rows it read stay loaded after it. Both stores."""

from __future__ import annotations

import asyncio

import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.platform import credentials
from gantry.controlplane.platform.database import Database
from tests.integration.db_events import queries


async def _key(database: Database) -> str:
    async with database.transaction() as session:
        row, _ = await credentials.create_api_key(
            session, tenant_id="tenant-a", name="read", now=ManualClock().now()
        )
    return row.api_key_id


async def test_a_read_runs_while_a_writer_holds_its_turn_and_sees_the_last_commit(
    database: Database,
) -> None:
    api_key_id = await _key(database)
    holding, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:
        async with database.transaction() as session:
            await credentials.revoke_api_key(session, api_key_id, now=ManualClock().now())
            holding.set()
            await release.wait()  # the revocation flushed, not committed, the turn held

    writing = asyncio.create_task(writer())
    await asyncio.wait_for(holding.wait(), 5)
    # A `transaction` here would wait for the writer's turn (SQLite) or its row lock: a read
    # does not, and sees the key as the last commit left it.
    async with asyncio.timeout(5):
        async with database.read() as session:
            row = await credentials.find_api_key(session, api_key_id)
    assert row is not None and row.revoked_at is None
    release.set()
    await writing
    async with database.read() as session:
        row = await credentials.find_api_key(session, api_key_id)
    assert row is not None and row.revoked_at is not None


async def test_a_change_made_in_a_read_is_refused_and_not_kept(database: Database) -> None:
    api_key_id = await _key(database)
    with pytest.raises(RuntimeError, match="read-only"):
        async with database.read() as session:
            await credentials.revoke_api_key(session, api_key_id, now=ManualClock().now())
    with pytest.raises(RuntimeError, match="read-only"):  # not flushed: the closing commit
        async with database.read() as session:
            row = await credentials.find_api_key(session, api_key_id)
            assert row is not None
            row.name = "renamed"
    async with database.read() as session:
        row = await credentials.find_api_key(session, api_key_id)
    assert row is not None and row.revoked_at is None and row.name == "read"


async def test_the_rows_a_read_returned_stay_loaded_after_it(database: Database) -> None:
    api_key_id = await _key(database)
    async with database.read() as session:
        row = await credentials.find_api_key(session, api_key_id)
    assert row is not None
    with queries(database) as sent:
        assert (row.tenant_id, row.name) == ("tenant-a", "read")
    assert sent == []  # read from the loaded row, not the database
