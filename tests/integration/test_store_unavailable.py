"""Issue 26, item 9: a database that cannot take a call (locked by another process, read-only) is
answered STORE_UNAVAILABLE (UNAVAILABLE, retryable, with its ErrorInfo) within the bounded wait,
on the gRPC door and the HTTP door, with nothing changed; it was INTERNAL (OperationalError) or a
stall to the client's deadline. Real SQLite locked by a second connection, real PostgreSQL made
read-only or locked by a second session."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import grpc
import httpx
import pytest
from sqlalchemy import text

from gantry.common.errors import GantryError
from gantry.common.status import error_info_of
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform import database as database_module
from gantry.controlplane.platform.database import Database, sqlite_file
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry
from tests.integration.polling import wait_until

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
# Short, so a test waits little for the bound it checks: the default is database.STORE_WAIT_S.
WAIT_S = 0.5
# Far past the bound: a call answered DEADLINE_EXCEEDED would be a stall, not a refusal.
CLIENT_DEADLINE_S = 60.0


@pytest.fixture
def short_store_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database_module, "STORE_WAIT_S", WAIT_S)


@pytest.fixture
async def sqlite_gantry(
    short_store_wait: None, sqlite_url: str, tmp_path: Path
) -> AsyncIterator[Harness]:
    async with running_gantry(sqlite_url, tmp_path, http_listen="127.0.0.1:0") as harness:
        yield harness


@contextlib.contextmanager
def sqlite_locked(url: str) -> Iterator[None]:
    """Another connection (as another process would) holding SQLite's write lock."""
    path = sqlite_file(url)
    assert path is not None
    # It waits its turn for the lock (the control plane's own writes, a heartbeat's flush, are
    # short), as long as a test may: then it holds it.
    holder = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        yield
        holder.execute("ROLLBACK")
    finally:
        holder.close()


async def _register(harness: Harness, name: str) -> cp.RegisterNodeResponse:
    return await harness.operator.RegisterNode(
        cp.RegisterNodeRequest(name=name), metadata=harness.op_md, timeout=CLIENT_DEADLINE_S
    )


async def _node_names(harness: Harness) -> set[str]:
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return {node.name for node in listed.nodes}


def _assert_store_unavailable(failure: grpc.aio.AioRpcError) -> dict[str, str]:
    assert failure.code() == grpc.StatusCode.UNAVAILABLE, failure
    info = error_info_of(failure)
    assert info is not None and info.reason == "STORE_UNAVAILABLE"
    details = failure.details() or ""
    assert "Traceback" not in details and "Error" not in details, details
    return dict(info.metadata)


async def test_a_write_while_sqlite_is_locked_elsewhere_is_refused_typed(sqlite_gantry: Harness):
    url = sqlite_gantry.control_plane.database.engine.url.render_as_string()
    with sqlite_locked(url):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _register(sqlite_gantry, "while-locked")
        metadata = _assert_store_unavailable(refused.value)
        assert metadata["store"] == "sqlite"
        assert metadata["store_code"] in ("SQLITE_BUSY", "TURN_TIMEOUT")
    # Nothing was written, and the same call succeeds once the lock is gone.
    assert "while-locked" not in await _node_names(sqlite_gantry)
    await _register(sqlite_gantry, "while-locked")
    assert "while-locked" in await _node_names(sqlite_gantry)


async def test_the_http_door_reads_while_a_writer_elsewhere_holds_the_lock(sqlite_gantry: Harness):
    """Its reads (the model list, a route, a key) take no write lock (`Database.read`): WAL
    serves them beside the writer. Before, they waited for the lock and were refused 503."""
    api = sqlite_gantry.control_plane.http_api
    assert api is not None
    url = sqlite_gantry.control_plane.database.engine.url.render_as_string()
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{api.port}/v1",
        headers={"Authorization": f"Bearer {sqlite_gantry.api_key}"},
        timeout=CLIENT_DEADLINE_S,
    ) as http:
        with sqlite_locked(url):
            response = await http.get("/models")
        assert response.status_code == 200, response.text
        assert response.json() == {"object": "list", "data": []}


async def test_a_transaction_on_a_sqlite_file_locked_elsewhere_is_store_unavailable(
    short_store_wait: None, sqlite_url: str
):
    """SQLite's own refusal ("database is locked" past busy_timeout), with no other transaction
    of this process in the way: mapped by the store, rolled back, and the next one commits."""
    database = Database.connect(sqlite_url)
    await database.migrate()
    try:
        with sqlite_locked(sqlite_url):
            with pytest.raises(GantryError) as refused:
                async with database.transaction() as session:
                    await nodes.register_node(session, name="locked-out", labels={}, now=NOW)
        assert refused.value.reason == "STORE_UNAVAILABLE"
        assert refused.value.metadata == {"store": "sqlite", "store_code": "SQLITE_BUSY"}
        assert "database is locked" in refused.value.message
        async with database.transaction() as session:
            assert await nodes.list_nodes(session, after="", limit=10) == []
            await nodes.register_node(session, name="locked-out", labels={}, now=NOW)
    finally:
        await database.close()


async def test_transactions_queued_behind_a_stalled_one_are_answered_within_the_bound(
    short_store_wait: None, sqlite_url: str
):
    """SQLite's turns are first come, first served: behind one transaction stalled (here, waiting
    on an event; in production, on a lock another process holds), the others are refused when
    their wait passes the bound rather than each waiting for every one before it."""
    database = Database.connect(sqlite_url)
    await database.migrate()
    stalled = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with database.transaction():
            stalled.set()
            await release.wait()

    async def queued() -> GantryError:
        with pytest.raises(GantryError) as refused:
            async with database.transaction():
                pass
        return refused.value

    try:
        holding = asyncio.create_task(holder())
        await stalled.wait()
        refusals = await asyncio.gather(*(queued() for _ in range(5)))
        release.set()
        await holding
        assert {(r.reason, r.metadata["store_code"]) for r in refusals} == {
            ("STORE_UNAVAILABLE", "TURN_TIMEOUT")
        }
        async with database.transaction():
            pass  # the turn is free again
    finally:
        await database.close()


# PostgreSQL: the test's own database, made read-only or locked by a second session.


@pytest.fixture
async def postgres_gantry(
    short_store_wait: None, postgres_url: str, tmp_path: Path
) -> AsyncIterator[Harness]:
    async with running_gantry(postgres_url, tmp_path, http_listen="127.0.0.1:0") as harness:
        yield harness


async def _admin(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))


async def _set_read_only(admin: asyncpg.Connection, read_only: bool) -> None:
    """What a failover to a standby looks like to the control plane: every new session is
    read-only, and the sessions it held are gone (its pool reconnects)."""
    name = await admin.fetchval("SELECT current_database()")
    setting = "on" if read_only else "off"
    await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {setting}')
    await admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )


@pytest.mark.postgres
async def test_a_write_to_a_read_only_postgres_is_refused_typed(
    postgres_gantry: Harness, postgres_url: str
):
    admin = await _admin(postgres_url)
    try:
        await _set_read_only(admin, True)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _register(postgres_gantry, "read-only")
        metadata = _assert_store_unavailable(refused.value)
        assert (metadata["store"], metadata["store_code"]) == ("postgresql", "25006")
        assert "read-only" not in await _node_names(postgres_gantry)  # reads still answer
        await _set_read_only(admin, False)
    finally:
        await admin.close()
    await _register(postgres_gantry, "read-only")
    assert "read-only" in await _node_names(postgres_gantry)


@pytest.mark.postgres
async def test_a_write_behind_a_postgres_lock_is_refused_at_the_bound(
    postgres_gantry: Harness, postgres_url: str
):
    admin = await _admin(postgres_url)
    try:
        async with admin.transaction():
            await admin.execute("LOCK TABLE nodes IN EXCLUSIVE MODE")  # reads pass, writes wait
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _register(postgres_gantry, "behind-a-lock")
        metadata = _assert_store_unavailable(refused.value)
        assert (metadata["store"], metadata["store_code"]) == ("postgresql", "55P03")
    finally:
        await admin.close()
    assert "behind-a-lock" not in await _node_names(postgres_gantry)
    await _register(postgres_gantry, "behind-a-lock")


@pytest.mark.postgres
async def test_the_http_door_answers_a_read_the_store_cannot_serve_503_store_unavailable(
    postgres_gantry: Harness, postgres_url: str
):
    """A lock that stops reads too (ACCESS EXCLUSIVE, as a migration's ALTER TABLE takes): the
    model list's read waits for it at most the bound, then the client gets 503
    STORE_UNAVAILABLE with no traceback, and the next read answers once the lock is gone."""
    api = postgres_gantry.control_plane.http_api
    assert api is not None
    admin = await _admin(postgres_url)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{api.port}/v1",
        headers={"Authorization": f"Bearer {postgres_gantry.api_key}"},
        timeout=CLIENT_DEADLINE_S,
    ) as http:
        # The key is checked first (and cached), so the lock meets the model list's own read.
        assert (await http.get("/models")).status_code == 200
        try:
            async with admin.transaction():
                await admin.execute("LOCK TABLE capability_bindings IN ACCESS EXCLUSIVE MODE")
                response = await http.get("/models")
        finally:
            await admin.close()
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "STORE_UNAVAILABLE"
        assert "Traceback" not in error["message"]
        assert (await http.get("/models")).status_code == 200


@pytest.mark.postgres
async def test_a_replica_stopped_inside_a_transaction_holds_its_locks_only_for_the_bound(
    postgres_gantry: Harness, postgres_url: str, monkeypatch: pytest.MonkeyPatch
):
    """Another replica's control plane (its own Database) takes a lock in a transaction and then
    sends nothing, as one SIGSTOPped between two statements does: PostgreSQL ends its session
    after IDLE_IN_TRANSACTION_S, so the writes it blocked go through, and the stalled replica,
    once it runs again, finds its transaction gone (typed, nothing of it committed)."""
    monkeypatch.setattr(database_module, "IDLE_IN_TRANSACTION_S", 1.0)
    stalled_replica = Database.connect(postgres_url)
    holding, resume = asyncio.Event(), asyncio.Event()

    async def stopped_inside_a_transaction() -> None:
        async with stalled_replica.transaction() as session:
            await session.execute(text("LOCK TABLE nodes IN EXCLUSIVE MODE"))
            holding.set()
            await resume.wait()  # no statement while "stopped"
            await session.execute(text("SELECT 1"))

    stalled = asyncio.create_task(stopped_inside_a_transaction())
    try:
        await holding.wait()

        async def written() -> bool:
            try:
                await _register(postgres_gantry, "after-a-stall")
            except grpc.aio.AioRpcError as refused:
                _assert_store_unavailable(refused)  # behind the lock, at lock_timeout
                return False
            return True

        # Refused at the store's wait (0.5 s) while the lock is held, then written once the
        # server has ended the idle session (1 s): far sooner than the wait below.
        await wait_until(written, 30, "a node registered once the stalled lock is ended")
        resume.set()
        with pytest.raises(GantryError) as ended:
            await stalled
        assert ended.value.reason == "STORE_UNAVAILABLE", ended.value
    finally:
        resume.set()
        with contextlib.suppress(GantryError):
            await stalled
        await stalled_replica.close()
    assert "after-a-stall" in await _node_names(postgres_gantry)
