"""One decider among control-plane replicas, on a real PostgreSQL: two Leadership objects on one
database (each with its own Database, as two replicas have), the leader's session ended from an
admin connection or left idle past the lease, and the old leader's fenced writes refused.

The takeover bound is lease/3 (a follower's next try) once PostgreSQL has ended the leader's
session; these tests wait on the state with a deadline well past it, never on time alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import select

from gantry.common.errors import GantryError
from gantry.controlplane.platform.database import Database, migrate_database
from gantry.controlplane.platform.leadership import Leadership
from gantry.controlplane.platform.models import ControlPlaneLeadership, Tenant
from tests.integration.harness import wait_for

pytestmark = pytest.mark.postgres

LEASE_S = 1.0
# A leader the test stops itself (run=False) must not be ended by its own idle_session_timeout
# (the lease) before the test ends its session: on a loaded machine the steps between its last
# look and the admin's terminate can take a second. These tests look once more right before,
# and give that look a lease of a few seconds.
STOPPED_LEADER_LEASE_S = 3.0
WAITING_LEASE_S = 15.0


@contextlib.asynccontextmanager
async def replica(
    url: str, *, run: bool = True, lease_s: float = LEASE_S
) -> AsyncIterator[tuple[Leadership, Database]]:
    """A replica's database and leadership; `run`: its loop looks at the lock every lease/3,
    else the test takes each look (`step`) itself (a leader whose pings stopped)."""
    database = Database.connect(url)
    leadership = Leadership.for_database(database, url=url, lease_s=lease_s)
    try:
        if run:
            await leadership.start()
        else:
            await leadership.step()
        yield leadership, database
    finally:
        await leadership.stop()
        await database.close()


async def _admin(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=5)


async def _pinged_lock_holder(leader: Leadership, admin: asyncpg.Connection) -> int:
    """The leader's lock session, just after a look that reset its idle_session_timeout."""
    await leader.step()
    assert leader.is_leader
    holder = await _lock_holder(admin)
    assert holder is not None
    return holder


async def _lock_holder(admin: asyncpg.Connection) -> int | None:
    """The backend pid holding the leader's advisory lock in this database, if any."""
    return await admin.fetchval(  # type: ignore[no-any-return]
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )


async def _stored_epoch(database: Database) -> int | None:
    async with database.transaction() as session:
        return await session.scalar(select(ControlPlaneLeadership.epoch))


async def _fenced_write(leadership: Leadership, database: Database, tenant_id: str) -> None:
    """A decider's write: a row, in a transaction begun inside `fenced()`."""
    with leadership.fenced():
        async with database.transaction() as session:
            session.add(Tenant(tenant_id=tenant_id, created_at=_now()))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def _tenant_exists(database: Database, tenant_id: str) -> bool:
    async with database.transaction() as session:
        return await session.get(Tenant, tenant_id) is not None


@pytest.fixture
async def url(postgres_url: str) -> str:
    await migrate_database(postgres_url)
    return postgres_url


async def test_one_leads_and_a_terminated_leader_is_replaced_with_the_next_epoch(url: str):
    admin = await _admin(url)
    try:
        async with (
            replica(url, run=False, lease_s=STOPPED_LEADER_LEASE_S) as (first, first_db),
            replica(url, lease_s=STOPPED_LEADER_LEASE_S) as (second, _),
        ):
            assert (first.is_leader, first.epoch) == (True, 1)
            assert not second.is_leader
            await _fenced_write(first, first_db, "written-at-epoch-1")
            # The leader's session ends (a failover, a network cut): its lock goes with it.
            holder = await _pinged_lock_holder(first, admin)
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", holder)
            await wait_for(lambda: second.is_leader, timeout=10, what="the follower to lead")
            assert second.epoch == 2
            assert await _stored_epoch(first_db) == 2
            # The old leader has not looked yet: it still believes it leads. Its write is refused
            # by the database's epoch, and nothing of it is kept.
            assert first.is_leader
            with pytest.raises(GantryError) as refused:
                await _fenced_write(first, first_db, "written-by-an-ex-leader")
            assert refused.value.reason == "NOT_LEADER"
            assert refused.value.metadata == {"held_epoch": "1", "current_epoch": "2"}
            assert not await _tenant_exists(first_db, "written-by-an-ex-leader")
            assert await _tenant_exists(first_db, "written-at-epoch-1")
            # Its next look finds its session gone: it stops leading, and writes nothing more.
            await first.step()
            assert (first.is_leader, first.epoch) == (False, 1)
            await first.step()  # tries again: the lock is the new leader's
            assert not first.is_leader
    finally:
        await admin.close()


async def test_a_leader_whose_pings_stop_is_ended_by_idle_session_timeout(
    url: str, caplog: pytest.LogCaptureFixture
):
    # `first` looks once (takes the lock) and never again: a paused process. PostgreSQL's
    # idle_session_timeout (the lease) ends its session, which frees the lock.
    async with replica(url, run=False) as (first, first_db), replica(url) as (second, _):
        assert first.is_leader and not second.is_leader
        await wait_for(
            lambda: second.is_leader, timeout=10 * LEASE_S, what="the lock freed by the timeout"
        )
        assert second.epoch == first.epoch + 1
        with pytest.raises(GantryError) as refused:
            await _fenced_write(first, first_db, "late-write")
        assert refused.value.reason == "NOT_LEADER"
        with caplog.at_level(logging.WARNING, logger="gantry.controlplane.platform.leadership"):
            await first.step()  # it resumes: the ping finds its session ended
        assert not first.is_leader
        assert "lost leadership (epoch 1)" in caplog.text


async def test_a_new_leaders_epoch_waits_for_the_old_leaders_write_in_flight(url: str):
    admin = await _admin(url)
    try:
        # A lease long enough that the bump's wait (a third of it) outlasts this write.
        async with (
            replica(url, run=False, lease_s=WAITING_LEASE_S) as (first, first_db),
            replica(url, run=False, lease_s=WAITING_LEASE_S) as (second, _),
        ):
            assert first.is_leader and not second.is_leader
            with first.fenced():
                async with first_db.transaction() as session:
                    # The fence has run: this transaction holds the row FOR SHARE to its commit.
                    session.add(Tenant(tenant_id="in-flight", created_at=_now()))
                    await session.flush()
                    holder = await _pinged_lock_holder(first, admin)
                    await _end_lock_session(admin, holder)
                    # The follower takes the lock, and its epoch bump waits on the share lock.
                    taking = asyncio.create_task(second.step())
                    await wait_for(
                        lambda: _bump_waiting(admin),
                        timeout=10,
                        what="the epoch bump to wait on the write in flight",
                    )
                    assert not taking.done()
            await taking  # the old epoch's write committed first; only then the new epoch
            assert (second.is_leader, second.epoch) == (True, 2)
            assert await _tenant_exists(first_db, "in-flight")
    finally:
        await admin.close()


async def test_a_new_leader_ends_an_old_leaders_write_left_in_flight_and_it_never_lands(url: str):
    """A leader stopped (SIGSTOP) inside a fenced transaction: PostgreSQL ends its lock's session,
    but the transaction's session stays open holding the leadership row. The next leader's epoch
    bump waits a third of the lease for it, then ends it: the bump lands, the stale write never
    does (rolled back with its session), and the next leader is not held off for ever."""
    admin = await _admin(url)
    try:
        async with (
            replica(url, run=False, lease_s=STOPPED_LEADER_LEASE_S) as (first, first_db),
            replica(url, run=False, lease_s=STOPPED_LEADER_LEASE_S) as (second, _),
        ):
            assert first.is_leader and not second.is_leader
            taken: tuple[bool, int | None] | None = None
            with pytest.raises(GantryError) as ended:  # its session was ended under it
                with first.fenced():
                    async with first_db.transaction() as session:
                        # The fence has run: this transaction holds the row FOR SHARE.
                        session.add(Tenant(tenant_id="in-flight", created_at=_now()))
                        await session.flush()
                        holder = await _pinged_lock_holder(first, admin)
                        await _end_lock_session(admin, holder)
                        # This transaction stays open, as a stopped leader's does.
                        await second.step()
                        taken = (second.is_leader, second.epoch)
            assert ended.value.reason == "STORE_UNAVAILABLE"
            assert taken == (True, 2)
            in_flight = "SELECT count(*) FROM tenants WHERE tenant_id = 'in-flight'"
            assert await admin.fetchval(in_flight) == 0
    finally:
        await admin.close()


async def _end_lock_session(admin: asyncpg.Connection, holder: int) -> None:
    """End the leader's lock session and wait until PostgreSQL has let the lock go: the backend
    exits after the call returns, and a follower that looks before that finds the lock taken."""
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", holder)
    await wait_for(
        lambda: _lock_released(admin), timeout=10, what="the ended session's lock to be released"
    )


async def _lock_released(admin: asyncpg.Connection) -> bool:
    return await _lock_holder(admin) is None


async def _bump_waiting(admin: asyncpg.Connection) -> bool:
    return bool(
        await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'gantry-controlplane-leader' AND wait_event_type = 'Lock'"
        )
    )
