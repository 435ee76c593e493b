"""A control-plane stream's outbox: its own reader waits for room, outputs offered from elsewhere
never wait but stop fitting past the overflow bound, and an ended outbox drains (or not)."""

from __future__ import annotations

import asyncio

from gantry.scheduler.outbox import StreamOutbox
from tests.waiting import poll


async def test_the_streams_own_put_waits_for_room_below_the_limit() -> None:
    outbox: StreamOutbox[int] = StreamOutbox(limit=2, overflow_limit=10)
    await outbox.put(1)
    await outbox.put(2)
    third = asyncio.create_task(outbox.put(3))
    await poll(lambda: outbox.waiting_for_room, 5, "the third put parked on the full outbox")
    assert not third.done()
    assert await outbox.get() == 1
    await asyncio.wait_for(third, 1.0)
    assert outbox.take_ready(10) == [2, 3]


async def test_offers_never_wait_and_stop_fitting_past_the_overflow_bound() -> None:
    outbox: StreamOutbox[int] = StreamOutbox(limit=2, overflow_limit=3)
    assert [outbox.offer(i) for i in range(4)] == [True, True, True, False]
    assert outbox.take_ready(2) == [0, 1]
    assert outbox.offer(4)
    assert outbox.take_ready(10) == [2, 4]


async def test_an_ended_outbox_sends_what_waits_then_ends_unless_discarded() -> None:
    kept: StreamOutbox[int] = StreamOutbox(limit=4, overflow_limit=4)
    kept.offer(1)
    kept.end()
    assert not kept.offer(2)
    assert [await kept.get(), await kept.get()] == [1, None]

    discarded: StreamOutbox[int] = StreamOutbox(limit=1, overflow_limit=4)
    await discarded.put(1)
    blocked = asyncio.create_task(discarded.put(2))
    await poll(lambda: discarded.waiting_for_room, 5, "the put parked on the full outbox")
    discarded.end(discard=True)
    await asyncio.wait_for(blocked, 1.0)  # a put parked on the full outbox returns, adding nothing
    assert await discarded.get() is None
