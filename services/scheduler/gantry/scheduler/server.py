"""Build the scheduler's gRPC server (in-process on port 0 in tests, a process in production)."""

from __future__ import annotations

from gantry.common.clock import Clock
from gantry.common.grpc_server import RunningServer, ServiceBinding, create_server
from gantry.common.tls import ServerTls
from gantry.scheduler.auth import ServiceTokenAuthenticator
from gantry.scheduler.service import SchedulerService, SchedulerSettings
from gantry.v1 import scheduler_pb2_grpc


async def start_scheduler(
    *,
    listen: str,
    service_token: str,
    settings: SchedulerSettings | None = None,
    tls: ServerTls | None = None,
    health_listen: str | None = None,
    clock: Clock | None = None,
) -> tuple[RunningServer, SchedulerService]:
    service = SchedulerService(settings, clock=clock)
    server = await create_server(
        listen=listen,
        services=[
            ServiceBinding(
                "gantry.v1.Scheduler", service, scheduler_pb2_grpc.add_SchedulerServicer_to_server
            )
        ],
        authenticator=ServiceTokenAuthenticator(service_token),
        tls=tls,
        health_listen=health_listen,
    )
    return server, service
