"""Active-active replicas (issue 28 item 1): two real control planes on one PostgreSQL database,
sharing one scheduler, and one real worker given both addresses. The worker holds a stream to
each, of one generation; a deployment is placed once; Embed through either replica is answered
over that replica's own stream (a replica has no path to a worker but its own streams, so an
answer is proof); stopping one replica leaves the node CONNECTED and the other serving; a new
worker process takes the node on both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select

from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import insecure_channel
from gantry.controlplane.app import ControlPlane, ControlPlaneSettings, start_control_plane
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.platform.models import NodeStream
from gantry.v1 import common_pb2, inference_pb2_grpc, worker_gateway_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.agent import WorkerAgent, WorkerSettings
from tests.integration.harness import Harness, running_gantry, shared_warm_pool, wait_for

pytestmark = pytest.mark.postgres


@contextlib.asynccontextmanager
async def replica_beside(
    first: Harness, database_url: str
) -> AsyncIterator[tuple[ControlPlane, grpc.aio.Channel]]:
    """Another control plane on the first one's database and scheduler (one scheduler core
    serves both replicas' streams)."""
    control_plane = await start_control_plane(
        ControlPlaneSettings(
            listen="127.0.0.1:0",
            database_url=database_url,
            scheduler_address=f"127.0.0.1:{first.scheduler_server.port}",
            scheduler_token=first.scheduler_token,
            reconciler=ReconcilerSettings(interval_s=0.2),
        )
    )
    channel = insecure_channel(f"127.0.0.1:{control_plane.port}")
    try:
        await control_plane.scheduler.wait_connected(10)
        yield control_plane, channel
    finally:
        await channel.close()
        await control_plane.stop()


def start_worker(harness: Harness, credential: str, addresses: list[str]) -> WorkerAgent:
    """A worker holding a stream to each of `addresses`, stopped with the harness."""
    settings = WorkerSettings(
        control_plane=",".join(addresses),
        credential=credential,
        artifact_root=harness.artifact_root,
    )
    agent = WorkerAgent(settings, warm_pool=shared_warm_pool())
    harness.workers.append((agent, asyncio.create_task(agent.run())))
    return agent


async def held_by_both(replicas: list[ControlPlane], node_id: str, generation: int) -> bool:
    """Each replica's hub holds an open stream of the node at `generation`, and its row says so."""
    for replica in replicas:
        stream = replica.hub.get(node_id)
        if stream is None or stream.generation != generation:
            return False
    async with replicas[0].database.transaction() as session:
        rows = (
            await session.scalars(select(NodeStream).where(NodeStream.node_id == node_id))
        ).all()
    return sorted((r.replica_id, r.generation) for r in rows) == sorted(
        (replica.replica_id, generation) for replica in replicas
    )


async def embed_through(channel: grpc.aio.Channel, harness: Harness) -> int:
    response = await inference_pb2_grpc.InferenceStub(channel).Embed(
        inf.EmbedRequest(capability="tiny", inputs=["one stream per replica"]),
        metadata=harness.client_md,
    )
    return response.dim


async def node_state(harness: Harness, node_id: str) -> int:
    node = await harness.operator.GetNode(
        cp.GetNodeRequest(node_id=node_id), metadata=harness.op_md
    )
    return node.state


async def test_a_worker_holds_a_stream_to_each_replica_and_each_serves_on_its_own(
    postgres_url: str, tmp_path: Path, tiny_model_dir: Path
):
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(postgres_url, root) as first:
        async with replica_beside(first, postgres_url) as (second, second_channel):
            replicas = [first.control_plane, second]
            addresses = [first.address, f"127.0.0.1:{second.port}"]
            credential = await first.register_node("both-replicas")
            agent = start_worker(first, credential, addresses)
            await wait_for(lambda: agent.generation > 0, what="the worker's generation")
            generation = agent.generation
            node_id = agent.node_id
            await wait_for(
                lambda: held_by_both(replicas, node_id, generation),
                what="a stream of one generation on each replica",
            )

            # Placed once: one residency, one LOAD, though either replica's pump could send it.
            artifact = await first.register_model(tiny_model_dir, "tiny")
            deployment = await first.deploy(artifact.artifact_set_id, "tiny")
            ready = await first.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
            assert [r.node_id for r in ready.residencies] == [node_id]
            listed = await first.operator.ListServingJobs(
                cp.ListServingJobsRequest(deployment_id=deployment.deployment_id),
                metadata=first.op_md,
            )
            assert [j.job_type for j in listed.jobs] == [cp.SERVING_JOB_TYPE_LOAD]

            # Either replica answers, each over its own stream (no replica forwards a call).
            assert await embed_through(first.channel, first) > 0
            assert await embed_through(second_channel, first) > 0
            assert agent.generation == generation

        # The second replica stopped: its stream ended, its row went, the node stayed CONNECTED.
        async def only_first_holds() -> bool:
            return await held_by_both([first.control_plane], node_id, generation)

        await wait_for(only_first_holds, what="the stopped replica's row to go")
        assert await node_state(first, node_id) == common_pb2.NODE_STATE_CONNECTED
        assert agent.connected.is_set()
        assert await embed_through(first.channel, first) > 0

        async with replica_beside(first, postgres_url) as (third, _):
            # A new worker process (generation 0 again) takes the node on both replicas.
            await first.stop_worker(agent)
            restarted = start_worker(first, credential, [first.address, f"127.0.0.1:{third.port}"])
            await wait_for(lambda: restarted.generation > generation, what="a new generation")
            await wait_for(
                lambda: held_by_both([first.control_plane, third], node_id, restarted.generation),
                what="the new process's stream on each replica",
            )
            assert await node_state(first, node_id) == common_pb2.NODE_STATE_CONNECTED


async def test_a_node_taken_through_one_replica_is_taken_back_on_every_stream(
    postgres_url: str, tmp_path: Path
):
    """Another process with the node's credential takes it through the first replica only: the
    worker's stream there is closed (STALE_GENERATION), it dials again and is issued a newer
    generation, and its Welcome makes it end its stream on the second replica (bound to the old
    generation) and dial that one again presenting the new one: both replicas hold it again."""
    root = tmp_path / "artifacts"
    root.mkdir()
    async with (
        running_gantry(postgres_url, root) as first,
        replica_beside(first, postgres_url) as (second, _),
    ):
        replicas = [first.control_plane, second]
        credential = await first.register_node("taken-through-one")
        agent = start_worker(first, credential, [first.address, f"127.0.0.1:{second.port}"])
        await wait_for(lambda: agent.generation > 0, what="the worker's generation")
        old = agent.generation
        await wait_for(lambda: held_by_both(replicas, agent.node_id, old), what="both streams")

        hold = asyncio.Event()

        async def impostor() -> AsyncIterator[wg.WorkerMessage]:
            yield wg.WorkerMessage(hello=wg.Hello())
            await hold.wait()

        stub = worker_gateway_pb2_grpc.WorkerGatewayStub(first.channel)
        call = stub.Connect(impostor(), metadata=auth_metadata(credential))
        try:
            taken = (await call.read()).welcome.accepted_generation
            assert taken > old
            await wait_for(lambda: agent.generation > taken, what="the worker to take it back")
            await wait_for(
                lambda: held_by_both(replicas, agent.node_id, agent.generation),
                what="the new generation's stream on both replicas",
            )
        finally:
            hold.set()
            call.cancel()
