"""One control-plane stream's outputs, in the order they were decided, with two bounds.

The stream's own reader waits while `limit` outputs wait (`put`): the control plane's sends are
then held back by gRPC flow control, never dropped. Outputs decided for the stream by anything
else (another stream's input freeing a slot, the ticker) are offered without waiting (`offer`),
so one control plane that stops reading never stalls the others; they stop fitting only past
`overflow_limit`, which the service sets above everything a reading stream can be owed (its own
backlog plus an answer for each call it may have queued), and then the stream is ended.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

Item = TypeVar("Item")


class StreamOutbox(Generic[Item]):
    def __init__(self, *, limit: int, overflow_limit: int) -> None:
        self._items: deque[Item] = deque()
        self._limit = limit
        self._overflow_limit = max(limit, overflow_limit)
        self._filled = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def waiting_for_room(self) -> bool:
        """Whether a `put` is parked on the full backlog (what a test waits for)."""
        return not self._room.is_set()

    async def put(self, item: Item) -> None:
        """Add an output, first waiting for the backlog to fall under `limit`."""
        while len(self._items) >= self._limit and not self._ended:
            self._room.clear()
            await self._room.wait()
        if not self._ended:
            self._push(item)

    def offer(self, item: Item) -> bool:
        """Add an output now; False (and nothing added) past `overflow_limit` or once ended."""
        if self._ended or len(self._items) >= self._overflow_limit:
            return False
        self._push(item)
        return True

    async def get(self) -> Item | None:
        """The next output; None once the outbox has ended and nothing is left to send."""
        while not self._items:
            if self._ended:
                return None
            self._filled.clear()
            await self._filled.wait()
        return self._take()

    def take_ready(self, most: int) -> list[Item]:
        """Up to `most` outputs already waiting, without waiting for more."""
        return [self._take() for _ in range(min(most, len(self._items)))]

    def end(self, *, discard: bool = False) -> None:
        """Nothing more goes in; what waits is still sent, unless `discard` (an overflow: a
        control plane that stopped reading would never take it)."""
        self._ended = True
        if discard:
            self._items.clear()
        self._filled.set()
        self._room.set()

    def _push(self, item: Item) -> None:
        self._items.append(item)
        self._filled.set()

    def _take(self) -> Item:
        item = self._items.popleft()
        if len(self._items) < self._limit:
            self._room.set()
        return item
