"""Deadlines and cancellation end to end: client -> control plane -> scheduler -> worker stream.

The worker here is a scripted stream (a real gRPC client of WorkerGateway.Connect) that loads
whatever it is told to and then never answers invocations, so the tests decide how each call
ends: the client's deadline, or the client going away.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import insecure_channel
from gantry.common.inference_limits import DEFAULT_LIMITS as DEFAULT_INFERENCE_LIMITS
from gantry.common.status import error_info_of
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.platform.state_machines import DeploymentState
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

# The server reads what remains of a call's deadline off the wall clock, against gRPC's deadline
# kept to the millisecond: the remaining budget it propagates may read a little short.
ROUNDING_SLACK_S = 0.05


@pytest.fixture
async def serving(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        worker = ScriptedWorker()
        await worker.start(harness.channel, await harness.register_node("scripted"))
        artifact = await harness.register_model(tiny_model_dir, "tiny")
        deployment = await harness.deploy(artifact.artifact_set_id, "tiny")
        await harness.wait_deployment(
            deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=20
        )
        worker.deployment_id = deployment.deployment_id
        try:
            yield harness, worker
        finally:
            await worker.stop()


async def _queue_snapshot(harness: Harness) -> scheduler_pb2.QueueSnapshot:
    token = harness.scheduler_token
    async with insecure_channel(f"127.0.0.1:{harness.scheduler_server.port}") as channel:
        return await scheduler_pb2_grpc.SchedulerStub(channel).GetQueueSnapshot(
            scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(token)
        )


async def test_a_two_second_client_deadline_ends_in_two_seconds_and_cancels_on_the_worker(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    started = time.monotonic()
    call = harness.inference.Embed(
        inf.EmbedRequest(capability="tiny", inputs=["slow"]),
        metadata=harness.client_md,
        timeout=2.0,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    # The worker is told what remains of the client's budget, not a server default: at most the
    # 2 s (gRPC rounds the propagated timeout up a little), at least the 2 s less the time the
    # call took to reach the worker, as measured (never assumed), and a rounding slack.
    reached = time.monotonic() - started
    floor_ns = int((2.0 - reached - ROUNDING_SLACK_S) * 1e9)
    assert floor_ns <= invoke.timeout.ToNanoseconds() <= 2_100_000_000, reached
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    elapsed = time.monotonic() - started
    # Ended by its deadline (the worker never answers), and not before it.
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed > 1.5, f"the call ended after {elapsed:.1f}s"
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=5)
    assert cancel.request_id == invoke.request_id


async def test_a_client_that_goes_away_is_cancelled_on_the_worker_and_not_counted_as_infra(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.Embed(
        inf.EmbedRequest(capability="tiny", inputs=["abandoned"]), metadata=harness.client_md
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    call.cancel()
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=5)
    assert cancel.request_id == invoke.request_id
    latest: list[scheduler_pb2.QueueSnapshot] = []

    async def scheduler_heard_the_cancel() -> bool:
        latest[:] = [await _queue_snapshot(harness)]
        return latest[0].cancelled_total == 1

    await wait_for(
        scheduler_heard_the_cancel, timeout=10, what="a CANCELLED WorkFinished", last=latest
    )
    snapshot = latest[0]
    assert snapshot.infra_failures_total == 0 and snapshot.in_flight == 0
    assert all(r.infra_failures == 0 for r in snapshot.residencies)


async def test_an_unknown_capability_is_not_found(serving: tuple[Harness, ScriptedWorker]):
    harness, _ = serving
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.inference.Embed(
            inf.EmbedRequest(capability="nobody-serves-this", inputs=["x"]),
            metadata=harness.client_md,
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info_of(caught.value).reason == "NOT_FOUND"  # type: ignore[union-attr]


async def test_a_degraded_deployment_is_still_routed(serving: tuple[Harness, ScriptedWorker]):
    harness, worker = serving
    database = harness.control_plane.database
    async with database.transaction() as session:
        deployment = await deployments.get_deployment(session, worker.deployment_id)
        await deployments.set_deployment_state(
            session, deployment, DeploymentState.DEGRADED, now=dt.datetime.now(dt.UTC)
        )
    call = harness.inference.Embed(
        inf.EmbedRequest(capability="tiny", inputs=["still served"]),
        metadata=harness.client_md,
        timeout=10,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    assert invoke.deployment_id == worker.deployment_id
    call.cancel()
    assert (await asyncio.wait_for(worker.cancels.get(), timeout=5)).request_id == (
        invoke.request_id
    )


async def test_an_oversize_embed_gets_a_typed_error_and_the_worker_stream_stays_up(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    # 9 MB of text: inside the front door's bound (sized for the media calls), over the text limit.
    big = ["x" * 9000] * 1000
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.inference.Embed(
            inf.EmbedRequest(capability="tiny", inputs=big), metadata=harness.client_md
        )
    info = error_info_of(caught.value)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info is not None and info.reason == "INVALID_PAYLOAD"
    assert info.metadata["setting"] == "max_request_bytes"
    assert info.metadata["limit_bytes"] == str(8 * 1024 * 1024)
    # Past the largest legal Inference request (41 MiB with the default limits), under the
    # server's 64 MiB receive limit: refused before it is parsed.
    front_door = DEFAULT_INFERENCE_LIMITS.largest_request_bytes
    huge = ["x" * 1_000_000] * (front_door // 1_000_000 + 2)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.inference.Embed(
            inf.EmbedRequest(capability="tiny", inputs=huge), metadata=harness.client_md
        )
    info = error_info_of(caught.value)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info is not None and info.reason == "INVALID_ARGUMENT"  # refused before parsing
    assert info.metadata["limit_bytes"] == str(front_door)
    assert worker.invokes.empty() and not worker.ended.is_set()
    call = harness.inference.Embed(
        inf.EmbedRequest(capability="tiny", inputs=["small"]),
        metadata=harness.client_md,
        timeout=10,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    assert list(invoke.embed.inputs) == ["small"]
    call.cancel()


async def test_operator_requests_over_their_limits_are_refused_and_nothing_is_stored(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, _ = serving
    too_many = {f"k{i}": "v" for i in range(65)}
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.operator.RegisterNode(
            cp.RegisterNodeRequest(name="labelled", labels=too_many), metadata=harness.op_md
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info_of(caught.value).metadata["limit"] == "64"  # type: ignore[union-attr]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await harness.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="t", name="n" * 201), metadata=harness.op_md
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    nodes = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    assert "labelled" not in {n.name for n in nodes.nodes}
