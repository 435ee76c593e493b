"""One decider among control-plane replicas: a leader elected through a PostgreSQL advisory lock,
with a fencing epoch checked by every write it decides.

Several replicas may serve one PostgreSQL database; only the leader decides (placement, the
reconciler's time-driven writes). The lock is session-level, held on ONE connection of its own
(not the pool's): it is held exactly as long as that session lives. The session is opened with
`idle_session_timeout` set to the lease, so a leader that stops talking (SIGSTOP: its kernel
still ACKs, the TCP connection stays up) is ended by PostgreSQL itself after the lease and its
lock freed; a live leader pings every lease/3. A follower tries to take the lock every lease/3.

Taking the lock is not enough: a paused ex-leader may resume believing it leads. So the replica
that takes it bumps the one row of `control_plane_leadership` (its `epoch`) before deciding, and
each transaction a decider opens (`fenced()`) first reads that row FOR SHARE and rolls back with
NOT_LEADER when the epoch is not its own. The share lock also makes a new leader's bump wait for
the old one's writes already in flight, so no write of an old epoch lands after a new one.

On SQLite (`gantry up`) there is one replica: it always leads, at epoch 1, and nothing is
locked or fenced (`Leadership.single`).

The pure part (`Standing`, `observe`, `fence_refusal`) decides; `Leadership` applies it around
the IO of a `LeaderLock` (`PostgresLeaderLock` here, a scripted one in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Select, event, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import NullPool

from gantry.common.errors import GantryError
from gantry.common.tasks import stop_task
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import STORE_WAIT_S, Database
from gantry.controlplane.platform.models import ControlPlaneLeadership

log = logging.getLogger(__name__)

DEFAULT_LEADER_LEASE_SECONDS = 5.0
# The advisory lock's key (64 bits): any fixed number no other user of the database takes.
# Advisory locks are per database, so two installations on one server do not meet.
LEADER_LOCK_KEY = 0x67616E7472790001  # "gantry", lock 1
# PostgreSQL's lock_not_available: a lock_timeout ran out.
LOCK_NOT_AVAILABLE = "55P03"
ROW_ID = 1  # the one row of control_plane_leadership (made by migration 0010)

# The leadership whose fence each transaction begun in this context checks (`fenced`).
_fencing: contextvars.ContextVar[Leadership | None] = contextvars.ContextVar(
    "gantry_leadership_fencing", default=None
)


# ---- pure -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Standing:
    """Whether this replica leads, and the epoch it holds (or last held; 0: never held one)."""

    leading: bool = False
    epoch: int = 0


def observe(standing: Standing, held_epoch: int | None) -> tuple[Standing, str | None]:
    """The standing after one look at the lock (`held_epoch`: the epoch the lock is held at, None
    when this replica does not hold it), and the line to log when that changed it."""
    if held_epoch is None:
        if standing.leading:
            return Standing(leading=False, epoch=standing.epoch), (
                f"lost leadership (epoch {standing.epoch}): another control-plane replica may "
                "now decide; this one stops deciding"
            )
        return standing, None
    if standing.leading and standing.epoch == held_epoch:
        return standing, None
    return Standing(leading=True, epoch=held_epoch), f"leading (epoch {held_epoch})"


def fence_refusal(standing: Standing, stored_epoch: int | None) -> GantryError | None:
    """None when a decider's write may commit: this replica leads and the stored epoch is its
    own. Else NOT_LEADER, naming both epochs."""
    if standing.leading and stored_epoch == standing.epoch:
        return None
    return GantryError(
        "NOT_LEADER",
        f"this control-plane replica does not hold the leader's epoch (it holds "
        f"{standing.epoch if standing.leading else 'none'}, the database says {stored_epoch}); "
        "its decision was not written",
        held_epoch=str(standing.epoch if standing.leading else 0),
        current_epoch=str(stored_epoch),
    )


def ping_interval(lease_s: float) -> float:
    """How often the leader pings and a follower tries the lock: three tries within a lease."""
    return lease_s / 3


# ---- the lock's IO ----------------------------------------------------------------------------


class LeaderLock(Protocol):
    async def hold(self) -> int | None:
        """Ping the lock when held, else try to take it (and bump the epoch): the epoch it is
        held at, or None when this replica does not hold it (taken elsewhere, session lost)."""
        ...

    async def release(self) -> None: ...


_BUMP = text(
    "UPDATE control_plane_leadership SET epoch = epoch + 1, holder = :holder, "
    "acquired_at = now() WHERE id = :id RETURNING epoch"
)
# The sessions whose fenced transactions still hold the leadership row (FOR SHARE takes a
# RowShareLock on its table until the transaction ends), this one excepted.
_END_STALE_FENCES = text(
    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'relation'"
    " AND relation = 'control_plane_leadership'::regclass AND mode = 'RowShareLock'"
    " AND granted AND pid <> pg_backend_pid()"
)


class PostgresLeaderLock:
    """The advisory lock on a connection of its own, whose session PostgreSQL ends after
    `lease_s` without a statement (idle_session_timeout, PostgreSQL 14 and later)."""

    def __init__(self, url: str, *, lease_s: float, holder: str) -> None:
        self._lease_s = lease_s
        self._holder = holder
        lease_ms = str(max(1, int(lease_s * 1000)))
        self._engine: AsyncEngine = create_async_engine(
            url,
            poolclass=NullPool,
            connect_args={
                "timeout": STORE_WAIT_S,
                "server_settings": {
                    "idle_session_timeout": lease_ms,
                    # The epoch bump waits for fenced writes in flight a third of the lease,
                    # then ends them (`_bump`), so the whole look fits in the lease.
                    "lock_timeout": str(max(1, int(lease_s * 1000 / 3))),
                    "application_name": "gantry-controlplane-leader",
                },
            },
        )
        self._connection: AsyncConnection | None = None
        self._epoch: int | None = None

    async def hold(self) -> int | None:
        try:
            async with asyncio.timeout(self._lease_s):
                return await self._hold()
        except Exception as error:  # any failure: the session cannot be trusted to hold it
            first_line = (str(error).strip().splitlines() or [""])[0]
            log.warning("leader lock not held: %s: %s", type(error).__name__, first_line)
            await self._drop()
            return None

    async def _hold(self) -> int | None:
        if self._connection is None:
            connection = await self._engine.connect()
            self._connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        if self._epoch is not None:
            await self._connection.execute(text("SELECT 1"))  # the ping: not idle
            return self._epoch
        taken = await self._connection.scalar(
            text("SELECT pg_try_advisory_lock(:key)"), {"key": LEADER_LOCK_KEY}
        )
        if not taken:
            return None
        try:
            self._epoch = await self._bump(self._connection)
        finally:
            if self._epoch is None:  # not bumped: not leading, so give the lock back
                await self._connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": LEADER_LOCK_KEY}
                )
        return self._epoch

    async def _bump(self, connection: AsyncConnection) -> int | None:
        """The next epoch. It waits (lock_timeout) for the old leader's fenced transactions in
        flight to finish; one still open after that belongs to a leader that is stopped (SIGSTOP)
        or hung, whose lock PostgreSQL has already ended: its write could never commit under its
        stale epoch, and left open it would hold the row, and so the next leader, for ever. It is
        ended (rolled back), and the bump taken again."""
        bump = {"holder": self._holder, "id": ROW_ID}
        try:
            return await connection.scalar(_BUMP, bump)  # type: ignore[no-any-return]
        except DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
        ended = (await connection.execute(_END_STALE_FENCES)).all()
        log.warning("ended %d stale fenced transaction(s) of the old leader", len(ended))
        return await connection.scalar(_BUMP, bump)  # type: ignore[no-any-return]

    async def _drop(self) -> None:
        connection, self._connection, self._epoch = self._connection, None, None
        if connection is not None:
            # Its session is gone or not to be trusted; closing it ends the session (and the
            # lock) if the server still has it.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._lease_s):
                    await connection.close()

    async def release(self) -> None:
        await self._drop()
        await self._engine.dispose()


# ---- the leadership a control plane holds ----------------------------------------------------


class Leadership:
    """Whether this replica decides, kept current by a loop every lease/3 (`run`)."""

    def __init__(self, lock: LeaderLock | None, *, lease_s: float = DEFAULT_LEADER_LEASE_SECONDS):
        self._lock = lock
        self.lease_s = lease_s
        self._standing = Standing(leading=True, epoch=1) if lock is None else Standing()
        self._task: asyncio.Task[None] | None = None
        self.steps = 0  # looks at the lock so far (tests wait on it)

    @classmethod
    def single(cls) -> Leadership:
        """SQLite: the only replica, always the leader at epoch 1; nothing locked or fenced."""
        return cls(None)

    @classmethod
    def for_database(cls, database: Database, *, url: str, lease_s: float) -> Leadership:
        """PostgreSQL: elected through the advisory lock, fencing `database`'s decider
        transactions; any other database: `single`."""
        if make_url(url).get_backend_name() != "postgresql":
            return cls.single()
        lock = PostgresLeaderLock(url, lease_s=lease_s, holder=replica_name())
        leadership = cls(lock, lease_s=lease_s)
        leadership.attach(database)
        return leadership

    @property
    def is_leader(self) -> bool:
        return self._standing.leading

    @property
    def epoch(self) -> int:
        """The epoch held (or last held; 0 before the first)."""
        return self._standing.epoch

    @property
    def standing(self) -> Standing:
        return self._standing

    async def step(self) -> None:
        """One look at the lock: ping it or try to take it, then the standing that follows."""
        if self._lock is None:
            return
        held = await self._lock.hold()
        self._standing, line = observe(self._standing, held)
        self.steps += 1
        if line is not None:
            (log.info if self._standing.leading else log.warning)("%s", line)
        metrics.leadership(self._standing.leading, self._standing.epoch)

    async def start(self) -> None:
        """Try once now (a lone replica leads before its first decision), then keep looking."""
        metrics.leadership(self._standing.leading, self._standing.epoch)
        if self._lock is None:
            return
        await self.step()
        self._task = asyncio.create_task(self.run(), name="leadership")

    async def run(self) -> None:
        while True:
            await asyncio.sleep(ping_interval(self.lease_s))
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # the next look starts afresh
                log.exception("leadership step failed")

    async def stop(self) -> None:
        """Stop looking and give the lock back (its session ends): a follower leads next."""
        await stop_task(self._task)
        self._task = None
        if self._lock is not None:
            await self._lock.release()
            self._standing, _ = observe(self._standing, None)
            metrics.leadership(False, self._standing.epoch)

    # ---- fencing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """Every transaction begun on the attached database inside this block (in this task and
        the tasks it starts) checks the epoch first (`_fence_on_begin`)."""
        token = _fencing.set(self)
        try:
            yield
        finally:
            _fencing.reset(token)

    def attach(self, database: Database) -> None:
        """Fence the decider transactions of `database` (PostgreSQL: its engine's BEGIN)."""
        event.listen(database.engine.sync_engine, "begin", self._fence_on_begin)

    def _fence_on_begin(self, connection: Connection) -> None:
        # Runs as the transaction begins, before its first statement, on its own connection: the
        # share lock taken here is held to its commit.
        if _fencing.get() is not self:
            return
        stored = connection.execute(_fence_query()).scalar()
        refusal = fence_refusal(self._standing, stored)
        if refusal is not None:
            raise refusal

    async def fence(self, session: AsyncSession) -> None:
        """Check the epoch inside `session`'s transaction (its share lock held to the commit)."""
        if self._lock is None:
            return
        refusal = fence_refusal(self._standing, await session.scalar(_fence_query()))
        if refusal is not None:
            raise refusal


def _fence_query() -> Select[int]:
    return (
        select(ControlPlaneLeadership.epoch)
        .where(ControlPlaneLeadership.id == ROW_ID)
        .with_for_update(read=True)
    )


def replica_name() -> str:
    """Who holds the lock, as the row's `holder` says: host, pid and a per-process id."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
