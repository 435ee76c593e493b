"""The injectable clock every policy takes instead of reading time itself (and sleeping)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock tests move by hand. `sleep` returns once `advance` has moved time far enough."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self._monotonic = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> dt.datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    @property
    def sleepers(self) -> int:
        """How many `sleep`s wait for `advance` (what a test waits for before it advances)."""
        return len(self._sleepers)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._monotonic + seconds, future))
        await future

    def advance(self, seconds: float) -> None:
        self._now += dt.timedelta(seconds=seconds)
        self._monotonic += seconds
        due = [(at, f) for at, f in self._sleepers if at <= self._monotonic]
        self._sleepers = [(at, f) for at, f in self._sleepers if at > self._monotonic]
        for _, future in due:
            if not future.done():
                future.set_result(None)
