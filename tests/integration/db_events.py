"""Counting what a block of code asks of the database, through SQLAlchemy's engine events: a
test of how many transactions or statements a piece of work costs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event

from gantry.controlplane.platform.database import Database

BEGIN = "begin"  # a transaction begun
STATEMENT = "before_cursor_execute"  # a statement sent


@contextmanager
def counted(database: Database, what: str) -> Iterator[list[int]]:
    """How many `what` events `database`'s engine saw inside the block (a list holding the
    count, read after the block)."""
    seen = [0]

    def on_event(*_args: object) -> None:
        seen[0] += 1

    event.listen(database.engine.sync_engine, what, on_event)
    try:
        yield seen
    finally:
        event.remove(database.engine.sync_engine, what, on_event)


@contextmanager
def queries(database: Database) -> Iterator[list[str]]:
    """The statements `database`'s engine sent inside the block, but the BEGIN a store sends
    for a transaction (SQLite's BEGIN IMMEDIATE; PostgreSQL's driver sends none through here)."""
    sent: list[str] = []

    def on_statement(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if not statement.lstrip().upper().startswith("BEGIN"):
            sent.append(statement)

    event.listen(database.engine.sync_engine, STATEMENT, on_statement)
    try:
        yield sent
    finally:
        event.remove(database.engine.sync_engine, STATEMENT, on_statement)
