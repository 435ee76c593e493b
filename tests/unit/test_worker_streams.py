"""Worker streams: bounded queues answer QUEUE_FULL, and invocations that end without an answer
(their deadline, or a caller that went away) are cancelled on the worker and forgotten here."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf import timestamp_pb2

from gantry.common.errors import GantryError
from gantry.controlplane.nodes.sessions import (
    WorkerHub,
    WorkerSession,
    WorkerStream,
    WorkerStreamSettings,
)
from gantry.controlplane.serving.inference_service import (
    CallBudget,
    work_outcome,
)
from gantry.v1 import scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from tests.waiting import poll


def _hub(
    *, outbox_limit: int = 8, pending_invokes_limit: int = 4
) -> tuple[WorkerHub, WorkerStream]:
    hub = WorkerHub(
        WorkerStreamSettings(outbox_limit=outbox_limit, pending_invokes_limit=pending_invokes_limit)
    )
    stream = hub.open_stream(node_id="n1", generation=1)
    hub.attach(stream)
    return hub, stream


def _invoke(hub: WorkerHub, request_id: str, *, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    return hub.invoke_embed(
        node_id="n1",
        request_id=request_id,
        deployment_id="d1",
        inputs=["hello"],
        timeout=timeout,
        trace_context={},
        deadline=timestamp_pb2.Timestamp(),
    )


def _drain(stream: WorkerStream) -> list[wg.ControlMessage]:
    messages = []
    while not stream.outbox.empty():
        message = stream.outbox.get_nowait()
        assert message is not None
        messages.append(message)
    return messages


async def _sent_invoke(stream: WorkerStream) -> wg.Invoke:
    message = await asyncio.wait_for(stream.outbox.get(), timeout=5)
    assert message is not None and message.WhichOneof("kind") == "invoke", message
    return message.invoke


async def test_a_full_outbox_answers_queue_full_and_keeps_what_it_holds():
    _, stream = _hub(outbox_limit=2)
    for job_id in ("j1", "j2"):
        stream.send(wg.ControlMessage(ack=wg.Ack(job_id=job_id)))
    with pytest.raises(GantryError) as caught:
        stream.send(wg.ControlMessage(ack=wg.Ack(job_id="j3")))
    assert caught.value.reason == "QUEUE_FULL"
    assert caught.value.code.name == "RESOURCE_EXHAUSTED"
    assert [m.ack.job_id for m in _drain(stream)] == ["j1", "j2"]


async def test_too_many_pending_invocations_answer_queue_full_without_sending():
    hub, stream = _hub(pending_invokes_limit=1)
    first = asyncio.create_task(_invoke(hub, "w1"))
    await _sent_invoke(stream)
    with pytest.raises(GantryError) as caught:
        await _invoke(hub, "w2")
    assert caught.value.reason == "QUEUE_FULL"
    assert stream.outbox.empty() and list(stream.pending_invokes) == ["w1"]
    assert stream.resolve_invoke(
        wg.InvokeResult(request_id="w1", embed=wg.EmbedResult(count=1, dim=2))
    )
    assert (await first).dim == 2
    assert stream.pending_invokes == {}


async def test_an_invocation_carries_the_relative_timeout_and_its_deadline_cancels_it():
    hub, stream = _hub()
    waiting = asyncio.create_task(_invoke(hub, "w1", timeout=0.2))
    invoke = await _sent_invoke(stream)
    assert 0 < invoke.timeout.ToNanoseconds() <= 200_000_000
    with pytest.raises(GantryError) as caught:
        await waiting
    assert caught.value.reason == "DEADLINE_EXCEEDED"
    (cancel,) = _drain(stream)
    assert cancel.cancel_invoke.request_id == "w1"
    assert stream.pending_invokes == {}
    # The worker answers late: nobody waits, nothing breaks.
    assert not stream.resolve_invoke(wg.InvokeResult(request_id="w1"))


async def test_a_caller_that_goes_away_cancels_the_invocation_on_the_worker():
    hub, stream = _hub()
    waiting = asyncio.create_task(_invoke(hub, "w1"))
    await _sent_invoke(stream)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    (cancel,) = _drain(stream)
    assert cancel.cancel_invoke.request_id == "w1"
    assert stream.pending_invokes == {}


async def test_cancels_are_admitted_past_a_full_outbox_and_stay_bounded():
    hub, stream = _hub(outbox_limit=1, pending_invokes_limit=1)
    waiting = asyncio.create_task(_invoke(hub, "w1"))
    await _sent_invoke(stream)
    stream.send(wg.ControlMessage(ack=wg.Ack(job_id="j1")))  # the outbox is full now
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    with pytest.raises(GantryError, match="unsent messages"):
        stream.send(wg.ControlMessage(ack=wg.Ack(job_id="j2")))
    kinds = [m.WhichOneof("kind") for m in _drain(stream)]
    assert kinds == ["ack", "cancel_invoke"]


async def test_closing_a_stream_fails_its_waiters_and_later_sends():
    hub, stream = _hub()
    waiting = asyncio.create_task(_invoke(hub, "w1"))
    await _sent_invoke(stream)
    stream.close(GantryError("WORKER_UNAVAILABLE", "lost the stream"))
    with pytest.raises(GantryError) as caught:
        await waiting
    assert caught.value.reason == "WORKER_UNAVAILABLE"
    with pytest.raises(GantryError):
        stream.send(wg.ControlMessage(ack=wg.Ack(job_id="j1")))
    assert hub.get("n1") is None


def test_the_old_name_still_builds_a_bounded_stream():
    stream = WorkerSession(node_id="n1", generation=3)
    assert isinstance(stream, WorkerStream)
    assert stream.outbox.maxsize == stream.outbox_limit + stream.pending_invokes_limit + 1


@pytest.mark.parametrize(
    ("client_remaining", "expected"),
    [
        (None, CallBudget(seconds=300.0, client_bounded=False)),
        (2.0, CallBudget(seconds=2.0, client_bounded=True)),
        (120.0, CallBudget(seconds=120.0, client_bounded=True)),
        (900.0, CallBudget(seconds=300.0, client_bounded=False)),
    ],
)
def test_the_client_deadline_is_honoured_up_to_the_server_cap(client_remaining, expected):  # type: ignore[no-untyped-def]
    assert CallBudget.of(client_remaining, max_seconds=300.0) == expected


@pytest.mark.parametrize(
    ("error", "client_bounded", "expected"),
    [
        (None, True, scheduler_pb2.WORK_OUTCOME_SUCCESS),
        (asyncio.CancelledError(), True, scheduler_pb2.WORK_OUTCOME_CANCELLED),
        (asyncio.CancelledError(), False, scheduler_pb2.WORK_OUTCOME_CANCELLED),
        (GantryError("DEADLINE_EXCEEDED", "t"), True, scheduler_pb2.WORK_OUTCOME_CANCELLED),
        (GantryError("DEADLINE_EXCEEDED", "t"), False, scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE),
        (GantryError("RUNTIME_CRASHED", "c"), True, scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE),
        (GantryError("INVALID_PAYLOAD", "p"), True, scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE),
    ],
)
def test_a_cancel_never_counts_as_infra_and_only_the_server_cap_timeout_does(  # type: ignore[no-untyped-def]
    error, client_bounded, expected
):
    budget = CallBudget(seconds=1.0, client_bounded=client_bounded)
    assert work_outcome(error, budget) == expected


# ---- Embed end to end over real gRPC: a client, the inference service, a real scheduler --------
#
async def test_an_invoke_too_large_for_the_stream_is_refused_before_it_is_sent() -> None:
    # A frame over the stream's limit would tear down the node's whole stream: it must become
    # the caller's typed error, with nothing queued and nothing left pending.
    hub, stream = _hub()
    huge = "x" * (16 * 1024 * 1024)
    with pytest.raises(GantryError) as raised:
        await hub.invoke_embed(
            node_id="n1",
            request_id="r-huge",
            deployment_id="d1",
            inputs=[huge] * 5,
            timeout=5.0,
            trace_context={},
            deadline=timestamp_pb2.Timestamp(),
        )
    assert raised.value.reason == "INVALID_PAYLOAD"
    assert raised.value.metadata["limit_bytes"] == str(64 * 1024 * 1024)
    assert _drain(stream) == []
    # The stream still carries ordinary work.
    task = asyncio.ensure_future(_invoke(hub, "r-small", timeout=0.05))
    await poll(lambda: not stream.outbox.empty(), 5, "the small invoke queued on the stream")
    assert [m.invoke.request_id for m in _drain(stream)] == ["r-small"]
    with pytest.raises(GantryError):
        await task
