"""`create_server(...)`: every Gantry server, with health, reflection and the one interceptor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gantry.common.auth import Authenticator
from gantry.common.interceptors import GantryServerInterceptor

# Generous limits: embeddings for large batches exceed gRPC's 4 MiB default.
MESSAGE_LIMIT_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MESSAGE_LIMIT_BYTES),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MESSAGE_LIMIT_BYTES),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
)


@dataclass(frozen=True, slots=True)
class ServiceBinding:
    """One servicer and the generated function that registers it."""

    full_name: str  # e.g. "gantry.v1.ControlPlane"
    servicer: object
    add_to_server: Callable[[Any, grpc.aio.Server], None]


@dataclass(slots=True)
class RunningServer:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer

    async def stop(self, grace: float | None = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def create_server(
    *,
    listen: str,
    services: Sequence[ServiceBinding],
    authenticator: Authenticator | None,
) -> RunningServer:
    """Bind and start a server; `listen` may use port 0 (tests), the bound port is returned."""
    server = grpc.aio.server(
        interceptors=[GantryServerInterceptor(authenticator)], options=SERVER_OPTIONS
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for binding in services:
        binding.add_to_server(binding.servicer, server)
    names = [binding.full_name for binding in services]
    reflection.enable_server_reflection(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"could not bind {listen}")
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server=server, port=port, health=health_servicer)


def insecure_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
