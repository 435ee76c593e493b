"""Composes the control plane: database, scheduler link, worker hub, and its gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gantry.common import tokens
from gantry.common.clock import Clock, SystemClock
from gantry.common.grpc_server import (
    SERVER_KEEPALIVE,
    Keepalive,
    RunningServer,
    ServiceBinding,
    create_server,
)
from gantry.common.interceptors import DEFAULT_LIMITS, ServiceLimit
from gantry.common.tls import ClientTls, ServerTls
from gantry.controlplane.deployments.autoscaler import ScaleAdviceInbox
from gantry.controlplane.deployments.lifecycle import DEFAULT_LEASE_SECONDS, DeploymentLifecycle
from gantry.controlplane.deployments.reconciler import Reconciler, ReconcilerSettings
from gantry.controlplane.deployments.settle import settle_node_deployments
from gantry.controlplane.endpoints.adoption import own_listeners
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.evidence.pipeline import EvidencePipeline
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.admin import NodeAdmin
from gantry.controlplane.nodes.gateway import GatewaySettings, WorkerGatewayService
from gantry.controlplane.nodes.liveness import Liveness
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.nodes.wire_bounds import worker_receive_limit_bytes
from gantry.controlplane.observability.audit_feed import AuditFeed
from gantry.controlplane.platform import credentials
from gantry.controlplane.platform.announcer import Announcer
from gantry.controlplane.platform.authn import ControlPlaneAuthenticator
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import (
    AuditWritten,
    BindingMoved,
    CapabilityBound,
    CapacityFreed,
    ChargesLearned,
    DeploymentChanged,
    EventBus,
    NodeChanged,
    ReconcileWanted,
    ResidenciesChanged,
)
from gantry.controlplane.platform.leadership import (
    DEFAULT_LEADER_LEASE_SECONDS,
    Leadership,
    replica_name,
)
from gantry.controlplane.platform.operator_service import ControlPlaneService
from gantry.controlplane.platform.scheduler_assignment import SchedulerAssignment
from gantry.controlplane.platform.scheduler_assignment_rules import parse_addresses
from gantry.controlplane.platform.scheduler_link import (
    DEFAULT_FAILOVER_HOLD_SECONDS,
    SchedulerLink,
)
from gantry.controlplane.platform.scheduler_silence import DEFAULT_SILENCE_TIMEOUT_SECONDS
from gantry.controlplane.serving.inference_service import InferenceService, InferenceSettings
from gantry.controlplane.serving.kserve.service import KServeInference
from gantry.controlplane.serving.openai_http import (
    DoorBounds,
    HttpApi,
    HttpApiSettings,
    start_http_api,
)
from gantry.controlplane.serving.openai_http.front_door import give_back
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import DeploymentResolver
from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc
from gantry.v1 import control_plane_pb2_grpc, inference_pb2_grpc, worker_gateway_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ControlPlaneSettings:
    listen: str
    database_url: str
    # HOST:PORT, or several comma-separated: one active at a time, named by the leader in the
    # scheduler_assignment row and followed by every replica (platform/scheduler_assignment.py).
    scheduler_address: str
    scheduler_token: str
    bootstrap_operator_token: str | None = None
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    # Replicas on one PostgreSQL database elect one decider (platform/leadership.py): a leader
    # silent this long loses the lock (PostgreSQL ends its session) and a follower takes it.
    leader_lease_seconds: float = DEFAULT_LEADER_LEASE_SECONDS
    # A scheduler silent this long (no health ping answered) counts as unavailable.
    scheduler_silence_timeout_s: float = DEFAULT_SILENCE_TIMEOUT_SECONDS
    # With several schedulers: how long a call waits for the link to be back (failing over)
    # before it is refused SCHEDULER_UNAVAILABLE (never past its own deadline).
    scheduler_failover_hold_s: float = DEFAULT_FAILOVER_HOLD_SECONDS
    tls: ServerTls | None = None  # the one port (ControlPlane, Inference, WorkerGateway)
    # How the port finds a peer that stopped answering (a frozen or cut-off worker among them),
    # whatever heartbeat interval the fleet's size gave it (tests shorten it).
    keepalive: Keepalive = SERVER_KEEPALIVE
    health_listen: str | None = None  # plaintext health-only port for probes that lack TLS
    scheduler_tls: ClientTls | None = None  # the link to the scheduler
    # The bounds on each Embed/Rerank call (flags --max-inputs ...) and the server's deadline cap.
    inference: InferenceSettings = field(default_factory=InferenceSettings)
    # Tests that drive time by hand run the reconciler's passes themselves.
    run_reconciler: bool = True
    # The key that seals adopted endpoints' credentials (minted 0600 on first use). None: a key
    # held in memory only, so sealed credentials do not outlive this process (in-process tests).
    endpoint_key_file: Path | None = None
    # HOST:PORT of the OpenAI-compatible HTTP API (openai_http/); None serves none.
    http_listen: str | None = None
    # Its connection cap and header/body timeouts (openai_http/connections.py says why).
    http_bounds: DoorBounds = field(default_factory=DoorBounds)


@dataclass(kw_only=True)
class ControlPlane:
    server: RunningServer
    database: Database
    scheduler: SchedulerLink
    hub: WorkerHub
    lifecycle: DeploymentLifecycle
    reconciler: Reconciler
    gateway: WorkerGatewayService
    liveness: Liveness  # when each worker stream here was last heard (last_seen_at lags it)
    audit_feed: AuditFeed  # wakes WatchAuditEvents (subscribed to the commits' events)
    http_api: HttpApi | None = None  # the OpenAI-compatible HTTP API, when one listens
    give_back: asyncio.Task[None] | None = None  # returns freed memory (MemoryWatch)
    resolver: DeploymentResolver | None = None  # its route refreshes end before the database
    # Its client-key reads end before the database, as the route refreshes do.
    authenticator: ControlPlaneAuthenticator | None = None
    # Which of several schedulers the link follows; None with one scheduler address.
    scheduler_assignment: SchedulerAssignment | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def replica_id(self) -> str:
        """This process among the replicas (its `node_streams` rows), fresh at each start."""
        return self.hub.replica_id

    @property
    def leadership(self) -> Leadership:
        """Whether this replica decides (placement, the reconciler)."""
        return self.lifecycle.leadership

    async def stop(self) -> None:
        if self.give_back is not None:
            self.give_back.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.give_back
        if self.http_api is not None:
            await self.http_api.stop()  # no new HTTP calls; those in flight end first
        await self.reconciler.stop()
        # Deciding has stopped: the lock goes back at once, so a follower leads within lease/3.
        await self.leadership.stop()
        await self.server.stop(grace=1.0)
        if self.resolver is not None:
            await self.resolver.close()
        if self.authenticator is not None:
            await self.authenticator.close()
        await self.gateway.close()  # the streams' last writes, before the database goes
        if self.scheduler_assignment is not None:
            await self.scheduler_assignment.stop()
        await self.scheduler.stop()
        await self.database.close()


# How often the control plane looks at its RSS, and how far past the last settled level it must
# have grown for freed memory to be given back (MemoryWatch). A look is one read of
# /proc/self/statm. Every second, not every 5 s: the level follows the RSS down only when it is
# looked at, and the RSS read right after a trim can sit above where it settles next (the likely
# cause, not reproduced, of a hostile test's one failure in issue 29); a burst arriving before the
# next look is measured against that higher level and can stay under the trigger for good.
MEMORY_CHECK_S = 1.0
MEMORY_GROWTH_BYTES = 64 * 1024 * 1024


@dataclass
class MemoryWatch:
    """When to give freed memory back to the system: once the RSS has grown MEMORY_GROWTH_BYTES
    past where it last settled. Pure: `observe` is told the RSS and says whether to give back.

    A large gRPC request (a legal 40 MB Embed, refused or answered) leaves its bytes held by a
    reference cycle until the collector's next full pass and, once freed, in glibc's arenas: 16 of
    them left the control plane at 1 GB for good (issue 26, item 4). A large HTTP body is given
    back when its call ends (openai_http.front_door.give_back); this catches the rest.
    """

    settled: int
    growth: int = MEMORY_GROWTH_BYTES

    def observe(self, rss: int) -> bool:
        if rss - self.settled >= self.growth:
            return True
        self.settled = min(self.settled, rss)  # it shrank by itself: the new level
        return False

    def given_back(self, rss: int) -> None:
        self.settled = rss  # what is left is in use: the level to grow from


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None  # not Linux: glibc's arenas are not the allocator there either


async def watch_memory(check_s: float = MEMORY_CHECK_S) -> None:
    """MemoryWatch applied: every `check_s`, a collection and malloc_trim when it says so."""
    rss = _rss_bytes()
    if rss is None:
        return
    watch = MemoryWatch(settled=rss)
    while True:
        await asyncio.sleep(check_s)
        rss = _rss_bytes() or 0
        if watch.observe(rss):
            give_back()
            watch.given_back(_rss_bytes() or rss)


INFERENCE_PREFIX = "/gantry.v1.Inference/"
KSERVE_PREFIX = "/inference.GRPCInferenceService/"  # the Open Inference Protocol, as Inference


def front_door_limits(inference: InferenceSettings) -> dict[str, ServiceLimit]:
    """The per-service request bounds, Inference's sized to the largest call its limits allow.

    The front door refuses an oversize request before parsing it; sized below the media limits it
    would refuse a legal image or clip with a bare size error instead of the setting that binds.
    """
    default = DEFAULT_LIMITS[INFERENCE_PREFIX]
    largest = max(default.max_request_bytes or 0, inference.limits.largest_request_bytes)
    inference_limit = ServiceLimit(max_request_bytes=largest, max_in_flight=default.max_in_flight)
    return {**DEFAULT_LIMITS, INFERENCE_PREFIX: inference_limit, KSERVE_PREFIX: inference_limit}


# How far past the largest legal message a message is still received and refused by the front
# door with a typed INVALID_ARGUMENT (ErrorInfo naming the limit): a client that overshoots by a
# little learns which limit it hit. Past it, gRPC's own RESOURCE_EXHAUSTED, without ErrorInfo.
TYPED_REFUSAL_MARGIN_BYTES = 8 * 1024 * 1024


def receive_limit_bytes(inference: InferenceSettings, limits: Mapping[str, ServiceLimit]) -> int:
    """The control plane's gRPC receive limit: the largest message any of its doors legally takes,
    plus TYPED_REFUSAL_MARGIN_BYTES.

    Inference and KServe take their largest legal request, WorkerGateway its largest legal result
    (wire_bounds), and each service at least what its front-door bound (`limits`) answers with a
    typed refusal. A message past this is refused by gRPC itself before it is buffered whole.
    """
    typed = max((limit.max_request_bytes or 0 for limit in limits.values()), default=0)
    largest = inference.limits.largest_request_bytes
    legal = max(typed, largest, worker_receive_limit_bytes(inference.limits))
    return legal + TYPED_REFUSAL_MARGIN_BYTES


async def bootstrap_operator_token(database: Database, token: str, clock: Clock) -> None:
    """Adopt the first operator token (minted by `gantry up`) when the database holds none."""
    if tokens.parse_token(token, kind=tokens.OPERATOR_TOKEN) is None:
        raise ValueError("the bootstrap operator token is malformed")
    async with database.transaction() as session:
        if await credentials.count_operator_tokens(session) == 0:
            await credentials.store_operator_token(session, token, now=clock.now())
            log.info("stored the bootstrap operator token (hashed)")


async def open_database(settings: ControlPlaneSettings, clock: Clock) -> Database:
    """Connect and adopt the bootstrap token."""
    database = Database.connect(settings.database_url)
    await database.require_initialised()  # `gantry migrate` creates and upgrades the schema
    if settings.bootstrap_operator_token:
        await bootstrap_operator_token(database, settings.bootstrap_operator_token, clock)
    return database


async def forget_streams(
    database: Database, clock: Clock, leadership: Leadership, hub: WorkerHub
) -> None:
    """Mark every node disconnected until its worker returns, before this replica serves, but
    those whose stream another replica holds (a fresh `node_streams` row of their generation).

    Only a replica that leads at its start does (fenced): one that starts beside a leader
    leaves the nodes alone, as their workers may be connected to the leader. One that could not
    take the lock yet (an old session of its own still holds it) leaves them too: once it leads,
    its reconciler disconnects those whose heartbeats stopped."""
    if not leadership.is_leader:
        return
    with leadership.fenced():
        async with database.transaction() as session:
            held = await nodes.held_by_others(
                session, replica_id=hub.replica_id, heard_since=hub.held_since(clock.now())
            )
            stale = await nodes.disconnect_all(session, now=clock.now(), held=held)
            # READY read back from the database describes streams that are gone: until the
            # workers reconnect (and their residents are adopted) those deployments are
            # DEGRADED, not READY.
            for node in await nodes.list_nodes(session, after="", limit=1_000_000):
                await settle_node_deployments(session, node.node_id, now=clock.now())
    if stale:
        log.info("marked %d node(s) disconnected until their workers reconnect", stale)


def _sealer(settings: ControlPlaneSettings) -> CredentialSealer | None:
    """The endpoint key file's sealer; None: a key held in memory only (the lifecycle's)."""
    if settings.endpoint_key_file is None:
        return None
    return CredentialSealer.from_key_file(settings.endpoint_key_file)


async def _open_and_lead(
    settings: ControlPlaneSettings, clock: Clock, hub: WorkerHub
) -> tuple[Database, Leadership]:
    """The database, and this replica's leadership looked at once: a lone replica leads before
    it serves or decides anything, and only a leader forgets the streams of before."""
    database = await open_database(settings, clock)
    leadership = Leadership.for_database(
        database, url=settings.database_url, lease_s=settings.leader_lease_seconds
    )
    await leadership.start()
    await forget_streams(database, clock, leadership, hub)
    return database, leadership


def _worker_hub(settings: ControlPlaneSettings) -> WorkerHub:
    """This replica's worker streams, named by a fresh replica id (its `node_streams` rows):
    another replica's row counts as a live stream for the reconciler's staleness grace."""
    return WorkerHub(replica_id=replica_name(), grace=settings.reconciler.grace)


async def _stop_unstarted(
    server: RunningServer, leadership: Leadership, database: Database
) -> None:
    """What a start that failed half-way had opened, closed."""
    await server.stop(grace=0)
    await leadership.stop()
    await database.close()


@dataclass(kw_only=True)
class _Core:
    """The pieces every service shares: the worker hub, the scheduler link, the lifecycle."""

    hub: WorkerHub
    scheduler: SchedulerLink
    routes: RouteCache
    audit_feed: AuditFeed
    lifecycle: DeploymentLifecycle
    liveness: Liveness
    reconciler: Reconciler
    assignment: SchedulerAssignment | None  # several scheduler addresses: which one is active

    async def start(self, *, run_reconciler: bool) -> None:
        """The link (one scheduler: to it; several: to the one the assignment names), then the
        reconciler unless the test drives it."""
        if self.assignment is None:
            self.scheduler.start()
        else:
            await self.assignment.start()
        if run_reconciler:
            self.reconciler.start()


def subscribe(
    bus: EventBus,
    *,
    announcer: Announcer,
    routes: RouteCache,
    reconciler: Reconciler,
    audit_feed: AuditFeed,
) -> None:
    """Who hears of each committed domain event (platform/events.py): the one place it is said."""
    # A binding that moves is never served stale: no cached route from before its commit until
    # after it.
    bus.bracket(BindingMoved, before=routes.routing_changing, after=routes.routing_changed)
    bus.subscribe(CapabilityBound, lambda _: announcer.deployments_changed())
    # The scheduler hears of what changed, with the charges it was told first; each of these
    # also forgets cached routes.
    bus.subscribe(ChargesLearned, lambda event: announcer.learn_charges(event.charges))
    bus.subscribe(ResidenciesChanged, lambda event: announcer.residencies(event.residencies))
    bus.subscribe(NodeChanged, lambda event: announcer.node(event.node, event.connected))
    bus.subscribe(
        DeploymentChanged,
        lambda event: announcer.deployment(event.deployment, removed=event.removed),
    )
    # Refused placements are due again at once; a ReclaimResidency waiting for a residency to go
    # COLD wakes with the audit feed's waiters.
    bus.subscribe(CapacityFreed, lambda _: reconciler.capacity_freed())
    bus.subscribe(CapacityFreed, lambda _: audit_feed.changed())
    bus.subscribe(ReconcileWanted, lambda _: reconciler.wake())
    bus.subscribe(AuditWritten, lambda _: audit_feed.audit_committed())  # WatchAuditEvents


def _scheduler_link(
    settings: ControlPlaneSettings,
    database: Database,
    clock: Clock,
    leadership: Leadership,
    lifecycle_holder: list[DeploymentLifecycle],  # filled once the lifecycle exists
    scale_advice: ScaleAdviceInbox,
) -> tuple[SchedulerLink, SchedulerAssignment | None]:
    """The link to the scheduler; with several addresses, the assignment it follows."""

    async def cluster_state():  # type: ignore[no-untyped-def]
        return await lifecycle_holder[0].cluster_state()

    addresses = parse_addresses(settings.scheduler_address)
    several = len(addresses) > 1
    link = SchedulerLink(
        address=addresses[0],  # with several, the assignment names the one to follow
        service_token=settings.scheduler_token,
        cluster_state=cluster_state,
        tls=settings.scheduler_tls,
        on_scale_advice=scale_advice.offer,
        silence_timeout_seconds=settings.scheduler_silence_timeout_s,
        failover_hold_s=settings.scheduler_failover_hold_s if several else 0.0,
    )
    if not several:
        return link, None
    assignment = SchedulerAssignment(
        addresses=addresses,
        database=database,
        leadership=leadership,
        link=link,
        clock=clock,
        silence_timeout_s=settings.scheduler_silence_timeout_s,
        tls=settings.scheduler_tls,
    )
    return link, assignment


def _build_core(
    settings: ControlPlaneSettings,
    database: Database,
    clock: Clock,
    leadership: Leadership,
    hub: WorkerHub,
) -> _Core:
    lifecycle_holder: list[DeploymentLifecycle] = []
    scale_advice = ScaleAdviceInbox()  # the link fills it, the reconciler acts on it
    scheduler, assignment = _scheduler_link(
        settings, database, clock, leadership, lifecycle_holder, scale_advice
    )
    routes = RouteCache(clock)
    audit_feed = AuditFeed()
    lifecycle = DeploymentLifecycle(
        database=database,
        hub=hub,
        scheduler=scheduler,
        routes=routes,
        clock=clock,
        lease_seconds=settings.lease_seconds,
        sealer=_sealer(settings),
        leadership=leadership,
    )
    lifecycle_holder.append(lifecycle)
    # Heartbeats land here (the gateway); the reconciler decides staleness from it and flushes
    # `last_seen_at` to the database once per heartbeat interval.
    liveness = Liveness(
        flush_interval_s=settings.reconciler.heartbeat_interval_s, replica_id=hub.replica_id
    )
    reconciler = Reconciler(
        database=database,
        hub=hub,
        lifecycle=lifecycle,
        clock=clock,
        settings=settings.reconciler,
        liveness=liveness,
        scale_advice=scale_advice,
    )
    subscribe(
        database.events,
        announcer=lifecycle.announcer,
        routes=routes,
        reconciler=reconciler,
        audit_feed=audit_feed,
    )
    return _Core(
        hub=hub,
        scheduler=scheduler,
        routes=routes,
        audit_feed=audit_feed,
        lifecycle=lifecycle,
        liveness=liveness,
        reconciler=reconciler,
        assignment=assignment,
    )


def _worker_gateway(
    settings: ControlPlaneSettings, core: _Core, database: Database, clock: Clock
) -> WorkerGatewayService:
    return WorkerGatewayService(
        database=database,
        hub=core.hub,
        lifecycle=core.lifecycle,
        clock=clock,
        settings=GatewaySettings(
            heartbeat_interval_s=settings.reconciler.heartbeat_interval_s,
            max_heartbeats_per_s=settings.reconciler.max_heartbeats_per_s,
        ),
        liveness=core.liveness,
    )


def _control_plane_service(
    core: _Core,
    database: Database,
    clock: Clock,
    authenticator: ControlPlaneAuthenticator,
) -> ControlPlaneService:
    hub, lifecycle, reconciler = core.hub, core.lifecycle, core.reconciler
    node_admin = NodeAdmin(database=database, hub=hub, lifecycle=lifecycle, clock=clock)
    pipeline = EvidencePipeline(database=database, hub=hub, lifecycle=lifecycle, clock=clock)
    return ControlPlaneService(
        database=database,
        lifecycle=lifecycle,
        node_admin=node_admin,
        authenticator=authenticator,
        clock=clock,
        pipeline=pipeline,
        scheduler=core.scheduler,
        hub=hub,
        audit_feed=core.audit_feed,
        degradation=reconciler.degradation,
    )


def _service_bindings(
    *,
    control_plane: ControlPlaneService,
    inference: InferenceService,
    kserve: KServeInference,
    gateway: WorkerGatewayService,
) -> list[ServiceBinding]:
    return [
        ServiceBinding(
            "gantry.v1.ControlPlane",
            control_plane,
            control_plane_pb2_grpc.add_ControlPlaneServicer_to_server,
        ),
        ServiceBinding(
            "gantry.v1.Inference", inference, inference_pb2_grpc.add_InferenceServicer_to_server
        ),
        # The Open Inference Protocol (KServe v2 / Triton) over the same handlers.
        ServiceBinding(
            "inference.GRPCInferenceService",
            kserve,
            kserve_grpc.add_GRPCInferenceServiceServicer_to_server,
        ),
        ServiceBinding(
            "gantry.v1.WorkerGateway",
            gateway,
            worker_gateway_pb2_grpc.add_WorkerGatewayServicer_to_server,
        ),
    ]


async def _start_http_api(
    settings: ControlPlaneSettings,
    *,
    inference: InferenceService,
    authenticator: ControlPlaneAuthenticator,
    database: Database,
    kserve: KServeInference,
) -> HttpApi | None:
    if not settings.http_listen:
        return None
    # Bounded as the gRPC Inference door is: the same request size, the same calls in flight.
    bound = front_door_limits(settings.inference)[INFERENCE_PREFIX]
    return await start_http_api(
        HttpApiSettings(
            listen=settings.http_listen,
            max_body_bytes=bound.max_request_bytes or 0,
            max_in_flight=bound.max_in_flight,  # per tenant
            tls=settings.tls,
            bounds=settings.http_bounds,
        ),
        inference=inference,
        authenticator=authenticator,
        database=database,
        kserve=kserve,  # the Open Inference Protocol's REST routes, by the gRPC door's adapter
    )


def _refuse_adopting_ourselves(
    service: ControlPlaneService, server: RunningServer, http_api: HttpApi | None
) -> None:
    """AdoptEndpoint refuses our own bound ports: a worker calling our front door is a loop."""
    service.listening_on(
        own_listeners(server.port, server.health_port, http_api.port if http_api else None)
    )


async def start_control_plane(
    settings: ControlPlaneSettings, *, clock: Clock | None = None
) -> ControlPlane:
    clock = clock or SystemClock()
    hub = _worker_hub(settings)
    database, leadership = await _open_and_lead(settings, clock, hub)
    core = _build_core(settings, database, clock, leadership, hub)
    authenticator = ControlPlaneAuthenticator(database, clock)
    gateway = _worker_gateway(settings, core, database, clock)
    control_plane_service = _control_plane_service(core, database, clock, authenticator)
    resolver = DeploymentResolver(database=database, routes=core.routes)
    inference = InferenceService(
        database=database,
        hub=core.hub,
        scheduler=core.scheduler,
        routes=core.routes,
        clock=clock,
        settings=settings.inference,
        resolver=resolver,
        degradation=core.reconciler.degradation,  # outcomes in, evaluated by the reconciler
    )
    kserve = KServeInference(
        database=database, inference=inference, resolver=resolver, scheduler=core.scheduler
    )
    limits = front_door_limits(settings.inference)
    server = await create_server(
        listen=settings.listen,
        services=_service_bindings(
            control_plane=control_plane_service, inference=inference, kserve=kserve, gateway=gateway
        ),
        authenticator=authenticator,
        tls=settings.tls,
        health_listen=settings.health_listen,
        limits=limits,
        max_receive_bytes=receive_limit_bytes(settings.inference, limits),
        keepalive=settings.keepalive,
    )
    try:
        http_api = await _start_http_api(
            settings,
            inference=inference,
            authenticator=authenticator,
            database=database,
            kserve=kserve,
        )
    except BaseException:
        await _stop_unstarted(server, leadership, database)
        raise
    _refuse_adopting_ourselves(control_plane_service, server, http_api)
    await core.start(run_reconciler=settings.run_reconciler)
    return ControlPlane(
        give_back=asyncio.create_task(watch_memory(), name="memory-give-back"),
        server=server,
        database=database,
        scheduler=core.scheduler,
        hub=core.hub,
        lifecycle=core.lifecycle,
        reconciler=core.reconciler,
        gateway=gateway,
        liveness=core.liveness,
        audit_feed=core.audit_feed,
        http_api=http_api,
        scheduler_assignment=core.assignment,
        resolver=resolver,
        authenticator=authenticator,
    )
