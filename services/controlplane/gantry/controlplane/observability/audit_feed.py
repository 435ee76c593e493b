"""Wakes audit watchers when events commit; bounds how many watch at once.

The database is the feed's only source of events: a watcher waits here for "something
committed", then reads the events after its cursor from the database. So a watcher never
polls, and what it streams is exactly what is stored, in commit order, across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from gantry.common.errors import GantryError

DEFAULT_MAX_WATCHERS = 64
# Events one watcher reads from the database at a time (then streams before reading more).
DEFAULT_BATCH_SIZE = 100


class AuditFeed:
    """Subscribed (app.py) to the commits that wrote audit events (AuditWritten), and to those
    that freed capacity (CapacityFreed: a residency gone COLD, which a reclaim waits for)."""

    def __init__(
        self, *, max_watchers: int = DEFAULT_MAX_WATCHERS, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> None:
        self.max_watchers = max_watchers
        self.batch_size = batch_size
        self._watchers = 0
        self._next = asyncio.Event()

    @property
    def watchers(self) -> int:
        return self._watchers

    def audit_committed(self) -> None:
        # Set the event every current waiter holds, and hand later ones a fresh one.
        current, self._next = self._next, asyncio.Event()
        current.set()

    def changed(self) -> None:
        """Some state a waiter may care about committed (a residency went COLD)."""
        self.audit_committed()

    def next_change(self) -> asyncio.Event:
        """Take this BEFORE reading the database: a commit after the read still sets it."""
        return self._next

    @contextlib.contextmanager
    def watcher_slot(self) -> Iterator[None]:
        """One of the bounded watcher slots; QUEUE_FULL (RESOURCE_EXHAUSTED) when none is free."""
        if self._watchers >= self.max_watchers:
            raise GantryError(
                "QUEUE_FULL",
                f"{self.max_watchers} audit watchers are open; close one or list events instead",
                limit=str(self.max_watchers),
                what="audit_watchers",
            )
        self._watchers += 1
        try:
            yield
        finally:
            self._watchers -= 1
