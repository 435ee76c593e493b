"""The database seam: engine, sessions and migrations for SQLite (default) or PostgreSQL.

Only `gantry migrate` creates or upgrades the schema (`migrate_database`: the Alembic head, then
the installation record). A starting control plane only checks (`require_initialised`) and
refuses a missing SQLite file, an empty database or an old schema rather than repairing it.

A transaction the database cannot take (locked past the wait below, read-only, unreachable, out of
disk) is answered STORE_UNAVAILABLE here, the one place a driver's failure becomes a reason
(`store_outage` decides which ones): typed and retryable, never INTERNAL with a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import os
import socket
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session

from gantry.common.errors import GantryError, excerpt
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import events, installation
from gantry.controlplane.platform.events import EventBus
from gantry.controlplane.platform.models import Installation

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
log = logging.getLogger(__name__)

# How long one transaction waits for the database before it is answered STORE_UNAVAILABLE: for
# its turn as SQLite's one writer (SqliteTurns), for SQLite's write lock (busy_timeout), for a
# PostgreSQL lock (lock_timeout), a pooled connection or a new one. Well under a client's usual
# deadline: a locked or stalled database is answered, typed and retryable, not at the deadline.
# Read when a Database connects (tests lower it to keep a lock wait short).
STORE_WAIT_S = 5.0
# The execution option that marks a connection's transaction as one that only reads
# (`Database.read`): on SQLite its BEGIN is deferred and takes no write turn.
READ_ONLY = "gantry_read_only"
# How long PostgreSQL keeps a session idle inside a transaction before it ends it, rolling the
# transaction back (idle_in_transaction_session_timeout). A replica stopped (SIGSTOP), hung or cut
# off between two statements of a transaction would otherwise hold its row locks for ever: a
# fresh clone's chaos test saw the new leader's every reconciler pass refused at lock_timeout for
# 60 s behind the stopped leader's open transaction, its placement never made. Far above any
# pause between two statements of one transaction here, which awaits only the database. Read
# when a Database connects (tests lower it).
IDLE_IN_TRANSACTION_S = 15.0
# SQLite's primary result codes that mean the store cannot take work now, not a bug:
# BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL (sqlite.org/rescode.html).
_SQLITE_OUTAGE_CODES = frozenset({5, 6, 8, 10, 13, 14, 15})
# PostgreSQL SQLSTATEs (and classes) that mean the same: connection exceptions (08), no
# resources (53: disk full, out of memory, too many connections), operator intervention
# (57P01-57P04: shut down, cannot connect now), system errors (58: I/O), a read-only
# transaction (25006: a standby, or default_transaction_read_only) and lock_timeout (55P03).
_POSTGRES_OUTAGE_CLASSES = ("08", "53", "58")
_POSTGRES_OUTAGE_STATES = frozenset({"25006", "55P03", "57P01", "57P02", "57P03", "57P04"})


class DatabaseNotInitialised(Exception):
    """The control plane's database is missing, empty, or not at this Gantry's schema.

    The message is one line for the operator and says what to run.
    """


def store_outage(error: BaseException) -> tuple[str, str] | None:
    """(code, cause) when `error` means the database cannot take work now: locked past the
    wait, read-only, unreachable or out of resources. None for any other failure (a bug, a
    constraint), which stays what it is. Pure: reads the exception only."""
    if isinstance(error, sa_exc.TimeoutError):  # the pool had no connection free in time
        return "POOL_TIMEOUT", "no database connection came free in time"
    if isinstance(error, ConnectionError | socket.gaierror):  # a connect refused or reset
        return "UNREACHABLE", f"the database is unreachable ({type(error).__name__})"
    if not isinstance(error, sa_exc.DBAPIError):
        return None
    original = error.orig
    cause = (str(original).strip().splitlines() or [type(original).__name__])[0]
    if isinstance(original, sqlite3.Error):
        code = getattr(original, "sqlite_errorcode", 0) & 0xFF
        if code in _SQLITE_OUTAGE_CODES:
            return getattr(original, "sqlite_errorname", str(code)), cause
    state = str(getattr(original, "sqlstate", None) or "")
    if state in _POSTGRES_OUTAGE_STATES or state[:2] in _POSTGRES_OUTAGE_CLASSES:
        return state, cause
    if error.connection_invalidated or isinstance(error, sa_exc.InterfaceError):
        return state or "DISCONNECTED", cause
    return None


def _lost_a_race(error: BaseException) -> bool:
    """A deadlock (40P01) or serialization failure (40001) the database broke by aborting us."""
    if not isinstance(error, sa_exc.DBAPIError):
        return False
    return str(getattr(error.orig, "sqlstate", None) or "") in ("40P01", "40001")


def _store_unavailable(code: str, cause: str, backend: str) -> GantryError:
    return GantryError(
        "STORE_UNAVAILABLE",
        f"the database cannot take this call now ({excerpt(cause)}); try again",
        store=backend,
        store_code=code,
    )


def _sqlite_pragmas(busy_timeout_ms: int, dbapi_connection: object, _record: object) -> None:
    # The driver's own implicit BEGIN is off: `_sqlite_begin` emits each BEGIN.
    dbapi_connection.isolation_level = None  # type: ignore[attr-defined]
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    # WAL lets readers run beside the one writer; foreign keys are off by default in SQLite.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    # A lock held elsewhere (another process) is waited for this long, then "database is
    # locked", answered STORE_UNAVAILABLE.
    cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    cursor.close()


def _sqlite_begin(connection: Connection) -> None:
    if connection.get_execution_options().get(READ_ONLY):
        # A transaction that only reads (`Database.read`) takes no lock at BEGIN: in WAL mode it
        # reads the last commit beside the one writer, and never upgrades.
        connection.exec_driver_sql("BEGIN")
        return
    # A deferred transaction that reads and then writes must upgrade its lock, and in WAL mode an
    # upgrade that meets another writer fails at once with "database is locked" (busy_timeout
    # does not apply to it): a burst of worker Hellos hit this (issue 9, 7 of 1,000). Taking the
    # write lock at BEGIN makes a second writer wait its turn under busy_timeout instead. A
    # `transaction` that only reads takes it too and so waits for a writer's commit: the reads on
    # a client's path use `Database.read` instead.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _postgres_waits(wait_s: float, idle_s: float) -> dict[str, object]:
    """asyncpg's connect arguments: a connect and every lock wait bounded by `wait_s`, a session
    idle inside a transaction ended after `idle_s`."""
    return {
        "timeout": wait_s,
        "server_settings": {
            "lock_timeout": str(int(wait_s * 1000)),
            "idle_in_transaction_session_timeout": str(int(idle_s * 1000)),
        },
    }


def sqlite_file(url: str | URL) -> Path | None:
    """The file behind a SQLite URL; None for other databases and in-memory SQLite."""
    url = make_url(url)
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def shown_url(url: str | URL) -> str:
    return make_url(url).render_as_string(hide_password=True)


def migrate_hint(url: str | URL) -> str:
    return f"run `gantry migrate --database-url {shown_url(url)}`"


class SqliteTurns:
    """SQLite has one writer at a time: this process's transactions take turns here, first come
    first served. Left to SQLite's busy handler, which sleeps and retries, a burst of writers (1,000
    worker Hellos) starved some of them past busy_timeout and they failed "database is locked".

    A turn is waited for at most `wait_s`: behind a holder stalled on a lock held by another
    process, each waiter would otherwise wait for every holder before it in turn."""

    def __init__(self, wait_s: float = STORE_WAIT_S) -> None:
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[object] | None = None
        self._wait_s = wait_s

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        task = asyncio.current_task()
        if task is not None and task is self._holder:
            # Waiting here would wait for ourselves forever: say so instead of hanging.
            raise RuntimeError("a SQLite transaction was opened inside another in the same task")
        try:
            async with asyncio.timeout(self._wait_s):
                await self._lock.acquire()
        except TimeoutError:
            raise _store_unavailable(
                "TURN_TIMEOUT",
                f"no write turn came within {self._wait_s:g}s: another transaction holds it",
                "sqlite",
            ) from None
        try:
            self._holder = task
            yield
        finally:
            self._holder = None
            self._lock.release()


class _ReadOnlySession(Session):
    """`Database.read`'s session: a change is refused when it would be written (a flush, the
    autoflush before a query, the commit that ends the read), never silently kept or dropped."""

    def flush(self, objects: Sequence[Any] | None = None) -> None:
        if self.new or self.dirty or self.deleted:
            raise RuntimeError("a read-only unit of work (Database.read) changed rows")
        super().flush(objects)


@dataclass(slots=True)
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    # Who hears of what each transaction recorded (platform/events.py), once it has committed.
    events: EventBus = field(default_factory=EventBus)
    sqlite_turns: SqliteTurns | None = None
    # The sessions of `read`: a flush with anything to write is refused.
    readers: async_sessionmaker[AsyncSession] = field(init=False)

    def __post_init__(self) -> None:
        self.readers = async_sessionmaker(
            self.engine, expire_on_commit=False, sync_session_class=_ReadOnlySession
        )

    @classmethod
    def connect(cls, url: str) -> Database:
        """An engine for url; nothing is opened (or, for SQLite, created) until first use. Every
        wait for the database is bounded by STORE_WAIT_S, and on PostgreSQL every transaction's
        pause between statements by IDLE_IN_TRANSACTION_S (see there)."""
        wait_s = STORE_WAIT_S
        if make_url(url).get_backend_name() == "postgresql":
            engine = create_async_engine(
                url,
                pool_pre_ping=True,
                pool_timeout=wait_s,
                connect_args=_postgres_waits(wait_s, IDLE_IN_TRANSACTION_S),
            )
        else:
            # No pre-ping: a SQLite connection is a file this process holds open, not a socket a
            # server may have closed, and the ping cost every transaction a round trip through
            # aiosqlite's thread (of about 30 in a two-row read).
            engine = create_async_engine(url)
        turns = None
        if engine.dialect.name == "sqlite":
            pragmas = functools.partial(_sqlite_pragmas, int(wait_s * 1000))
            event.listen(engine.sync_engine, "connect", pragmas)
            event.listen(engine.sync_engine, "begin", _sqlite_begin)
            turns = SqliteTurns(wait_s)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        return cls(engine=engine, sessions=sessions, sqlite_turns=turns)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """One unit of work: repository functions flush, this commits (or rolls back on error),
        then publishes the events recorded on the session (`events.record`) to `self.events`.

        A failure that means the database cannot take work now is raised STORE_UNAVAILABLE
        (`store_outage`), logged as one line; nothing of the transaction was committed."""
        try:
            if self.sqlite_turns is None:
                async with self._transaction() as session:
                    yield session
            else:
                async with self.sqlite_turns.turn(), self._transaction() as session:
                    yield session
        except Exception as error:
            refusal = self._refusal(error)
            if refusal is None:
                raise
            raise refusal from None

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncSession]:
        """A unit of work that only reads: what the last commit left, never a commit of its own,
        no events. For the reads on a client's path (a route, a key, a model's metadata): on
        SQLite it takes no write turn and no write lock (a deferred BEGIN; WAL lets it read beside
        the one writer), so a burst of writes (1,000 worker Hellos) does not hold it up, and a
        client that polls does not take turns from the writers. A change made in it is refused
        (RuntimeError), never silently dropped. Failures are mapped as `transaction` maps them."""
        try:
            async with self.readers() as session, session.begin():
                # Before the first statement, so the BEGIN it sends is the deferred one.
                await session.connection(execution_options={READ_ONLY: True})
                yield session
                # The commit that ends it flushes (a change is refused there) and writes
                # nothing; unlike a rollback, it keeps the rows read loaded.
        except Exception as error:
            refusal = self._refusal(error)
            if refusal is None:
                raise
            raise refusal from None

    def _refusal(self, error: Exception) -> GantryError | None:
        """The typed refusal a failed unit of work is raised as, None to raise it as it is."""
        if _lost_a_race(error):
            # PostgreSQL chose this transaction to break a deadlock or a serialization
            # conflict: nothing of it was kept, and a rerun on fresh rows is what
            # `retry_on_conflict` does for a compare-and-set another writer won.
            return GantryError(
                "INVALID_STATE_TRANSITION",
                "another writer changed these rows at the same time; try again",
                conflict="true",
            )
        outage = store_outage(error)
        if outage is None:
            return None
        refusal = _store_unavailable(*outage, self.engine.dialect.name)
        log.warning("%s: %s", refusal.reason, refusal.message)
        return refusal

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncSession]:
        async with self.sessions() as session:
            settling: list[Callable[[], None]] = []
            try:
                async with session.begin():
                    yield session
                    # Last, so the ids are drawn in commit order (observability/audit.py).
                    if await audit.write_pending(session):
                        events.record(session, events.AuditWritten())
                    # From before the commit until after it (a binding moving: no cached route
                    # is served, so a request resolved once the commit is visible reads it).
                    settling = self.events.before_commit(events.recorded(session))
            finally:
                events.settle(settling)
            # Only a commit gets here: a rollback raised above and publishes nothing.
            self.events.publish(events.recorded(session))

    async def migrate(self) -> str:
        """Create or upgrade the schema to the newest Alembic revision; returns that revision."""
        async with self.engine.begin() as connection:
            await connection.run_sync(_upgrade)
        return head_revision()

    async def schema_revisions(self) -> tuple[str, ...]:
        """The revisions the database is stamped with; empty when it holds no Gantry schema."""
        async with self.engine.connect() as connection:
            return await connection.run_sync(_current_heads)

    async def require_initialised(self) -> None:
        """Refuse (DatabaseNotInitialised) unless `gantry migrate` brought this database to the
        head revision and wrote its installation record. Closes the engine when it refuses."""
        try:
            await self._check_initialised()
        except BaseException:
            await self.close()
            raise

    async def _check_initialised(self) -> None:
        url = self.engine.url
        where = shown_url(url)
        path = sqlite_file(url)
        # Checked before the first connection: SQLite would silently create an empty file.
        if path is not None and not path.is_file():
            raise DatabaseNotInitialised(
                f"the database file {path} does not exist; {migrate_hint(url)} to create it"
            )
        found = await self.schema_revisions()
        head = head_revision()
        if not found:
            raise DatabaseNotInitialised(
                f"the database {where} holds no Gantry schema; {migrate_hint(url)} to initialise it"
            )
        if found != (head,):
            if all(is_known_revision(revision) for revision in found):
                raise DatabaseNotInitialised(
                    f"the database {where} is at schema revision {', '.join(found)}, this Gantry"
                    f" needs {head}; {migrate_hint(url)} to upgrade it"
                )
            raise DatabaseNotInitialised(
                f"the database {where} is at schema revision {', '.join(found)}, which this"
                f" Gantry (schema {head}) does not know; run the Gantry version that migrated it"
            )
        async with self.transaction() as session:
            record = await installation.get_installation(session)
        if record is None:
            raise DatabaseNotInitialised(
                f"the database {where} has no installation record; {migrate_hint(url)} to write it"
            )

    async def close(self) -> None:
        await self.engine.dispose()


async def migrate_database(url: str, *, now: dt.datetime | None = None) -> Installation:
    """What `gantry migrate` does: the schema to the Alembic head, then the installation record
    (created once; later migrations update its revision and version)."""
    path = sqlite_file(url)
    if path is not None:
        _create_private_file(path)
    database = Database.connect(url)
    try:
        async with _migration_lock(database):
            revision = await database.migrate()
            async with database.transaction() as session:
                return await installation.record_installation(
                    session,
                    schema_revision=revision,
                    version=installation.gantry_version(),
                    now=now or dt.datetime.now(dt.UTC),
                )
    finally:
        await database.close()


# A PostgreSQL advisory lock's key (64 bits) that no other user of the database takes; the
# leader's lock is 0x67616E7472790001 (platform/leadership.py).
MIGRATION_LOCK_KEY = 0x67616E7472790002


@contextlib.asynccontextmanager
async def _migration_lock(database: Database) -> AsyncIterator[None]:
    """One `gantry migrate` at a time on a PostgreSQL database: replicas starting together (three
    pods' init containers on a first install) would otherwise each create the same tables, and
    all but one fail on PostgreSQL's catalog. The others wait, then find the schema current. Held
    on a connection of its own for the whole migration; SQLite is one file on one machine, its
    own write lock serialises it."""
    if database.engine.dialect.name != "postgresql":
        yield
        return
    async with database.engine.connect() as connection:
        await connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        await connection.commit()  # the lock is the session's: no transaction held open
        try:
            yield
        finally:
            await connection.execute(
                text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
            await connection.commit()


def _create_private_file(path: Path) -> None:
    """Create the SQLite file 0600 before SQLite does (it would follow the umask and symlinks).

    O_EXCL|O_NOFOLLOW: a symlink planted at the database path is refused, never written through.
    An existing regular file is left as it is (a migration of an existing database).
    """
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileNotFoundError:
        return  # no such directory: connecting reports it, with the URL
    except FileExistsError:
        if path.is_symlink():
            raise DatabaseNotInitialised(
                f"the database path {path} is a symlink; refusing it"
            ) from None
        return
    os.close(descriptor)
    os.chmod(path, 0o600)  # the mode given to open is filtered by the umask


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision of the migrations shipped with this Gantry (exactly one head)."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads ({heads}), not one")
    return heads[0]


def is_known_revision(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:
        return False


def _upgrade(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "head")


def _current_heads(connection: Connection) -> tuple[str, ...]:
    return tuple(MigrationContext.configure(connection).get_current_heads())
