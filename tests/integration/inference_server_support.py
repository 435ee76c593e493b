"""A real gantry.v1.Inference gRPC server on port 0 around an InferenceService whose collaborators
a unit test fakes: every token is tenant-a's client key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gantry.common.auth import Principal, Role
from gantry.common.grpc_server import ServiceBinding, create_server, insecure_channel
from gantry.controlplane.serving.inference_service import InferenceService
from gantry.v1 import inference_pb2_grpc


class FakeAuthenticator:
    """Every token is tenant-a's client key."""

    async def authenticate(self, role: Role, token: str) -> Principal:
        return Principal(role=role, subject="tenant-a")


@asynccontextmanager
async def serving(service: InferenceService) -> AsyncIterator[inference_pb2_grpc.InferenceStub]:
    server = await create_server(
        listen="127.0.0.1:0",
        services=[
            ServiceBinding(
                "gantry.v1.Inference", service, inference_pb2_grpc.add_InferenceServicer_to_server
            )
        ],
        authenticator=FakeAuthenticator(),
    )
    channel = insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield inference_pb2_grpc.InferenceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)
