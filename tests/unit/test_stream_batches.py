"""Issue 29: a worker stream's outbox sends what already waits in it as one message
(gantry.common.stream_batches), where the other end said it reads batches; alone otherwise, and
always alone when nothing else waits (no timer: a message never waits for company)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gantry.common.stream_batches import Batches, take_batch
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.control_planes import StreamTarget
from gantry.worker.links import Link


def ack(job_id: str) -> wg.ControlMessage:
    return wg.ControlMessage(ack=wg.Ack(job_id=job_id))


def wrap(messages: list[wg.ControlMessage]) -> wg.ControlMessage:
    return wg.ControlMessage(batch=wg.ControlBatch(messages=messages))


def ids(message: wg.ControlMessage) -> list[str]:
    """The acks a sent message carries, in order (a batch's, or its own)."""
    if message.WhichOneof("kind") == "batch":
        return [inner.ack.job_id for inner in message.batch.messages]
    return [message.ack.job_id]


async def sent(
    queued: list[wg.ControlMessage | None], *, allowed: bool = True, **bounds: int
) -> list[list[str]]:
    """What `batched` sends of an outbox holding `queued` (then its end marker): each stream
    message as the acks it carries."""
    outbox: asyncio.Queue[wg.ControlMessage | None] = asyncio.Queue()
    for message in [*queued, None]:
        outbox.put_nowait(message)
    batches = Batches(outbox, wrap=wrap, allowed=lambda: allowed, **bounds)
    return [ids(m) async for m in drain(batches)]


async def drain(batches: Batches[wg.ControlMessage]) -> AsyncIterator[wg.ControlMessage]:
    while (message := await batches.next()) is not None:
        yield message


async def test_what_waits_goes_in_one_message_in_order():
    assert await sent([ack("a"), ack("b"), ack("c")]) == [["a", "b", "c"]]


async def test_a_lone_message_goes_alone_not_wrapped():
    outbox: asyncio.Queue[wg.ControlMessage | None] = asyncio.Queue()
    outbox.put_nowait(ack("a"))
    batches = Batches(outbox, wrap=wrap, allowed=lambda: True)
    first = await batches.next()
    assert first is not None and first.WhichOneof("kind") == "ack"  # at once, not waiting
    outbox.put_nowait(None)
    assert await batches.next() is None
    assert await batches.next() is None  # ended stays ended


async def test_a_peer_that_did_not_say_it_reads_batches_gets_each_alone():
    assert await sent([ack("a"), ack("b"), ack("c")], allowed=False) == [["a"], ["b"], ["c"]]


async def test_the_count_bound_splits_a_batch_keeping_the_order():
    queued: list[wg.ControlMessage | None] = [ack(str(i)) for i in range(7)]
    assert await sent(queued, max_messages=3) == [["0", "1", "2"], ["3", "4", "5"], ["6"]]


async def test_a_message_past_the_bytes_goes_alone_and_the_order_holds():
    big = wg.ControlMessage(ack=wg.Ack(job_id="big" + "x" * 500))
    queued = [ack("a"), big, ack("b"), ack("c")]
    result = await sent(queued, max_bytes=200)
    assert [[i[:3] for i in message] for message in result] == [["a"], ["big"], ["b", "c"]]


async def test_the_end_marker_still_sends_what_was_taken_before_it():
    outbox: asyncio.Queue[wg.ControlMessage | None] = asyncio.Queue()
    for message in (ack("a"), ack("b"), None, ack("late")):
        outbox.put_nowait(message)
    result = [ids(m) async for m in drain(Batches(outbox, wrap=wrap, allowed=lambda: True))]
    assert result == [["a", "b"]]  # what followed the end is not sent


def test_take_batch_counts_what_fits_after_the_first():
    first = ack("a")
    size = first.ByteSize()
    waiting = [ack("b"), ack("c"), ack("d")]
    assert take_batch(first, waiting) == 3
    assert take_batch(first, waiting, max_messages=2) == 1
    assert take_batch(first, waiting, max_bytes=size * 2) == 1
    assert take_batch(first, [], max_bytes=1) == 0


async def test_a_worker_link_batches_only_once_its_welcome_said_so():
    link = Link(target=StreamTarget(address="127.0.0.1:1"), outbox_limit=16)

    def beat() -> wg.WorkerMessage:
        return wg.WorkerMessage(node_id="n", generation=3, heartbeat=wg.Heartbeat())

    stream = link.outgoing()
    link.put(beat())
    link.put(beat())
    # Before the Welcome (the Hello's turn): each alone.
    assert [(await anext(stream)).WhichOneof("kind") for _ in range(2)] == ["heartbeat"] * 2
    link.batches_understood = True  # what the Welcome said (agent.py)
    link.put(beat())
    link.put(beat())
    batch = await anext(stream)
    assert batch.WhichOneof("kind") == "batch"
    # The envelope is stamped as its first message; each message keeps its own stamp.
    assert (batch.node_id, batch.generation, len(batch.batch.messages)) == ("n", 3, 2)
    link.renew()  # a new stream: its control plane has not said it yet
    assert not link.batches_understood


def test_a_worker_reads_a_batchs_messages_in_order_and_refuses_a_nested_one():
    from gantry.common.errors import GantryError
    from gantry.worker.links import unbatched

    alone = ack("a")
    assert list(unbatched(alone)) == [alone]
    assert [m.ack.job_id for m in unbatched(wrap([ack("a"), ack("b")]))] == ["a", "b"]
    for inside in (wrap([ack("a")]), wg.ControlMessage(welcome=wg.Welcome())):
        with pytest.raises(GantryError) as refused:
            unbatched(wrap([ack("a"), inside]))
        assert refused.value.reason == "INVALID_ARGUMENT"
