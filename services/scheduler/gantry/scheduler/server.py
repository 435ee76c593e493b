"""Build the scheduler's gRPC server (in-process on port 0 in tests, a process in production)."""

from __future__ import annotations

from gantry.common.clock import Clock
from gantry.common.grpc_server import RunningServer, ServiceBinding, create_server
from gantry.common.tls import ServerTls
from gantry.scheduler.auth import ServiceTokenAuthenticator
from gantry.scheduler.service import SchedulerService, SchedulerSettings
from gantry.v1 import scheduler_pb2_grpc

# The scheduler's gRPC receive limit. Its one client is the control plane, and its largest message
# is the state snapshot the control plane sends on (re)connect: every node, residency, deployment
# and tenant policy, a few hundred bytes each, so a fleet of tens of thousands of nodes fits.
SCHEDULER_RECEIVE_LIMIT_BYTES = 16 * 1024 * 1024


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
        max_receive_bytes=SCHEDULER_RECEIVE_LIMIT_BYTES,
    )
    return server, service
