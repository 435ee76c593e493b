"""A streaming invocation's progress on a worker stream: handed to its caller in order before the
result, held at most `progress_limit` deep, and never waited for by the stream's reader. A caller
that falls behind (or stops reading, blocked in its write) is failed with CLIENT_TOO_SLOW and its
invocation cancelled on the worker, while every other call on the stream goes on."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import timestamp_pb2

from gantry.common.errors import GantryError
from gantry.controlplane.nodes.sessions import WorkerHub, WorkerStream, WorkerStreamSettings
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

STREAMED = wg.GeneratePayload(prompt="Once", max_tokens=8, stream=True)


def _hub() -> tuple[WorkerHub, WorkerStream]:
    hub = WorkerHub(WorkerStreamSettings(outbox_limit=8, pending_invokes_limit=4))
    stream = hub.open_stream(node_id="n1", generation=1)
    hub.attach(stream)
    return hub, stream


def _delta(request_id: str, text: str, tokens: int) -> wg.InvokeProgress:
    return wg.InvokeProgress(
        request_id=request_id, generate=wg.GenerateDelta(text=text, completion_tokens=tokens)
    )


def _result(request_id: str, text: str) -> wg.InvokeResult:
    return wg.InvokeResult(
        request_id=request_id,
        generate=wg.GenerateResult(
            text=text,
            finish_reason=common_pb2.FINISH_REASON_STOP,
            prompt_tokens=2,
            completion_tokens=len(text),
        ),
    )


class Caller:
    """A streaming caller: takes each progress item (a write to its client) when `reading` is
    set, and records what it took."""

    def __init__(self) -> None:
        self.taken: list[str] = []
        self.reading = asyncio.Event()
        self.reading.set()
        self.blocked = asyncio.Event()  # set while it waits to be read
        self.took = asyncio.Event()  # set after each item it took

    async def take(self, progress: wg.InvokeProgress) -> None:
        if not self.reading.is_set():
            self.blocked.set()
            await self.reading.wait()
        self.taken.append(progress.generate.text)
        self.took.set()


def _invoke(hub: WorkerHub, request_id: str, caller: Caller | None, *, limit: int = 4):  # type: ignore[no-untyped-def]
    return hub.invoke(
        node_id="n1",
        request_id=request_id,
        deployment_id="d1",
        payload=STREAMED if caller is not None else wg.GeneratePayload(prompt="x", max_tokens=2),
        timeout=30,
        trace_context={},
        deadline=timestamp_pb2.Timestamp(),
        on_progress=caller.take if caller is not None else None,
        progress_limit=limit,
    )


def _drain(stream: WorkerStream) -> list[wg.ControlMessage]:
    messages = []
    while not stream.outbox.empty():
        message = stream.outbox.get_nowait()
        assert message is not None
        messages.append(message)
    return messages


async def _sent(stream: WorkerStream) -> wg.Invoke:
    message = await asyncio.wait_for(stream.outbox.get(), timeout=5)
    assert message is not None and message.WhichOneof("kind") == "invoke"
    return message.invoke


async def test_progress_reaches_the_caller_in_order_before_the_result():
    hub, stream = _hub()
    caller = Caller()
    call = asyncio.create_task(_invoke(hub, "w1", caller))
    invoke = await _sent(stream)
    assert invoke.generate.stream and invoke.generate.max_tokens == 8
    # The reader hands everything over at once, without waiting for the caller in between.
    for index, text in enumerate(["Once", " upon", " a"], start=1):
        assert stream.progress_invoke(_delta("w1", text, index))
    assert stream.resolve_invoke(_result("w1", "Once upon a"))
    result = await call
    assert caller.taken == ["Once", " upon", " a"]
    assert result.generate.text == "Once upon a"
    assert stream.pending_invokes == {} and _drain(stream) == []  # answered: no cancel


async def test_a_caller_that_falls_behind_is_failed_and_its_work_cancelled_alone():
    hub, stream = _hub()
    slow, other = Caller(), Caller()
    slow.reading.clear()
    slow_call = asyncio.create_task(_invoke(hub, "slow", slow, limit=2))
    await _sent(stream)
    other_call = asyncio.create_task(_invoke(hub, "other", other, limit=2))
    await _sent(stream)
    assert stream.progress_invoke(_delta("slow", "a", 1))
    await asyncio.wait_for(slow.blocked.wait(), 5)  # its client reads nothing
    # Two more wait for it: its limit. The next is one too many; the reader never waits.
    assert stream.progress_invoke(_delta("slow", "b", 2))
    assert stream.progress_invoke(_delta("slow", "c", 3))
    assert not stream.progress_invoke(_delta("slow", "d", 4))
    (cancel,) = _drain(stream)
    assert cancel.cancel_invoke.request_id == "slow"
    # The caller blocked in its write hears of it at once, not when its client reads again.
    with pytest.raises(GantryError) as caught:
        await asyncio.wait_for(slow_call, 5)
    assert caught.value.reason == "CLIENT_TOO_SLOW"
    assert caught.value.code.name == "RESOURCE_EXHAUSTED"
    assert caught.value.failure_class.name == "REQUEST"  # not the residency's failure
    assert caught.value.metadata["limit"] == "2"
    # Its late progress and result are dropped; the other call on the stream is served.
    assert not stream.progress_invoke(_delta("slow", "e", 5))
    assert not stream.resolve_invoke(_result("slow", "abcde"))
    assert stream.progress_invoke(_delta("other", "ok", 1))
    assert stream.resolve_invoke(_result("other", "ok"))
    assert (await other_call).generate.text == "ok" and other.taken == ["ok"]
    assert stream.pending_invokes == {} and _drain(stream) == []


async def test_a_caller_that_keeps_up_is_never_failed_however_long_the_answer():
    hub, stream = _hub()
    caller = Caller()
    call = asyncio.create_task(_invoke(hub, "w1", caller, limit=2))
    await _sent(stream)
    texts = [f"t{index}" for index in range(50)]
    for index, text in enumerate(texts, start=1):
        assert stream.progress_invoke(_delta("w1", text, index))
        await asyncio.wait_for(caller.took.wait(), 5)  # it takes each before the next arrives
        caller.took.clear()
    assert stream.resolve_invoke(_result("w1", "".join(texts)))
    await call
    assert caller.taken == texts


async def test_a_caller_that_goes_away_mid_stream_cancels_on_the_worker():
    hub, stream = _hub()
    caller = Caller()
    caller.reading.clear()
    call = asyncio.create_task(_invoke(hub, "w1", caller))
    await _sent(stream)
    assert stream.progress_invoke(_delta("w1", "a", 1))
    await asyncio.wait_for(caller.blocked.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    (cancel,) = _drain(stream)
    assert cancel.cancel_invoke.request_id == "w1"
    assert stream.pending_invokes == {}


async def test_a_lost_stream_fails_a_streaming_caller_without_its_backlog():
    hub, stream = _hub()
    caller = Caller()
    caller.reading.clear()
    call = asyncio.create_task(_invoke(hub, "w1", caller))
    await _sent(stream)
    for index, text in enumerate("abc", start=1):
        assert stream.progress_invoke(_delta("w1", text, index))
    await asyncio.wait_for(caller.blocked.wait(), 5)
    stream.close(GantryError("WORKER_UNAVAILABLE", "lost"))
    with pytest.raises(GantryError) as caught:
        await asyncio.wait_for(call, 5)
    assert caught.value.reason == "WORKER_UNAVAILABLE"
    assert caller.taken == []  # the write it was blocked in was abandoned, nothing after it


async def test_progress_for_a_call_that_asked_none_is_dropped_and_the_call_answered():
    hub, stream = _hub()
    call = asyncio.create_task(_invoke(hub, "w1", None))
    invoke = await _sent(stream)
    assert not invoke.generate.stream
    assert not stream.progress_invoke(_delta("w1", "stray", 1))
    assert not stream.progress_invoke(_delta("nobody", "stray", 1))
    assert stream.resolve_invoke(_result("w1", "ok"))
    assert (await call).generate.text == "ok"
