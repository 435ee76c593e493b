"""The HTTP listener: uvicorn serving the OpenAI routes (and the Open Inference Protocol's REST
routes, kserve_routes.py) in the control plane's own event loop, beside its gRPC server, started
and stopped with it.

The socket is bound here before uvicorn starts, so a taken port fails the control plane's start at
once with one line (HttpListenError), and port 0 reports the port it got. uvicorn's signal
handling is left out: the control plane owns SIGINT/SIGTERM and stops this listener itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field

import uvicorn

from gantry.common.auth import Authenticator
from gantry.common.tls import ServerTls
from gantry.controlplane.platform.database import Database
from gantry.controlplane.serving.kserve.service import KServeInference
from gantry.controlplane.serving.openai_http.connections import (
    DoorBounds,
    DoorCounters,
    bounded_protocol,
    connection_cap,
    raise_descriptor_limit,
)
from gantry.controlplane.serving.openai_http.front_door import InFlight
from gantry.controlplane.serving.openai_http.routes import OpenAiRoutes
from gantry.v1 import inference_pb2_grpc

log = logging.getLogger(__name__)
# How long a stop waits for calls in flight (a stream included) before cancelling them.
SHUTDOWN_GRACE_S = 2
STOP_TIMEOUT_S = SHUTDOWN_GRACE_S + 5.0


class HttpListenError(Exception):
    """The HTTP API cannot listen where it was told to (taken, not an address): an operator's
    setting, reported in one line."""


@dataclass(frozen=True, kw_only=True)
class HttpApiSettings:
    listen: str  # HOST:PORT; port 0 picks a free one
    max_body_bytes: int
    max_in_flight: int  # per tenant: one tenant's calls never use up another's
    tls: ServerTls | None = None  # the control plane's own certificate (and client CA: mTLS)
    bounds: DoorBounds = field(default_factory=DoorBounds)  # connections, header/body timeouts


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise HttpListenError(f"the HTTP listen address {listen!r} is not HOST:PORT")
    return host, int(port)


def _bind(listen: str) -> socket.socket:
    host, port = parse_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
    # and without it a response written as head then body waits out the client's delayed ACK
    # (40 ms a call on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
        return sock
    except OSError as exc:
        sock.close()
        raise HttpListenError(
            f"the OpenAI HTTP API cannot listen on {listen}: {exc.strerror or exc}"
        ) from None


class _EmbeddedServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, handshake_timeout_s: float) -> None:
        super().__init__(config)
        self._handshake_timeout_s = handshake_timeout_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the control plane's signals are its own; it calls stop()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, with a TLS handshake bounded like a request's headers.

        The door's protocol (its cap, its header timer) first sees a TLS connection once the
        handshake is done; until then asyncio alone holds it, for 60 s by default. A client that
        opens connections and never says hello is closed within the header timeout instead.
        uvicorn does not pass the handshake timeout on, so its `create_server` call gets it here.
        """
        if self.config.ssl is None:
            await super().startup(sockets)
            return
        loop = asyncio.get_running_loop()
        loop.create_server = functools.partial(  # type: ignore[method-assign]
            loop.create_server, ssl_handshake_timeout=self._handshake_timeout_s
        )
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server  # the loop's own method again


class HttpApi:
    """One running listener; `stop` is idempotent."""

    def __init__(
        self,
        server: _EmbeddedServer,
        sock: socket.socket,
        *,
        max_connections: int,
        counters: DoorCounters,
        in_flight: InFlight,
    ) -> None:
        self._server = server
        self._socket = sock
        self.port: int = sock.getsockname()[1]
        self.max_connections = max_connections
        self.counters = counters  # connections shed at the cap, closed at the header timeout
        self.in_flight = in_flight  # calls running, per tenant
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="openai-http")
        self._task.add_done_callback(_report_exit)

    def open_connections(self) -> int:
        """Connections the door holds now (shed ones never count)."""
        return len(self._server.server_state.connections)

    async def stop(self) -> None:
        if self._task.done():
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_TIMEOUT_S)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            self._socket.close()


def _report_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the OpenAI HTTP API stopped serving", exc_info=task.exception())


def _config(
    routes: OpenAiRoutes, tls: ServerTls | None, protocol: type[asyncio.Protocol]
) -> uvicorn.Config:
    ssl_settings: dict[str, object] = {}
    if tls is not None:
        ssl_settings = {
            "ssl_certfile": str(tls.cert_chain_file),
            "ssl_keyfile": str(tls.private_key_file),
        }
        if tls.client_ca_file is not None:
            ssl_settings |= {
                "ssl_ca_certs": str(tls.client_ca_file),
                "ssl_cert_reqs": ssl.CERT_REQUIRED,
            }
    config = uvicorn.Config(
        routes.app(),
        http=protocol,  # uvicorn's h11 protocol with the door's connection bounds
        ws="none",
        lifespan="off",
        log_config=None,  # the control plane's logging, not uvicorn's own
        access_log=False,  # every call is counted and traced instead (routes.py)
        server_header=False,
        proxy_headers=False,  # a caller is its socket; nothing in front of it is trusted
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        **ssl_settings,  # type: ignore[arg-type]
    )
    config.load()  # a bad certificate fails the start here, not inside the serving task
    return config


async def start_http_api(
    settings: HttpApiSettings,
    *,
    inference: inference_pb2_grpc.InferenceServicer,
    authenticator: Authenticator,
    database: Database,
    kserve: KServeInference | None = None,
) -> HttpApi:
    """The listener; with `kserve`, the Open Inference Protocol's REST routes (/v2) beside the
    OpenAI ones, answered by the adapter that answers its gRPC calls."""
    routes = OpenAiRoutes(
        kserve=kserve,
        inference=inference,
        authenticator=authenticator,
        database=database,
        max_body_bytes=settings.max_body_bytes,
        max_in_flight=settings.max_in_flight,
        body_timeout_s=settings.bounds.body_timeout_s,
    )
    max_connections = connection_cap(settings.bounds.max_connections, raise_descriptor_limit())
    counters = DoorCounters()
    protocol = bounded_protocol(
        max_connections=max_connections,
        header_timeout_s=settings.bounds.header_timeout_s,
        counters=counters,
        linger_bytes=settings.max_body_bytes,
        linger_s=settings.bounds.body_timeout_s,
    )
    try:
        config = _config(routes, settings.tls, protocol)
    except (OSError, ssl.SSLError) as exc:
        raise HttpListenError(f"the OpenAI HTTP API cannot load its TLS files: {exc}") from None
    sock = _bind(settings.listen)
    api = HttpApi(
        _EmbeddedServer(config, handshake_timeout_s=settings.bounds.header_timeout_s),
        sock,
        max_connections=max_connections,
        counters=counters,
        in_flight=routes.in_flight,
    )
    log.info(
        "OpenAI-compatible HTTP API listening on %s:%d (%s; at most %d connections, %gs to send "
        "headers)",
        parse_listen(settings.listen)[0],
        api.port,
        "TLS" if settings.tls else "plaintext",
        max_connections,
        settings.bounds.header_timeout_s,
    )
    return api
