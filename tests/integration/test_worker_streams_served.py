"""Worker streams behind a served Inference API and a real scheduler, over gRPC on port 0: an embed
is answered and the scheduler hears the success, a client deadline cancels the call on the worker,
a client that goes away is cancelled everywhere and never counts as infra, and a full worker
outbox answers QUEUE_FULL.

The streams' own bounds are tested in tests/unit/test_worker_streams.py; these bind ports, which
the unit guard refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NoReturn

import grpc
import pytest

from gantry.common import tokens
from gantry.common.auth import Principal, Role, auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.common.grpc_server import ServiceBinding, create_server, insecure_channel
from gantry.common.status import error_info_of
from gantry.controlplane.nodes.sessions import WorkerStream
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.inference_service import (
    InferenceService,
    InferenceSettings,
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
from tests.integration.polling import wait_until
from tests.unit.test_worker_streams import _hub

# The worker is played by the test through the stream's outbox, and the capability's route is
# primed in the route cache so no database is involved.

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
API_KEY = "test-api-key"
# The server reads what remains of a call's deadline off the wall clock, against gRPC's deadline
# kept to the millisecond: the remaining budget it propagates may read a little short.
ROUNDING_SLACK_S = 0.05


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

    async def heard() -> bool:
        latest[:] = [await stack.queue_snapshot()]
        return latest[0].cancelled_total >= cancelled and latest[0].in_flight == 0

    await wait_until(
        heard,
        10,
        f"the scheduler to hear {cancelled} CANCELLED outcome(s), nothing in flight",
        last=lambda: latest,
    )
    return latest[0]


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
    # The worker is told what remains of the client's 2 s, not the server's cap: at most the 2 s
    # (gRPC rounds the propagated timeout up a little), at least the 2 s less the time the call
    # took to reach the worker, as measured (never assumed), and a rounding slack.
    reached = time.monotonic() - started
    floor_ns = int((2.0 - reached - ROUNDING_SLACK_S) * 1e9)
    assert floor_ns <= invoke.timeout.ToNanoseconds() <= 2_100_000_000, reached
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    # The worker never answers: only the client's own 2 s deadline can end the call so (the
    # server's cap is a minute, and the invoke carried the 2 s, checked above).
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
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
