"""Scheduler outputs nobody waits for (breaker moves, scale advice) reach the link's listeners
over a real gRPC stream, and deployment announcements reach the scheduler."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

import grpc
import pytest

from gantry.common import tokens
from gantry.common.grpc_server import RunningServer, ServiceBinding, create_server
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.scheduler.auth import ServiceTokenAuthenticator
from gantry.v1 import scheduler_pb2, scheduler_pb2_grpc

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
T = TypeVar("T")


class _AdvisingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Answers the snapshot with the outputs a test scripts, and records every input."""

    def __init__(self, outputs: list[scheduler_pb2.SchedulerOutput]) -> None:
        self.outputs = outputs
        self.received: asyncio.Queue[scheduler_pb2.SchedulerInput] = asyncio.Queue()

    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        async for message in request_iterator:
            self.received.put_nowait(message)
            if message.WhichOneof("kind") == "cluster_state":
                for output in self.outputs:
                    yield output


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[_AdvisingScheduler, RunningServer]]:
    breaker = scheduler_pb2.BreakerChanged
    service = _AdvisingScheduler(
        [
            scheduler_pb2.SchedulerOutput(
                breaker_changed=breaker(
                    node_id="n1",
                    deployment_id="d1",
                    state=scheduler_pb2.BREAKER_STATE_OPEN,
                    consecutive_failures=3,
                )
            ),
            scheduler_pb2.SchedulerOutput(
                breaker_changed=breaker(node_id="n1", state=scheduler_pb2.BREAKER_STATE_HALF_OPEN)
            ),
            scheduler_pb2.SchedulerOutput(
                scale_advice=scheduler_pb2.ScaleAdvice(
                    deployment_id="d1", desired_replicas=2, current_replicas=1, reason="queue"
                )
            ),
            scheduler_pb2.SchedulerOutput(
                scale_advice=scheduler_pb2.ScaleAdvice(deployment_id="d2", desired_replicas=3)
            ),
        ]
    )
    server = await create_server(
        listen="127.0.0.1:0",
        services=[
            ServiceBinding(
                "gantry.v1.Scheduler", service, scheduler_pb2_grpc.add_SchedulerServicer_to_server
            )
        ],
        authenticator=ServiceTokenAuthenticator(TOKEN),
    )
    yield service, server
    await server.stop(grace=0.1)


async def _empty_state() -> scheduler_pb2.ClusterState:
    return scheduler_pb2.ClusterState()


class _Heard(Generic[T]):
    """A listener that records what it hears; `wait` returns once `expected` items arrived."""

    def __init__(self, expected: int, *, fail: bool = False) -> None:
        self.items: list[T] = []
        self._expected = expected
        self._fail = fail
        self._arrived = asyncio.Event()

    def __call__(self, item: T) -> None:
        self.items.append(item)
        if len(self.items) >= self._expected:
            self._arrived.set()
        if self._fail:
            raise RuntimeError("a listener bug")

    async def wait(self) -> list[T]:
        await asyncio.wait_for(self._arrived.wait(), timeout=5)
        return self.items


async def test_breaker_moves_and_advice_reach_their_listeners_and_opening_warns(
    scripted: tuple[_AdvisingScheduler, RunningServer], caplog: pytest.LogCaptureFixture
):
    _, server = scripted
    breakers: _Heard[scheduler_pb2.BreakerChanged] = _Heard(2)
    advice: _Heard[scheduler_pb2.ScaleAdvice] = _Heard(2)
    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}",
        service_token=TOKEN,
        cluster_state=_empty_state,
        on_breaker_changed=breakers,
        on_scale_advice=advice,
    )
    caplog.set_level(logging.INFO, logger="gantry.controlplane.platform.scheduler_link")
    link.start()
    try:
        await advice.wait()
        assert [(b.node_id, b.state) for b in await breakers.wait()] == [
            ("n1", scheduler_pb2.BREAKER_STATE_OPEN),
            ("n1", scheduler_pb2.BREAKER_STATE_HALF_OPEN),
        ]
        assert [(a.deployment_id, a.desired_replicas) for a in advice.items] == [
            ("d1", 2),
            ("d2", 3),
        ]
        assert link.breaker_changes == {"BREAKER_STATE_OPEN": 1, "BREAKER_STATE_HALF_OPEN": 1}
        levels = {
            record.levelno
            for record in caplog.records
            if "breaker" in record.getMessage() and record.name.endswith("scheduler_link")
        }
        assert levels == {logging.WARNING, logging.INFO}
        assert link.connected
    finally:
        await link.stop()


async def test_a_failing_listener_does_not_end_the_stream(
    scripted: tuple[_AdvisingScheduler, RunningServer],
):
    _, server = scripted
    broken: _Heard[scheduler_pb2.ScaleAdvice] = _Heard(2, fail=True)
    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}",
        service_token=TOKEN,
        cluster_state=_empty_state,
        on_scale_advice=broken,
    )
    link.start()
    try:
        # The second piece of advice was read after the first listener call raised.
        assert [a.deployment_id for a in await broken.wait()] == ["d1", "d2"]
        assert link.connected
    finally:
        await link.stop()


async def test_breaker_moves_without_a_listener_are_still_counted(
    scripted: tuple[_AdvisingScheduler, RunningServer],
):
    _, server = scripted
    advice: _Heard[scheduler_pb2.ScaleAdvice] = _Heard(1)
    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}",
        service_token=TOKEN,
        cluster_state=_empty_state,
        on_scale_advice=advice,
    )
    link.start()
    try:
        await advice.wait()  # the stream carries the breaker moves before the advice
        assert sum(link.breaker_changes.values()) == 2
        assert link.connected
    finally:
        await link.stop()


async def test_a_deployment_announcement_reaches_the_scheduler_as_an_update(
    scripted: tuple[_AdvisingScheduler, RunningServer],
):
    service, server = scripted
    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}", service_token=TOKEN, cluster_state=_empty_state
    )
    link.start()
    try:
        await link.wait_connected(10)
        deployment = scheduler_pb2.SchedulerDeployment(
            deployment_id="d1", replicas=1, min_replicas=1, max_replicas=2
        )
        link.deployment_changed(deployment, removed=True)
        async with asyncio.timeout(5):
            while (message := await service.received.get()).WhichOneof("kind") != (
                "deployment_update"
            ):
                pass
        assert message.deployment_update.deployment == deployment
        assert message.deployment_update.removed
    finally:
        await link.stop()


async def test_a_deleted_node_reaches_the_scheduler_as_a_removal(
    scripted: tuple[_AdvisingScheduler, RunningServer],
):
    service, server = scripted
    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}", service_token=TOKEN, cluster_state=_empty_state
    )
    link.start()
    try:
        await link.wait_connected(10)
        link.node_removed("n1")
        async with asyncio.timeout(5):
            while (message := await service.received.get()).WhichOneof("kind") != "node_update":
                pass
        assert message.node_update.node.node_id == "n1"
        assert message.node_update.removed
    finally:
        await link.stop()
