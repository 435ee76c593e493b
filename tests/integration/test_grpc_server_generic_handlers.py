"""Every Gantry server adds its services' handlers as generic handlers only, never as grpc.aio's
registered methods (gantry.common.grpc_server.GenericHandlersOnly): grpc.aio accepts calls with
one task per registered method and waits on all of them for every call it accepts, which cost the
control plane's ~90 methods a tenth of its Python time per Embed (issue 29)."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gantry.common.grpc_server import ServiceBinding, create_server, insecure_channel
from gantry.v1 import inference_pb2_grpc


def _accepting_tasks() -> dict[str, int]:
    """grpc.aio's tasks that wait for calls to accept, by their coroutine's name."""
    counts: dict[str, int] = {}
    for task in asyncio.all_tasks():
        name = getattr(task.get_coro(), "__qualname__", "")
        if name.startswith("AioServer._request"):
            counts[name] = counts.get(name, 0) + 1
    return counts


async def test_a_server_accepts_calls_with_one_task_and_still_serves_by_service() -> None:
    servicer = inference_pb2_grpc.InferenceServicer()  # every method UNIMPLEMENTED
    binding = ServiceBinding(
        "gantry.v1.Inference", servicer, inference_pb2_grpc.add_InferenceServicer_to_server
    )
    server = await create_server(listen="127.0.0.1:0", services=[binding], authenticator=None)
    try:
        address = f"127.0.0.1:{server.port}"
        async with insecure_channel(address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="gantry.v1.Inference"), timeout=10
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            # Reflection, the asyncio servicer, lists the service.
            stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
            async for answer in stream:
                names = {s.name for s in answer.list_services_response.service}
                assert "gantry.v1.Inference" in names
                break
        # The Inference service's ~20 methods, health's and reflection's: none registered, so
        # one task accepts every call (with them registered there was one per method).
        assert _accepting_tasks() == {"AioServer._request_call": 1}
    finally:
        await server.stop(grace=0.2)
