"""The control plane's scheduler link against a real in-process scheduler on port 0: the reconnect
gap is closed, its queues answer QUEUE_FULL, and a cancelled call never counts against health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from gantry.common import tokens
from gantry.common.auth import auth_metadata
from gantry.common.errors import GantryError
from gantry.common.grpc_server import (
    RunningServer,
    ServiceBinding,
    create_server,
    insecure_channel,
)
from gantry.controlplane.platform.scheduler_link import LinkPhase, SchedulerLink
from gantry.scheduler.auth import ServiceTokenAuthenticator
from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.events import (
    NodeInfo,
    ResidencyInfo,
    WorkRequest,
)
from gantry.scheduler.policy.types import Outcome, ResidencyPhase
from gantry.scheduler.server import start_scheduler
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
CONNECTED = common_pb2.NODE_STATE_CONNECTED
RESIDENT = ResidencyPhase.RESIDENT
COLD = ResidencyPhase.COLD


def _node(node_id: str) -> scheduler_pb2.SchedulerNode:
    return scheduler_pb2.SchedulerNode(node_id=node_id, state=CONNECTED)


def _residency(
    residency_id: str, deployment_id: str, node_id: str
) -> scheduler_pb2.SchedulerResidency:
    return scheduler_pb2.SchedulerResidency(
        residency_id=residency_id,
        deployment_id=deployment_id,
        node_id=node_id,
        state=RESIDENT,
        slots=4,  # room for every call these tests have in flight at once
    )


def one_residency_cluster(slots: int) -> Callable[[], Awaitable[scheduler_pb2.ClusterState]]:
    """A link's cluster-state reader: node n1 connected, with one RESIDENT residency r1 of d1
    that takes `slots` calls at a time (the scheduler link, failover and credit tests)."""

    async def read() -> scheduler_pb2.ClusterState:
        residency = _residency("r1", "d1", "n1")
        residency.slots = slots
        return scheduler_pb2.ClusterState(nodes=[_node("n1")], residencies=[residency])

    return read


def _work(work_id: str, deployment_id: str) -> scheduler_pb2.WorkSubmitted:
    return scheduler_pb2.WorkSubmitted(work_id=work_id, deployment_id=deployment_id)


@pytest.fixture
async def scheduler() -> AsyncIterator[RunningServer]:
    server, _ = await start_scheduler(listen="127.0.0.1:0", service_token=TOKEN)
    yield server
    await server.stop(grace=0.1)


async def _snapshot(server: RunningServer) -> scheduler_pb2.QueueSnapshot:
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        return await scheduler_pb2_grpc.SchedulerStub(channel).GetQueueSnapshot(
            scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
        )


async def test_an_update_announced_while_the_snapshot_is_read_reaches_the_scheduler(
    scheduler: RunningServer,
):
    link: SchedulerLink

    async def cluster_state() -> scheduler_pb2.ClusterState:
        # The snapshot was read before r2 committed; r2's announcement arrives mid-replay.
        state = scheduler_pb2.ClusterState(
            nodes=[_node("n1")], residencies=[_residency("r1", "d1", "n1")]
        )
        assert link.phase is LinkPhase.REPLAYING
        link.residency_changed(_residency("r2", "d2", "n1"))
        return state

    link = SchedulerLink(
        address=f"127.0.0.1:{scheduler.port}", service_token=TOKEN, cluster_state=cluster_state
    )
    link.start()
    try:
        await link.wait_connected(10)
        # The stream is ordered: the scheduler applied snapshot and update before this dispatch.
        dispatch = await link.dispatch(_work("w1", "d2"), timeout=5)
        assert (dispatch.residency_id, dispatch.node_id) == ("r2", "n1")
        snapshot = await _snapshot(scheduler)
        assert sorted(r.residency_id for r in snapshot.residencies) == ["r1", "r2"]
    finally:
        await link.stop()


async def test_updates_that_overflow_the_replay_buffer_force_a_fresh_snapshot(
    scheduler: RunningServer,
):
    reads: list[int] = []
    link: SchedulerLink

    async def cluster_state() -> scheduler_pb2.ClusterState:
        reads.append(len(reads))
        residencies = [_residency("r1", "d1", "n1")]
        if len(reads) == 1:
            for n in range(3):  # one more than the buffer holds
                link.residency_changed(_residency(f"x{n}", "dx", "n1"))
        else:
            residencies += [_residency(f"x{n}", "dx", "n1") for n in range(3)]
        return scheduler_pb2.ClusterState(nodes=[_node("n1")], residencies=residencies)

    link = SchedulerLink(
        address=f"127.0.0.1:{scheduler.port}",
        service_token=TOKEN,
        cluster_state=cluster_state,
        replay_buffer_limit=2,
    )
    link.start()
    try:
        await link.wait_connected(10)
        assert len(reads) == 2
        await link.dispatch(_work("w1", "dx"), timeout=5)
        snapshot = await _snapshot(scheduler)
        assert len(snapshot.residencies) == 4
    finally:
        await link.stop()


async def test_a_cancelled_call_is_heard_but_never_counts_against_health(
    scheduler: RunningServer,
):
    async def cluster_state() -> scheduler_pb2.ClusterState:
        return scheduler_pb2.ClusterState(
            nodes=[_node("n1")], residencies=[_residency("r1", "d1", "n1")]
        )

    link = SchedulerLink(
        address=f"127.0.0.1:{scheduler.port}", service_token=TOKEN, cluster_state=cluster_state
    )
    link.start()
    try:
        await link.wait_connected(10)
        await link.dispatch(_work("w1", "d1"), timeout=5)
        await link.dispatch(_work("w2", "d1"), timeout=5)
        link.work_finished("w1", scheduler_pb2.WORK_OUTCOME_CANCELLED)
        link.work_finished("w2", scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE)
        # Anything sent after the finishes is answered after they were applied.
        await link.dispatch(_work("w3", "d1"), timeout=5)
        snapshot = await _snapshot(scheduler)
        assert (snapshot.cancelled_total, snapshot.infra_failures_total) == (1, 1)
        (residency,) = snapshot.residencies
        assert (residency.in_flight, residency.infra_failures) == (1, 1)
    finally:
        await link.stop()


def test_only_infra_failures_count_against_a_residency():
    core = SchedulerCore(CoreSettings(breaker_threshold=100))
    core.load_cluster(
        nodes=[NodeInfo(node_id="n1", connected=True)],
        residencies=[
            ResidencyInfo(residency_id="r1", deployment_id="d1", node_id="n1", phase=RESIDENT)
        ],
        deployments=[],
        policies=[],
        now=0.0,
    )
    for outcome in Outcome:
        work_id = f"w{outcome.value}"
        core.submit(WorkRequest(work_id, "t", "d1", priority=0, cost=1), 0.0)
        core.finish(work_id, outcome, 0.0)
        (residency,) = core.snapshot(0.0).residencies
        assert residency.infra_failures == (1 if outcome == Outcome.INFRA_FAILURE else 0)
        core.upsert_residency(
            ResidencyInfo(residency_id="r1", deployment_id="d1", node_id="n1", phase=COLD), 0.0
        )
        core.upsert_residency(
            ResidencyInfo(residency_id="r1", deployment_id="d1", node_id="n1", phase=RESIDENT), 0.0
        )


class _SilentScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Reads what the link sends and never answers, so requests stay waiting."""

    def __init__(self) -> None:
        self.received: asyncio.Queue[scheduler_pb2.SchedulerInput] = asyncio.Queue()

    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        async for message in request_iterator:
            self.received.put_nowait(message)
        return
        yield  # an async generator that yields nothing


async def _received(service: _SilentScheduler, kind: str) -> scheduler_pb2.SchedulerInput:
    while True:
        message = await asyncio.wait_for(service.received.get(), timeout=5)
        if message.WhichOneof("kind") == kind:
            return message


async def test_requests_past_the_waiter_bound_answer_queue_full():
    service = _SilentScheduler()
    server = await create_server(
        listen="127.0.0.1:0",
        services=[
            ServiceBinding(
                "gantry.v1.Scheduler", service, scheduler_pb2_grpc.add_SchedulerServicer_to_server
            )
        ],
        authenticator=ServiceTokenAuthenticator(TOKEN),
    )

    async def cluster_state() -> scheduler_pb2.ClusterState:
        return scheduler_pb2.ClusterState()

    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}",
        service_token=TOKEN,
        cluster_state=cluster_state,
        waiters_limit=1,
    )
    link.start()
    try:
        await link.wait_connected(10)
        first = asyncio.create_task(link.dispatch(_work("w1", "d1"), timeout=30))
        await _received(service, "work_submitted")
        with pytest.raises(GantryError) as caught:
            await link.dispatch(_work("w2", "d1"), timeout=30)
        assert caught.value.reason == "QUEUE_FULL"
        first.cancel()
    finally:
        await link.stop()
        await server.stop(grace=0.1)


async def test_a_full_outbox_refuses_requests_and_an_overflowing_update_resyncs():
    async def cluster_state() -> scheduler_pb2.ClusterState:
        return scheduler_pb2.ClusterState()

    # Not started: nothing drains the outbox, so it fills deterministically.
    link = SchedulerLink(
        address="127.0.0.1:1", service_token=TOKEN, cluster_state=cluster_state, outbox_limit=2
    )
    link._set_phase(LinkPhase.CONNECTED)
    link.node_changed(_node("n1"))
    link.node_changed(_node("n2"))
    with pytest.raises(GantryError) as caught:
        await link.dispatch(_work("w1", "d1"), timeout=1)
    assert caught.value.reason == "QUEUE_FULL"
    # An update cannot be refused (it is committed) nor dropped: the link ends the stream after
    # what is queued and the reconnect's snapshot carries it.
    link.node_changed(_node("n3"))
    assert link.phase is LinkPhase.RESYNCING and not link.connected
    with pytest.raises(GantryError) as unavailable:
        await link.dispatch(_work("w2", "d1"), timeout=1)
    assert unavailable.value.reason == "SCHEDULER_UNAVAILABLE"


async def test_an_update_that_overflows_the_live_outbox_reconnects_with_a_fresh_snapshot(
    scheduler: RunningServer,
):
    committed: list[scheduler_pb2.SchedulerResidency] = [_residency("r1", "d1", "n1")]
    reads: list[int] = []
    resnapshotted = asyncio.Event()

    async def cluster_state() -> scheduler_pb2.ClusterState:
        reads.append(len(reads))
        if len(reads) > 1:
            resnapshotted.set()
        return scheduler_pb2.ClusterState(nodes=[_node("n1")], residencies=committed)

    link = SchedulerLink(
        address=f"127.0.0.1:{scheduler.port}",
        service_token=TOKEN,
        cluster_state=cluster_state,
        outbox_limit=1,
        reconnect_max_seconds=0.2,
    )
    link.start()
    try:
        await link.wait_connected(10)
        # Two commits announced back to back, before the stream's writer runs: the second finds
        # the outbox full.
        for residency in (_residency("r2", "d2", "n1"), _residency("r3", "d3", "n1")):
            committed.append(residency)
            link.residency_changed(residency)
        assert link.phase is LinkPhase.RESYNCING
        await asyncio.wait_for(resnapshotted.wait(), timeout=10)
        await link.wait_connected(10)
        dispatch = await link.dispatch(_work("w1", "d3"), timeout=5)
        assert dispatch.residency_id == "r3"
    finally:
        await link.stop()
