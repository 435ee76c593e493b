"""A stream's outbox, sent with what is already waiting in it put together in one message.

Why (issue 29): under load a worker stream carries an Invoke and an InvokeResult per call, and
each stream message costs both ends a write, a read and an event-loop wake-up whatever its size.
Taking what already waits in the outbox when the sender wakes costs an idle stream nothing (one
message waiting goes alone, at once) and, under load, one message for many calls. No timer: a
message never waits for company.

`batches` decides (pure: which waiting messages go together); `batched` applies it to an
`asyncio.Queue` outbox whose `None` ends the stream.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, TypeVar

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


async def batched(
    outbox: asyncio.Queue[M | None],
    *,
    wrap: Callable[[list[M]], M],
    allowed: Callable[[], bool],
    max_messages: int = MAX_BATCH_MESSAGES,
    max_bytes: int = MAX_BATCH_BYTES,
) -> AsyncIterator[M]:
    """The outbox's messages in order until its `None`: alone while `allowed()` is false (the
    peer has not said it reads batches) or nothing else waits, else what waits, within the
    bounds, as one `wrap`ped message."""
    held: collections.deque[M] = collections.deque()  # taken off the outbox, not yet sent
    ending = False  # the outbox's `None` was taken: stop once `held` is sent
    while True:
        if held:
            message = held.popleft()
        elif ending:
            return
        else:
            taken_message = await outbox.get()
            if taken_message is None:
                return
            message = taken_message
        if not allowed():
            yield message
            continue
        while not ending and len(held) < max_messages and not outbox.empty():
            more = outbox.get_nowait()
            if more is None:
                ending = True
            else:
                held.append(more)
        if not held:
            yield message
            continue
        taken = take_batch(message, held, max_messages=max_messages, max_bytes=max_bytes)
        if taken == 0:
            yield message
            continue
        together = [message] + [held.popleft() for _ in range(taken)]
        yield wrap(together)
