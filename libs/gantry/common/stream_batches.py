"""A stream's outbox, sent with what is already waiting in it put together in one message.

Why (issue 29): under load a worker stream carries an Invoke and an InvokeResult per call, and
each stream message costs both ends a write, a read and an event-loop wake-up whatever its size.
Taking what already waits in the outbox when the sender wakes costs an idle stream nothing (one
message waiting goes alone, at once) and, under load, one message for many calls. No timer: a
message never waits for company.

`take_batch` decides (pure: which waiting messages go together); `Batches` applies it to an
`asyncio.Queue` outbox whose `None` ends the stream.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

# At most this many messages in one batch, and this many bytes of them (the inner messages'
# encodings): far below the streams' 64 MiB frame limit, so a batch never nears it; a message
# past the bytes on its own goes alone, as it would have.
MAX_BATCH_MESSAGES = 64
MAX_BATCH_BYTES = 1024 * 1024


class _Sized(Protocol):
    def ByteSize(self) -> int: ...


M = TypeVar("M", bound=_Sized)


def take_batch(
    first: M,
    waiting: Sequence[M],
    *,
    max_messages: int = MAX_BATCH_MESSAGES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> int:
    """How many of `waiting` (in order) go in one batch after `first`: as many as fit the
    bounds, stopping at the first that does not (order is kept)."""
    total = first.ByteSize()
    taken = 0
    for message in waiting:
        if taken + 1 >= max_messages:
            break
        size = message.ByteSize()
        if total + size > max_bytes:
            break
        total += size
        taken += 1
    return taken


class Batches(Generic[M]):
    """What a stream sends next from its outbox (an `asyncio.Queue` whose `None` ends the
    stream): alone while `allowed()` is false (the peer has not said it reads batches) or
    nothing else waits, else what waits, within the bounds, as one `wrap`ped message.

    A sender awaits `next()` in its own loop, as it awaited the outbox itself: no generator of
    its own to be closed when the sender is cancelled or closed."""

    def __init__(
        self,
        outbox: asyncio.Queue[M | None],
        *,
        wrap: Callable[[list[M]], M],
        allowed: Callable[[], bool],
        max_messages: int = MAX_BATCH_MESSAGES,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self._outbox = outbox
        self._wrap = wrap
        self._allowed = allowed
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._held: collections.deque[M] = collections.deque()  # taken off, not yet sent
        self._ending = False  # the outbox's `None` was taken: end once `_held` is sent

    async def next(self) -> M | None:
        """The next message to send, or None: the stream ends (after what came before its end)."""
        if self._held:
            message = self._held.popleft()
        elif self._ending:
            return None
        else:
            taken = await self._outbox.get()
            if taken is None:
                self._ending = True
                return None
            message = taken
        if not self._allowed():
            return message
        outbox, held = self._outbox, self._held
        while not self._ending and len(held) < self._max_messages and not outbox.empty():
            more = outbox.get_nowait()
            if more is None:
                self._ending = True
            else:
                held.append(more)
        if not held:
            return message
        count = take_batch(
            message, held, max_messages=self._max_messages, max_bytes=self._max_bytes
        )
        if count == 0:
            return message
        return self._wrap([message] + [held.popleft() for _ in range(count)])
