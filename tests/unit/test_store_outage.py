"""`store_outage`: which database failures mean "the store cannot take work now" (answered
STORE_UNAVAILABLE, retryable) and which stay what they are (a bug or a constraint: INTERNAL, or
the caller's own handling). Pure; the integration tests (test_store_unavailable.py) meet the same
failures on real SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import exc as sa_exc

from gantry.controlplane.platform.database import _lost_a_race, store_outage


class FakeDriverError(Exception):
    """A named fake of a PostgreSQL driver's error: asyncpg's, as SQLAlchemy adapts it, carries
    the server's SQLSTATE as `sqlstate`."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def _wrapped(original: Exception, kind: type[sa_exc.DBAPIError] = sa_exc.DBAPIError):
    return kind("INSERT INTO nodes ...", {}, original)


def _sqlite_error(sql: str) -> sqlite3.Error:
    """A real error of an in-memory SQLite database."""
    connection = sqlite3.connect(":memory:")
    try:
        connection.execute(sql)
    except sqlite3.Error as error:
        return error
    finally:
        connection.close()
    raise AssertionError(f"{sql!r} did not fail")


@pytest.mark.parametrize(
    ("sqlstate", "outage"),
    [
        ("25006", True),  # read_only_sql_transaction
        ("55P03", True),  # lock_not_available (lock_timeout)
        ("57P01", True),  # admin_shutdown
        ("08006", True),  # connection_failure
        ("53100", True),  # disk_full
        ("58030", True),  # io_error
        ("23505", False),  # unique_violation: a constraint, not an outage
        ("42P01", False),  # undefined_table: a bug
        ("40001", False),  # serialization_failure: retried by the caller, not an outage
    ],
)
def test_postgres_sqlstates(sqlstate: str, outage: bool) -> None:
    found = store_outage(_wrapped(FakeDriverError("server said so", sqlstate)))
    assert (found == (sqlstate, "server said so")) if outage else found is None


def test_a_sqlite_bug_is_not_an_outage() -> None:
    error = _sqlite_error("SELECT * FROM no_such_table")
    assert store_outage(_wrapped(error, sa_exc.OperationalError)) is None


def test_sqlite_busy_is_an_outage_named_by_its_code() -> None:
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = 5  # what SQLite sets on a refusal past busy_timeout
    error.sqlite_errorname = "SQLITE_BUSY"
    wrapped = _wrapped(error, sa_exc.OperationalError)
    assert store_outage(wrapped) == ("SQLITE_BUSY", "database is locked")


def test_connection_failures_and_pool_timeouts_are_outages() -> None:
    refused = store_outage(ConnectionRefusedError(111, "Connection refused"))
    assert refused is not None and refused[0] == "UNREACHABLE"
    assert store_outage(sa_exc.TimeoutError("QueuePool limit"))[0] == "POOL_TIMEOUT"  # type: ignore[index]
    lost = _wrapped(FakeDriverError("connection is closed", ""), sa_exc.InterfaceError)
    assert store_outage(lost) == ("DISCONNECTED", "connection is closed")


def test_other_failures_are_not_outages() -> None:
    assert store_outage(ValueError("a bug")) is None
    assert store_outage(_wrapped(sqlite3.IntegrityError("UNIQUE constraint failed"))) is None


@pytest.mark.parametrize(("sqlstate", "lost"), [("40P01", True), ("40001", True), ("23505", False)])
def test_a_deadlock_or_serialization_failure_is_a_race_lost_not_an_outage(
    sqlstate: str, lost: bool
) -> None:
    # PostgreSQL aborted this transaction to break a deadlock: retried on fresh rows, typed.
    error = _wrapped(FakeDriverError("deadlock detected", sqlstate))
    assert _lost_a_race(error) is lost
    assert store_outage(error) is None
