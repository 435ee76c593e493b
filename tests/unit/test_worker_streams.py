"""Worker streams: bounded queues answer QUEUE_FULL, and invocations that end without an answer
(their deadline, or a caller that went away) are cancelled on the worker and forgotten here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NoReturn

import grpc
import pytest
from google.protobuf import timestamp_pb2

from gantry.common import tokens
from gantry.common.auth import Principal, Role, auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.common.grpc_server import ServiceBinding, create_server, insecure_channel
from gantry.common.status import error_info_of
from gantry.controlplane.nodes.sessions import (
    WorkerHub,
    WorkerSession,
    WorkerStream,
    WorkerStreamSettings,
)
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.inference_service import (
    CallBudget,
    InferenceService,
    InferenceSettings,
    work_outcome,
)
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.scheduler.server import start_scheduler
from gantry.v1 import (
    common_pb2,
    inference_pb2,
    inference_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from gantry.v1 import worker_gateway_pb2 as wg


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
# The worker is played by the test through the stream's outbox, and the capability's route is
# primed in the route cache so no database is involved.

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
API_KEY = "test-api-key"


class _ClientKeys:
    async def authenticate(self, role: Role, token: str) -> Principal:
        if role is not Role.CLIENT or token != API_KEY:
            raise GantryError("UNAUTHENTICATED", "not a client key")
        return Principal(role=Role.CLIENT, subject="tenant-a")


class _NoDatabase:
    def transaction(self) -> NoReturn:
        raise AssertionError("the route cache should have answered")


@dataclass
class _Stack:
    stream: WorkerStream
    inference: inference_pb2_grpc.InferenceStub
    scheduler_port: int

    async def queue_snapshot(self) -> scheduler_pb2.QueueSnapshot:
        async with insecure_channel(f"127.0.0.1:{self.scheduler_port}") as channel:
            return await scheduler_pb2_grpc.SchedulerStub(channel).GetQueueSnapshot(
                scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
            )

    async def next_message(self, kind: str) -> wg.ControlMessage:
        message = await asyncio.wait_for(self.stream.outbox.get(), timeout=5)
        assert message is not None and message.WhichOneof("kind") == kind, message
        return message


@pytest.fixture
async def stack() -> AsyncIterator[_Stack]:
    scheduler_server, _ = await start_scheduler(listen="127.0.0.1:0", service_token=TOKEN)

    async def cluster_state() -> scheduler_pb2.ClusterState:
        return scheduler_pb2.ClusterState(
            nodes=[
                scheduler_pb2.SchedulerNode(node_id="n1", state=common_pb2.NODE_STATE_CONNECTED)
            ],
            residencies=[
                scheduler_pb2.SchedulerResidency(
                    residency_id="r1",
                    deployment_id="d1",
                    node_id="n1",
                    state=common_pb2.RESIDENCY_STATE_RESIDENT,
                )
            ],
        )

    link = SchedulerLink(
        address=f"127.0.0.1:{scheduler_server.port}",
        service_token=TOKEN,
        cluster_state=cluster_state,
    )
    link.start()
    await link.wait_connected(10)
    hub, stream = _hub(outbox_limit=2)
    clock = ManualClock()  # monotonic time stands still: the primed route never expires
    routes = RouteCache(clock)
    routes.put("tiny", "d1")
    service = InferenceService(
        database=_NoDatabase(),  # type: ignore[arg-type]
        hub=hub,
        scheduler=link,
        routes=routes,
        clock=clock,
        settings=InferenceSettings(max_invoke_seconds=60.0),
    )
    server = await create_server(
        listen="127.0.0.1:0",
        services=[
            ServiceBinding(
                "gantry.v1.Inference", service, inference_pb2_grpc.add_InferenceServicer_to_server
            )
        ],
        authenticator=_ClientKeys(),
    )
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield _Stack(
            stream=stream,
            inference=inference_pb2_grpc.InferenceStub(channel),
            scheduler_port=scheduler_server.port,
        )
    await server.stop(grace=0.1)
    await link.stop()
    await scheduler_server.stop(grace=0.1)


def _embed(stack: _Stack, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
    return stack.inference.Embed(
        inference_pb2.EmbedRequest(capability="tiny", inputs=["hello"]),
        metadata=auth_metadata(API_KEY),
        timeout=timeout,
    )


async def _finished(stack: _Stack, *, cancelled: int) -> scheduler_pb2.QueueSnapshot:
    """The scheduler's counters once it has heard `cancelled` CANCELLED outcomes."""
    latest: list[scheduler_pb2.QueueSnapshot] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while loop.time() < deadline:
        latest[:] = [await stack.queue_snapshot()]
        if latest[0].cancelled_total >= cancelled and latest[0].in_flight == 0:
            return latest[0]
        await asyncio.sleep(0.05)  # polling another process's state, not synchronising
    raise AssertionError(f"the scheduler never heard {cancelled} CANCELLED outcome(s): {latest}")


async def test_embed_answers_and_the_scheduler_hears_success(stack: _Stack):
    call = _embed(stack, timeout=30)
    invoke = (await stack.next_message("invoke")).invoke
    stack.stream.resolve_invoke(
        wg.InvokeResult(
            request_id=invoke.request_id,
            embed=wg.EmbedResult(count=1, dim=2, float32_le=b"\0" * 8),
        )
    )
    response = await call
    assert (response.dim, response.node_id, response.deployment_id) == (2, "n1", "d1")
    snapshot = await _finished(stack, cancelled=0)
    assert snapshot.dispatched_total == 1 and snapshot.infra_failures_total == 0


async def test_a_two_second_client_deadline_is_honoured_and_cancels_on_the_worker(stack: _Stack):
    started = time.monotonic()
    call = _embed(stack, timeout=2.0)
    invoke = (await stack.next_message("invoke")).invoke
    assert 1_000_000_000 < invoke.timeout.ToNanoseconds() <= 2_100_000_000  # gRPC rounds up
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    elapsed = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed < 5.0, f"the call ended after {elapsed:.1f}s, not at the client's 2s"
    cancel = await stack.next_message("cancel_invoke")
    assert cancel.cancel_invoke.request_id == invoke.request_id
    assert stack.stream.pending_invokes == {}
    # The client's own deadline says nothing about the residency's health.
    snapshot = await _finished(stack, cancelled=1)
    assert snapshot.infra_failures_total == 0


async def test_a_client_that_goes_away_is_cancelled_everywhere_and_never_counts_as_infra(
    stack: _Stack,
):
    call = _embed(stack)  # no deadline: the server cap applies
    invoke = (await stack.next_message("invoke")).invoke
    assert invoke.timeout.ToNanoseconds() <= 60_000_000_000
    call.cancel()
    cancel = await stack.next_message("cancel_invoke")
    assert cancel.cancel_invoke.request_id == invoke.request_id
    assert stack.stream.pending_invokes == {}
    snapshot = await _finished(stack, cancelled=1)
    assert snapshot.infra_failures_total == 0
    assert [r.infra_failures for r in snapshot.residencies] == [0]


async def test_a_full_worker_outbox_answers_queue_full(stack: _Stack):
    for job_id in ("j1", "j2"):  # the stream's outbox holds two
        stack.stream.send(wg.ControlMessage(ack=wg.Ack(job_id=job_id)))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _embed(stack, timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info_of(caught.value).reason == "QUEUE_FULL"  # type: ignore[union-attr]
    assert stack.stream.pending_invokes == {}


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
    await asyncio.sleep(0)
    assert [m.invoke.request_id for m in _drain(stream)] == ["r-small"]
    with pytest.raises(GantryError):
        await task
