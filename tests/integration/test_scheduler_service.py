"""The scheduler servicer alone, on a real in-process server on port 0."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gantry.common import tokens
from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import RunningServer, insecure_channel
from gantry.common.status import error_info_of
from gantry.scheduler.server import start_scheduler
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

TOKEN = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")


@pytest.fixture
async def scheduler() -> AsyncIterator[tuple[RunningServer, scheduler_pb2_grpc.SchedulerStub]]:
    server, _ = await start_scheduler(listen="127.0.0.1:0", service_token=TOKEN)
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield server, scheduler_pb2_grpc.SchedulerStub(channel)
    await server.stop(grace=0.1)


async def test_dispatch_and_rejection_over_the_connect_stream(scheduler):  # type: ignore[no-untyped-def]
    _, stub = scheduler
    inbox: asyncio.Queue[scheduler_pb2.SchedulerInput | None] = asyncio.Queue()

    async def inputs() -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        while (message := await inbox.get()) is not None:
            yield message

    call = stub.Connect(inputs(), metadata=auth_metadata(TOKEN))
    inbox.put_nowait(
        scheduler_pb2.SchedulerInput(
            cluster_state=scheduler_pb2.ClusterState(
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
        )
    )
    inbox.put_nowait(
        scheduler_pb2.SchedulerInput(
            work_submitted=scheduler_pb2.WorkSubmitted(work_id="w1", deployment_id="d1")
        )
    )
    dispatch = await call.read()
    assert (dispatch.dispatch.work_id, dispatch.dispatch.residency_id) == ("w1", "r1")
    inbox.put_nowait(
        scheduler_pb2.SchedulerInput(
            work_submitted=scheduler_pb2.WorkSubmitted(work_id="w2", deployment_id="other")
        )
    )
    rejected = await call.read()
    assert rejected.rejected.work_id == "w2"
    assert rejected.rejected.failure.reason == "DEPLOYMENT_NOT_READY"
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )
    assert snapshot.control_plane_connected and snapshot.in_flight == 1
    assert (snapshot.dispatched_total, snapshot.rejected_total) == (1, 1)
    inbox.put_nowait(None)


async def test_a_wrong_service_token_is_unauthenticated(scheduler):  # type: ignore[no-untyped-def]
    _, stub = scheduler
    wrong = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetQueueSnapshot(
            scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(wrong)
        )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info_of(caught.value).reason == "UNAUTHENTICATED"  # type: ignore[union-attr]


async def test_a_removed_node_and_deployment_leave_the_queue_snapshot(scheduler):  # type: ignore[no-untyped-def]
    _, stub = scheduler
    inbox: asyncio.Queue[scheduler_pb2.SchedulerInput | None] = asyncio.Queue()

    async def inputs() -> AsyncIterator[scheduler_pb2.SchedulerInput]:
        while (message := await inbox.get()) is not None:
            yield message

    def node(node_id: str) -> scheduler_pb2.SchedulerNode:
        return scheduler_pb2.SchedulerNode(
            node_id=node_id,
            state=common_pb2.NODE_STATE_CONNECTED,
            domains=[
                common_pb2.ResourceDomain(
                    name="host.ram", kind=common_pb2.RESOURCE_KIND_RAM, capacity_bytes=1 << 34
                )
            ],
        )

    def submit(work_id: str, deployment_id: str) -> scheduler_pb2.SchedulerInput:
        return scheduler_pb2.SchedulerInput(
            work_submitted=scheduler_pb2.WorkSubmitted(work_id=work_id, deployment_id=deployment_id)
        )

    scaled = scheduler_pb2.SchedulerDeployment(
        deployment_id="d2", replicas=1, min_replicas=1, max_replicas=2
    )
    call = stub.Connect(inputs(), metadata=auth_metadata(TOKEN))
    inbox.put_nowait(
        scheduler_pb2.SchedulerInput(
            cluster_state=scheduler_pb2.ClusterState(
                nodes=[node("n1"), node("n2")],
                residencies=[
                    scheduler_pb2.SchedulerResidency(
                        residency_id="r1",
                        deployment_id="d1",
                        node_id="n1",
                        state=common_pb2.RESIDENCY_STATE_RESIDENT,
                    )
                ],
                deployments=[scaled],
            )
        )
    )
    inbox.put_nowait(submit("w1", "d1"))
    assert (await call.read()).dispatch.work_id == "w1"
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )
    both = {"n1", "n2"}
    assert {n.node_id for n in snapshot.nodes} == {v.node_id for v in snapshot.ledger} == both

    inbox.put_nowait(
        scheduler_pb2.SchedulerInput(
            node_update=scheduler_pb2.NodeUpdate(
                node=scheduler_pb2.SchedulerNode(node_id="n2"), removed=True
            )
        )
    )
    inbox.put_nowait(
        scheduler_pb2.SchedulerInput(
            deployment_update=scheduler_pb2.DeploymentUpdate(deployment=scaled, removed=True)
        )
    )
    # Inputs apply in order: once this answer is read, both removals were applied.
    inbox.put_nowait(submit("w2", "d2"))
    assert (await call.read()).rejected.work_id == "w2"
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )
    assert [n.node_id for n in snapshot.nodes] == [v.node_id for v in snapshot.ledger] == ["n1"]
    assert [r.residency_id for r in snapshot.residencies] == ["r1"]
    inbox.put_nowait(None)
