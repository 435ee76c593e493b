"""`create_server(...)`: every Gantry server, with health, reflection and the one interceptor.

With `tls` the port is TLS (mTLS when it names a client CA). An optional `health_listen` is a
second, plaintext port that serves only grpc.health.v1, for probes that cannot speak TLS (the
kubelet's gRPC probe, an image HEALTHCHECK); it shares the main server's health states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from gantry.common.auth import Authenticator
from gantry.common.interceptors import DEFAULT_LIMITS, GantryServerInterceptor, ServiceLimit
from gantry.common.tls import ClientTls, ServerTls

# What a client channel sends and takes: embeddings for large batches exceed gRPC's 4 MiB default.
# A server's receive limit is its own (`create_server(max_receive_bytes=...)`), sized from what its
# services legally accept, so an oversize message is refused by gRPC itself (RESOURCE_EXHAUSTED)
# at that size rather than at this one.
MESSAGE_LIMIT_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_send_message_length", MESSAGE_LIMIT_BYTES),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # gRPC core (1.85) waits this long for a ping's answer, not keepalive_timeout_ms (its own
    # default is a minute): without it an unanswered ping closed the link after 80 s, not 30.
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # BDP probing answers received data with pings to size the flow-control window; on a control
    # plane receiving 1,000 workers' heartbeats it doubled gRPC's own threads' CPU (fleet bench,
    # issue 9: event_engine 4.3 % -> 2.7 % of a core off). The fixed window costs a 1.5 MB
    # response (1,024 vectors of 384 floats) about 0.4 ms on loopback (1.3-1.6 -> 1.8-2.0 ms),
    # against the seconds of the forward pass that made it.
    ("grpc.http2.bdp_probe", 0),
)
# A health-only port takes nothing but health checks (a few bytes each).
HEALTH_RECEIVE_LIMIT_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Keepalive:
    """A server's own liveness check of each peer, in gRPC's transport threads (no Python): an
    HTTP/2 ping to a connection nothing has been read from for `idle_s`, and the connection closed
    when the ping is not answered within `timeout_s`, which ends every stream on it.

    A peer whose process is frozen (SIGSTOP), whose host died without closing its sockets, or
    that a partition cut off, answers no ping: its worker stream ends within `idle_s + timeout_s`
    of the last thing it sent, however long the heartbeat interval its fleet's size gave it
    (nodes/heartbeat_pacing.py). A peer that answers pings but sends nothing (a worker whose own
    loop hangs) is still found by its missed heartbeats. Any message read resets the idle time,
    so a worker that heartbeats more often than `idle_s` is never pinged."""

    idle_s: float
    timeout_s: float

    def __post_init__(self) -> None:
        if self.idle_s <= 0 or self.timeout_s <= 0:
            raise ValueError("a keepalive's idle time and timeout must be positive")

    def options(self) -> tuple[tuple[str, Any], ...]:
        timeout_ms = round(self.timeout_s * 1000)
        return (
            ("grpc.keepalive_time_ms", round(self.idle_s * 1000)),
            ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.http2.ping_timeout_ms", timeout_ms),  # what gRPC core waits (as above)
            # gRPC stops pinging after 2 pings with no data sent between them (its default):
            # an idle worker stream would then be checked twice, never again.
            ("grpc.http2.max_pings_without_data", 0),
        )


# docs/limits.md: a silent peer's connection closed within 20 s of the last thing it sent. 13 s
# idle, not 10: a fleet of 1,000 workers beats every 12 s (nodes/heartbeat_pacing.py), and a
# ping between its beats cost the transport threads 0.4 % of a core more (fleet bench, issue 29:
# heartbeats 3.9 % over idle with 10 s against 3.0 % with 13 s; the bare gRPC server 3.0 and
# 2.5 %). 7 s to answer keeps the 20 s; the peer's transport threads answer, not its Python.
SERVER_KEEPALIVE = Keepalive(idle_s=13.0, timeout_s=7.0)


def server_options(
    max_receive_bytes: int, keepalive: Keepalive = SERVER_KEEPALIVE
) -> tuple[tuple[str, Any], ...]:
    """A server's channel arguments: `max_receive_bytes` is the largest message gRPC buffers for
    it; a larger one is refused by the transport, RESOURCE_EXHAUSTED, before any interceptor or
    handler sees it (docs/errors.md, "the transport's refusal"). `keepalive`: how it finds a
    peer that stopped answering."""
    return (
        *keepalive.options(),
        ("grpc.max_send_message_length", MESSAGE_LIMIT_BYTES),
        ("grpc.max_receive_message_length", max_receive_bytes),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        # Clients ping every 1 s while their calls are in flight (client_config.CLIENT_KEEPALIVE)
        # to find a replica that stopped answering; a ping sooner than this is a strike, and two
        # strikes end the connection (gRPC's default: 5 min).
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 500),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.bdp_probe", 0),  # as in CHANNEL_OPTIONS
    )


# A bare server (tests, the fleet bench) that takes whatever a Gantry channel may send.
SERVER_OPTIONS = server_options(MESSAGE_LIMIT_BYTES)


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
    health_server: grpc.aio.Server | None = None
    health_port: int | None = None

    async def stop(self, grace: float | None = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(grace)


class GenericHandlersOnly:
    """A server as the generated `add_*_to_server` functions see it: each service's handlers are
    added as a generic handler only, never as registered methods.

    Why: grpc.aio (1.85) accepts calls with one task per registered method, and on every call it
    accepts it waits on all of them (`asyncio.wait(..., FIRST_COMPLETED)`). The control plane's
    services register about 90 methods, so each call added and removed 90 done-callbacks: under 32
    clients cProfile put that wait at about a tenth of the control plane's Python time per Embed
    (issue 29). With generic handlers alone one task accepts every call, and the handler is found
    by service name (a lookup per service), as before registered methods existed."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service_name: str, handlers: object) -> None:
        """Not registered: the same handlers came as a generic handler just before."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


async def create_server(
    *,
    listen: str,
    services: Sequence[ServiceBinding],
    authenticator: Authenticator | None,
    tls: ServerTls | None = None,
    health_listen: str | None = None,
    limits: Mapping[str, ServiceLimit] = DEFAULT_LIMITS,
    max_receive_bytes: int = MESSAGE_LIMIT_BYTES,
    keepalive: Keepalive = SERVER_KEEPALIVE,
) -> RunningServer:
    """Bind and start a server; `listen` may use port 0 (tests), the bound port is returned.

    `limits` bounds each service's requests by size and calls in flight before a handler runs
    (interceptors.DEFAULT_LIMITS unless the service sizes its own); `max_receive_bytes` bounds any
    one message on the transport, before it is buffered whole: at least the largest message any of
    `services` legally accepts. Each service's server declares its own (the control plane's in
    app.py, the scheduler's in scheduler/server.py); the default, what a channel may send, is for
    tests' servers. `keepalive`: how the server finds a peer that stopped answering (tests
    shorten it)."""
    server = grpc.aio.server(
        interceptors=[GantryServerInterceptor(authenticator, limits=limits)],
        options=server_options(max_receive_bytes, keepalive),
    )
    health_servicer = health.aio.HealthServicer()
    generic = GenericHandlersOnly(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, generic)
    for binding in services:
        binding.add_to_server(binding.servicer, generic)
    names = [binding.full_name for binding in services]
    # The asyncio servicer, as enable_server_reflection would pick for the server itself.
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(
            [
                *names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ]
        ),
        generic,
    )
    if tls is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, tls.credentials())
    if port == 0:
        raise OSError(f"could not bind {listen}")
    health_server, health_port = None, None
    if health_listen is not None:
        health_server = grpc.aio.server(options=server_options(HEALTH_RECEIVE_LIMIT_BYTES))
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_server)
        health_port = health_server.add_insecure_port(health_listen)
        if health_port == 0:
            raise OSError(f"could not bind {health_listen}")
        await health_server.start()
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(
        server=server,
        port=port,
        health=health_servicer,
        health_server=health_server,
        health_port=health_port,
    )


def insecure_channel(address: str) -> grpc.aio.Channel:
    """Plaintext: tests and loopback. Services dial each other through `channel`."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def channel(
    address: str, tls: ClientTls | None, *, authority: str | None = None
) -> grpc.aio.Channel:
    """A channel to a Gantry service: TLS with `tls`, plaintext without. `authority`: the name
    the service goes by when `address` is one of its IPs (what TLS verifies)."""
    named = (("grpc.default_authority", authority),) if authority is not None else ()
    if tls is None:
        if not named:
            return insecure_channel(address)
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS + named)
    return grpc.aio.secure_channel(
        address, tls.credentials(), options=CHANNEL_OPTIONS + named + tls.channel_options()
    )
