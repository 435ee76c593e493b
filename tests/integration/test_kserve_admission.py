"""ModelInfer goes through the scheduler's admission as gantry.v1.Inference.Embed does: one code
path below the protocol adapter, so a tenant's queue depth binds on every front door. A scripted
worker holds each invocation until the test answers it, so the test sees which call is dispatched,
which waits and which is refused; and the call is counted by protocol."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.status import error_info_of
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry
from tests.integration.metrics_scrape import metrics_port, scrape
from tests.integration.scripted_worker import SILENT_WORKER, ScriptedWorker, serving_tiny

TENANT = "tenant-a"  # the harness's client key belongs to it


@pytest.fixture
async def serving(
    database_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root, reconciler=SILENT_WORKER) as harness:
        async with serving_tiny(harness, tiny_model_dir, max_concurrency=1) as worker:
            yield harness, worker


def _infer(harness: Harness, text: str, **fields: object) -> asyncio.Future:
    stub = kserve_grpc.GRPCInferenceServiceStub(harness.channel)
    request = kserve.ModelInferRequest(
        model_name="tiny",
        inputs=[
            kserve.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[1])
        ],
        raw_input_contents=[struct.pack("<I", len(text)) + text.encode()],
    )
    return asyncio.ensure_future(
        stub.ModelInfer(request, metadata=harness.client_md, timeout=20, **fields)  # type: ignore[arg-type]
    )


async def test_a_flood_past_the_tenants_queue_depth_is_queue_full_on_modelinfer(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    port = metrics_port()
    before = await scrape(port)
    await harness.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(
            policy=common_pb2.TenantPolicy(tenant_id=TENANT, max_queue_depth=1)
        ),
        metadata=harness.op_md,
    )
    running = _infer(harness, "first")
    held = await asyncio.wait_for(worker.invokes.get(), timeout=5)  # the one slot is taken
    waiting = _infer(harness, "second")
    await harness.wait_queued(TENANT, 1)  # the second waits in the queue (depth 1) first
    # Every later one is refused at once.
    flood = [_infer(harness, f"flood {i}") for i in range(5)]
    refusals = []
    for call in flood:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        info = error_info_of(caught.value)
        refusals.append((caught.value.code(), info.reason if info else ""))
    assert refusals == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL")] * 5
    worker.answer_embed(held)
    worker.answer_embed(await asyncio.wait_for(worker.invokes.get(), timeout=5))
    for call in (running, waiting):
        response = await call
        assert struct.unpack("<f", response.raw_output_contents[0]) == (1.0,)
        assert list(response.outputs[0].shape) == [1, 1]

    after = await scrape(port)
    door = "gantry_front_door_calls_total"
    labels = {"protocol": "kserve_v2", "method": "ModelInfer"}
    assert after.value(door, code="OK", **labels) - before.value(door, code="OK", **labels) == 2
    full = {"code": "RESOURCE_EXHAUSTED", "reason": "QUEUE_FULL", **labels}
    assert after.value(door, **full) - before.value(door, **full) == 5
    # The same calls counted as the Inference operation they became: one path below the door.
    embeds = {"operation": "Embed", "reason": "QUEUE_FULL"}
    calls = "gantry_invocations_total"
    assert after.value(calls, **embeds) - before.value(calls, **embeds) == 5
