"""The worker agent: one outbound stream to each control-plane replica, jobs and invocations
over them.

The agent opens no port. It holds a stream (a `links.Link`) to every replica `--control-plane`
names or resolves to (control_planes.py); with one address, one stream. Its generation is issued
by the control plane in each Welcome: a new process presents none (0) and gets a new one; a
reconnect presents the one it holds and keeps it while no other stream took the node meanwhile,
so results the control plane has not acknowledged are resent within the same generation. Until
the process holds a generation, one stream at a time says Hello (the first claims it); every
other stream then presents it, and the replicas, sharing one database, keep it. A stream closed
because another Hello with this node's credential took the node (STALE_GENERATION) is dialled
again: the newest Hello wins. Each stream is dialled again with its own backoff: one replica's
stream dropping stops nothing else. Invocations are answered on the stream they came on, job
results and a probe's updates go back on their job's stream while it is open (else on any),
heartbeats go on every stream (each stream's GPU reading whole, or said unchanged since the last
one it carried where its Welcome allows: gpu_reading.py), and the rest (inventory) on the first
stream open. Serving residents are supervised by `supervision.Supervisor`, which starts, checks
and stops every host through the runtime adapter its deployment names (the registry the PROBE job
uses); every change of a resident sends an InventoryReport.

The outbox to the control plane is bounded (`outbox_limit`). When it is full the stream is not
being read; a message that does not fit is dropped and counted: job results stay unacknowledged
and are resent after the next reconnect, the inventory goes whole in every report and in Hello,
a dropped InvokeResult makes that invocation time out at the control plane, and a streamed
generation's delta that does not fit is carried into its next one (`invocations.ProgressRelay`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import duration_pb2

from gantry.common.auth import auth_metadata
from gantry.common.client_config import resolve_hosts
from gantry.common.clock import Clock
from gantry.common.digests import adapter_digest
from gantry.common.errors import GantryError
from gantry.common.grpc_server import channel
from gantry.common.status import error_from_rpc
from gantry.common.telemetry import inject_context, tracer
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.v1 import worker_gateway_pb2_grpc
from gantry.worker import gpu_reading, metrics
from gantry.worker.adopted_endpoint import adopt_endpoint
from gantry.worker.agent_settings import (
    WorkerSettings,
    credential_node_id,
    gpu_devices_of,
    node_domains,
    pooled_host_factory,
    probe_settings,
    serving_load,
    warm_pool_for,
)
from gantry.worker.control_planes import StreamTarget, parse_control_planes, plan_streams
from gantry.worker.environment_facts import (
    RuntimeEnvironments,
    normalized_environment_id,
)
from gantry.worker.gpu_reading import GpuReading
from gantry.worker.gpu_usage import GpuUsageReader
from gantry.worker.heartbeat_file import HeartbeatFile
from gantry.worker.inspect_job import run_inspect
from gantry.worker.invocations import Invocations
from gantry.worker.jobs import DeploymentJobQueues
from gantry.worker.links import Link, first_welcomed, unbatched
from gantry.worker.model_host.cpu_calibration import HostCpu
from gantry.worker.model_host.cpu_policy import Choice
from gantry.worker.model_host.environments import resolve_python
from gantry.worker.model_host.warm_pool import WarmPool
from gantry.worker.nvml_readings import Nvml, visible_devices
from gantry.worker.probe_job import ProbeRunner
from gantry.worker.residents import ResidentFacts
from gantry.worker.runtime_adapters.model_host_runtime import ProbeHostFactory
from gantry.worker.runtime_adapters.registry import runtime_adapter_for
from gantry.worker.stop_plan import StopPlan
from gantry.worker.supervision import Supervisor

log = logging.getLogger(__name__)
_tracer = tracer("gantry.worker")


# What runs one job kind: its assignment in, its result filled in.
JobHandler = Callable[[wg.JobAssignment, wg.JobResult], Awaitable[None]]


class WorkerAgent:
    def __init__(
        self,
        settings: WorkerSettings,
        *,
        generation: int = 0,
        clock: Clock | None = None,
        host_factory: ProbeHostFactory | None = None,
        warm_pool: WarmPool | None = None,
        open_nvml: Callable[[], Nvml] | None = None,
    ) -> None:
        """`warm_pool`: one shared with other agents (tests), left running at shutdown; without
        it an agent whose settings ask for a warm pool owns one and stops it at shutdown.
        `host_factory`: how model-host adapters start residents' children (a test's).
        `open_nvml`: the NVML the heartbeats, probes and serving read (a test's named fake); None:
        `Nvml.open`, looked up now."""
        open_nvml = open_nvml or Nvml.open
        self.settings = settings
        self.node_id = credential_node_id(settings.credential)
        self.generation = generation  # the next Hello presents it; each Welcome issues one
        self.warm_pool, self._owns_warm_pool = warm_pool_for(settings, shared=warm_pool)
        # The hosts' CPU wait policy, measured once per machine and environment (None: PASSIVE).
        self.host_cpu = (
            HostCpu(settings.host_cpu_cache) if settings.host_cpu_cache is not None else None
        )
        pooled = (
            pooled_host_factory(self.warm_pool, self.host_cpu)
            if self.warm_pool is not None or self.host_cpu is not None
            else None
        )
        # Capability labels come from the environments that run the models, not this process.
        self.environments = RuntimeEnvironments(
            settings.env, timeout_s=settings.environment_facts_timeout_s
        )
        self.supervisor = Supervisor(
            settings.supervision(),
            on_change=self._report_inventory,
            clock=clock,
            # Model-host adapters fork from the warm pool; a managed server kind starts its own.
            host_factory=host_factory or pooled,
            environments=self.environments,
            # Serving's LOAD, HEALTH and UNLOAD read the same NVML a probe does.
            open_nvml=open_nvml,
        )
        self.residents = self.supervisor.residents
        self.connected = asyncio.Event()  # some stream is welcomed
        self.outbox_dropped = 0
        self.control_planes = parse_control_planes(settings.control_plane)  # whose streams
        self._links: dict[str, Link] = {}  # address -> its stream, in the order given (resolved)
        self._claiming = asyncio.Lock()  # one Hello at a time until a generation is held
        self._unacked: dict[str, wg.JobResult] = {}
        # One counter for this process, every stream: each inventory and job result carries the
        # next number, so a replica reading one late can tell it is older (Inventory.sequence).
        self._sequence = itertools.count(1)
        self._job_links: dict[str, Link] = {}  # job id -> the stream it came on, until its result
        self._jobs = DeploymentJobQueues(run=self.run_job, emit=self._job_finished)
        self._invocations = Invocations(
            supervisor=self.supervisor,
            emit=lambda result: self._send(wg.WorkerMessage(invoke_result=result)),
            emit_progress=lambda progress: self._offer(wg.WorkerMessage(invoke_progress=progress)),
            max_in_flight=settings.max_in_flight_invokes,
        )
        self._job_handlers: dict[str, JobHandler] = {
            "load": self._load,
            "unload": self._unload,
            "health": self._health,
            "inspect": self._inspect,
            "probe": self._probe,
        }
        # Probe hosts are the probe jobs' own: never residents, never routed, never counted.
        self.probes = ProbeRunner(
            probe_settings(settings),
            environments=self.environments,
            host_factory=pooled,
            open_nvml=open_nvml,
        )
        # Each heartbeat's GPU reading (gpu_usage.py): external processes are charged by it.
        self._gpus = GpuUsageReader(
            visible_devices=visible_devices(settings.env), open_nvml=open_nvml
        )
        self.resource_domains = node_domains(settings)
        # Named once at start (a GPU's model does not change under a running worker).
        self.gpu_devices = gpu_devices_of(settings, open_nvml)
        self._tasks: set[asyncio.Task[None]] = set()
        self._liveness: asyncio.Task[None] | None = None
        self._heartbeat_seconds = 3.0  # until a Welcome names the interval: the longest told
        # Stream address -> the interval its replica told (Welcome, HeartbeatInterval): each
        # replica paces its own streams by how many it holds.
        self._intervals: dict[str, float] = {}
        self._heartbeat_file = (
            HeartbeatFile(settings.heartbeat_file) if settings.heartbeat_file is not None else None
        )

    # ---- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Hold a stream to every replica, each dialled again with backoff; returns only when
        disabled or cancelled."""
        if self._liveness is None:
            # Supervision runs whether or not the control plane is reachable.
            self._liveness = asyncio.create_task(self.supervisor.run_liveness(), name="liveness")
            self._prewarm()
        # Hello carries every environment's facts: learn them (concurrently, once) first.
        await self.environments.collect()
        try:
            while True:
                self._hold(await self._stream_targets())
                if await self._any_link_ended():
                    return  # disabled
        finally:
            await self._drop_links(list(self._links.values()))

    async def _stream_targets(self) -> Sequence[StreamTarget]:
        """The replicas to hold streams to now: the fixed ones, or the name resolved again (a
        name that resolves to nothing keeps the streams held: DNS failing is not the replicas)."""
        planes = self.control_planes
        if not planes.resolves:
            return planes.fixed
        resolved = await asyncio.to_thread(resolve_hosts, [planes.host])
        targets = plan_streams(planes, resolved)
        if not targets:
            log.warning("%s:%d resolves to no address; streams kept", planes.host, planes.port)
            return [link.target for link in self._links.values()]
        return targets

    def _hold(self, targets: Sequence[StreamTarget]) -> None:
        """A link (dialled from now on) for each new target; the links of targets no longer
        listed are closed (their replicas see the stream end)."""
        wanted = {target.address: target for target in targets}
        gone = [link for address, link in self._links.items() if address not in wanted]
        for link in gone:
            del self._links[link.name]
            if link.task is not None:
                link.task.cancel()
        added = [target for address, target in wanted.items() if address not in self._links]
        for target in added:
            link = Link(target=target, outbox_limit=self.settings.outbox_limit)
            link.task = asyncio.create_task(self._keep_link(link), name=f"stream-{link.name}")
            self._links[link.name] = link
        if gone or (added and len(wanted) > 1):
            log.info("control-plane streams: %s", ", ".join(self._links) or "none")

    async def _any_link_ended(self) -> bool:
        """Wait for a link's loop to end (NODE_DISABLED: True), or for the next resolve."""
        tasks = {link.task for link in self._links.values() if link.task is not None}
        timeout = self.settings.resolve_interval_s if self.control_planes.resolves else None
        if not tasks:  # the name resolved to nothing yet: tried again within a reconnect's wait
            await self._backoff(min(timeout or 0.0, self.settings.reconnect_max_seconds))
            return False
        done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if not task.cancelled():
                task.result()  # an unexpected failure ends the agent, as it always did
                return True
        return False

    async def _drop_links(self, links: list[Link]) -> None:
        for link in links:
            if link.task is not None:
                link.task.cancel()
        for link in links:
            if link.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await link.task
        self._links.clear()

    async def _keep_link(self, link: Link) -> None:
        """Connect, serve, reconnect with backoff; returns only when disabled."""
        delay = 0.2
        while True:
            ended_by = ""
            self._record_heartbeat()  # the loop is alive, whether or not the next try connects
            try:
                await self._serve_stream(link)
                delay = 0.2
            except grpc.aio.AioRpcError as error:
                gantry_error = error_from_rpc(error)
                ended_by = gantry_error.reason
                if gantry_error.reason == "NODE_DISABLED":
                    log.error("stopping: %s", gantry_error.message)
                    return
                if gantry_error.reason == "STALE_GENERATION":
                    # Another stream with this node's credential took the node: dialled again
                    # (with backoff), this process takes it back. Two workers sharing one
                    # credential keep taking turns: run one per credential, rotate a leaked one.
                    log.error("%s; connecting again", gantry_error.message)
                else:
                    log.warning("control plane stream ended: %s", gantry_error)
            finally:
                if link.welcomed:
                    metrics.stream_event("disconnected", ended_by)
                link.welcomed = False
                if first_welcomed(self._links.values()) is None:
                    self.connected.clear()
            self._record_heartbeat()  # says "disconnected" from the moment the stream ended
            await self._backoff(delay)
            delay = min(delay * 2, self.settings.reconnect_max_seconds)

    async def _backoff(self, delay: float) -> None:
        """Sleep before the next connect in heartbeat-sized steps, writing the heartbeat file at
        each: the liveness probe asks whether this process is alive, not whether the control
        plane is, so a long outage must not restart a worker (and lose its model hosts)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + delay
        while (left := until - loop.time()) > 0:
            await asyncio.sleep(min(left, self._heartbeat_seconds))
            self._record_heartbeat()

    async def shutdown(self, plan: StopPlan | None = None) -> None:
        """Stop every model host this process started, and its own fork servers, all at once
        within the plan's deadlines (made now when not given); custody ends only for verified
        reclaims (the rest stay in the map, UNCERTAIN)."""
        plan = plan or StopPlan.starting(asyncio.get_running_loop().time())
        if self._liveness is not None:
            self._liveness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._liveness
            self._liveness = None
        for task in list(self._tasks):
            task.cancel()
        await self._jobs.close()
        await self._invocations.close()
        # Together: the fork servers only cache imports, and a forked host is the worker's own
        # child, never theirs, so neither waits for the other.
        await asyncio.gather(self.supervisor.shutdown(plan), self._close_warm_pool(plan))
        await self.environments.close()
        await asyncio.to_thread(self._gpus.close)

    async def _close_warm_pool(self, plan: StopPlan) -> None:
        if self.warm_pool is not None and self._owns_warm_pool:
            now = asyncio.get_running_loop().time()
            await self.warm_pool.aclose(exit_s=plan.term_grace_s(now))

    def _prewarm(self) -> None:
        """Measure the default environment's CPU wait policy (or read it, cached), then start its
        fork server with it, so the first load finds its imports done (it waits for the server
        otherwise); other environments start theirs on first use."""
        try:
            python = resolve_python("", self.settings.env)
        except GantryError as error:
            log.warning("warm pool not started ahead of the first load: %s", error.message)
            return
        if self.host_cpu is None:
            self._prewarm_pool(python, {})
            return
        loop = asyncio.get_running_loop()

        def measured(done: concurrent.futures.Future[Choice | None]) -> None:
            # The server is started from the loop's thread (its parent-death signal is that
            # thread's), with the environment ModelHost.start gives a host.
            choice = done.result()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(
                    self._prewarm_pool, python, choice.environment() if choice else {}
                )

        self.host_cpu.start(python, os.environ).add_done_callback(measured)

    def _prewarm_pool(self, python: str, cpu_environment: Mapping[str, str]) -> None:
        if self.warm_pool is None or self._liveness is None:  # none, or the worker stopped
            return
        try:
            # The hosts' environment comes from this process's, as ModelHost.start builds it.
            self.warm_pool.prewarm(python, {**cpu_environment, **os.environ})
        except GantryError as error:
            log.warning("warm pool not started ahead of the first load: %s", error.message)

    def streams(self) -> dict[str, StreamTarget]:
        """The replicas this worker holds a stream to (or dials): address -> what it dials."""
        return {address: link.target for address, link in self._links.items()}

    def active_job_ids(self) -> list[str]:
        """Jobs queued or running here (PROBE and INSPECT included): the leases heartbeats renew."""
        return self._jobs.active_job_ids()

    # ---- the stream ---------------------------------------------------------------------------

    async def _serve_stream(self, link: Link) -> None:
        target = link.target
        async with channel(target.address, self.settings.tls, authority=target.authority) as ch:
            stub = worker_gateway_pb2_grpc.WorkerGatewayStub(ch)
            heartbeat: asyncio.Task[None] | None = None
            try:
                async with self._claim_turn():
                    link.renew()
                    self._send(wg.WorkerMessage(hello=self._hello()), link)
                    call = stub.Connect(
                        link.outgoing(), metadata=auth_metadata(self.settings.credential)
                    )
                    heartbeat = asyncio.create_task(self._heartbeats(link), name="heartbeats")
                    messages = aiter(call)
                    # The Welcome is read under the claim: the next stream presents its generation.
                    if (first := await anext(messages, None)) is not None:
                        self._handle(link, first)
                        # The Welcome names the interval: the beats are timed by it from here.
                        # The loop started before it sleeps the default (3 s) first, past a short
                        # interval's staleness bound: the node was declared stale at connect.
                        heartbeat.cancel()
                        heartbeat = asyncio.create_task(self._heartbeats(link), name="heartbeats")
                async for message in messages:
                    for each in unbatched(message):  # a ControlBatch's, in order, as if alone
                        self._handle(link, each)
            finally:
                if heartbeat is not None:
                    heartbeat.cancel()
                link.end()

    @contextlib.asynccontextmanager
    async def _claim_turn(self) -> AsyncIterator[None]:
        """While this process holds no generation, its streams say Hello one at a time: the first
        Welcome issues one, which every later Hello presents (and so keeps). Two Hellos presenting
        none would each be issued a new one, the later taking the node from the earlier."""
        if self.generation:
            yield
            return
        async with self._claiming:
            yield

    def _send(self, message: wg.WorkerMessage, link: Link | None = None) -> None:
        self._offer(message, link)

    def _any_link(self) -> Link | None:
        """Where a message bound to no stream goes: the first welcomed stream, else the first."""
        return first_welcomed(self._links.values()) or next(iter(self._links.values()), None)

    def _offer(self, message: wg.WorkerMessage, link: Link | None = None) -> bool:
        """Queue `message` for the control plane on `link` (None: on any stream); False (counted
        and logged) when its outbox is full, or when no stream is held at all."""
        message.node_id = self.node_id
        message.generation = self.generation
        link = link or self._any_link()
        if link is None:
            return False  # nothing resolved yet: what a stream needs is sent when one opens
        if link.full():
            self.outbox_dropped += 1
            log.warning(
                "outbox to the control plane is full (%d); dropped a %s message (%d dropped)",
                self.settings.outbox_limit,
                message.WhichOneof("kind"),
                self.outbox_dropped,
            )
            return False
        link.put(message)
        return True

    def _hello(self) -> wg.Hello:
        return wg.Hello(
            inventory=self._inventory(),
            environments=self.environments.listed(),
            agent_version="0.1.0",
            hostname=socket.gethostname(),
            resource_domains=[domain.to_proto() for domain in self.resource_domains],
            max_residents=self.settings.max_residents,
            gpus=self.gpu_devices,
            # ControlMessage.batch is read here (`_handle`).
            control_batches_understood=True,
        )

    async def _heartbeats(self, link: Link) -> None:
        while True:
            # Read at every beat: a HeartbeatInterval lengthens it from the next sleep on.
            await asyncio.sleep(self._intervals.get(link.name, self._heartbeat_seconds))
            await self._beat(link)
            # Every tick, welcomed or still waiting for the Welcome: the loop is alive.
            self._record_heartbeat()

    async def _beat(self, link: Link) -> None:
        """One heartbeat: the leases to renew, and the GPUs as NVML reads them now (on the
        reader's own thread, within its deadline), or, where the stream's control plane takes
        it, that they read as the reading last sent on this stream (gpu_reading.py)."""
        roots = [r.host.pid for r in self.residents if r.host is not None]
        roots += self.probes.running_pids
        gpus, gpus_unavailable = await self._gpus.read_within(roots)
        # Decided against the link as it is now (no await from here to the outbox): a stream
        # renewed while NVML was read starts over with the whole reading.
        reading = GpuReading.of(gpus, gpus_unavailable)
        heartbeat = gpu_reading.heartbeat(
            reading,
            link.gpu_reading_sent,
            understood=link.gpu_reading_understood,
            active_job_ids=self.active_job_ids(),
            resident_count=len(self.residents),
        )
        heartbeat.sent_at.GetCurrentTime()
        if self._offer(wg.WorkerMessage(heartbeat=heartbeat), link):
            link.gpu_reading_sent = reading

    def _handle(self, link: Link, message: wg.ControlMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            self._welcome(link, message.welcome)
        elif kind == "job_assignment":
            self._job_links[message.job_assignment.job_id] = link
            self._jobs.submit(message.job_assignment)
        elif kind == "invoke":
            # Answered on the stream it came on: that replica's caller waits for it there.
            self._invocations.start(
                message.invoke,
                message.trace_context,
                emit=lambda result: self._send(wg.WorkerMessage(invoke_result=result), link),
                emit_progress=lambda progress: self._offer(
                    wg.WorkerMessage(invoke_progress=progress), link
                ),
            )
        elif kind == "cancel_invoke":
            self._invocations.cancel(message.cancel_invoke.request_id)
        elif kind == "heartbeat_interval":
            self._paced(link, message.heartbeat_interval.heartbeat_interval)
        elif kind == "ack":
            self._unacked.pop(message.ack.job_id, None)
        elif kind == "reject":
            self._rejected(message.reject)
        elif kind == "cancel_job":
            # A cancelled job sends no result: the control plane settles it itself.
            self._job_links.pop(message.cancel_job.job_id, None)
            if not self._jobs.cancel(message.cancel_job.job_id):
                log.info("cancel for job %s: not on this worker", message.cancel_job.job_id)
        else:
            raise GantryError("INVALID_ARGUMENT", f"unknown control message {kind!r}")

    def _welcome(self, link: Link, welcome: wg.Welcome) -> None:
        # The generation the control plane issued: stamped on everything sent from here on, and
        # presented by the next Hello to keep it across a reconnect. One that differs from the
        # one held means the node was taken meanwhile: the other streams, bound to the old one
        # (their replicas would refuse every message stamped with this one), are ended and
        # dialled again presenting it.
        if self.generation and welcome.accepted_generation != self.generation:
            for other in self._links.values():
                if other is not link:
                    other.end()
        self.generation = welcome.accepted_generation
        self._paced(link, welcome.heartbeat_interval)
        link.gpu_reading_understood = welcome.gpu_reading_unchanged_understood
        link.batches_understood = welcome.worker_batches_understood
        metrics.stream_event("reconnected" if link.welcomed_before else "connected")
        link.welcomed = link.welcomed_before = True
        self.connected.set()
        self._record_heartbeat()  # live from the Welcome, not only from the first beat after it
        # The GPUs' reading at once: placement must not wait a beat to see external memory.
        self._spawn(self._beat(link), "first-heartbeat")
        log.info(
            "welcomed as node %s generation %d by %s", self.node_id, self.generation, link.name
        )
        for deployment_id in welcome.unload_deployment_ids:
            self._spawn(self._unload_untracked(deployment_id), f"unload-{deployment_id}")
        for result in self._unacked.values():
            self._send(wg.WorkerMessage(job_result=result), link)

    def _paced(self, link: Link, interval: duration_pb2.Duration) -> None:
        """Beat on `link` every `interval` (0: not said, the default stays). The heartbeat
        file's patience follows the longest interval any stream was told."""
        if (nanoseconds := interval.ToNanoseconds()) > 0:
            self._intervals[link.name] = nanoseconds / 1e9
            self._heartbeat_seconds = max(self._intervals.values())

    def _record_heartbeat(self) -> None:
        if self._heartbeat_file is not None:
            self._heartbeat_file.record(
                interval_s=self._heartbeat_seconds,
                node_id=self.node_id,
                generation=self.generation,
                connected=self.connected.is_set(),
            )

    def _rejected(self, reject: wg.Reject) -> None:
        log.warning(
            "control plane rejected %s: %s", reject.job_id or "a message", reject.failure.message
        )
        if reject.job_id:
            # A result of a generation that lost the node (its job went back to the queue) is
            # refused STALE_GENERATION like any other: dropped, never resent.
            self._unacked.pop(reject.job_id, None)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- jobs ---------------------------------------------------------------------------------

    async def run_job(self, assignment: wg.JobAssignment) -> wg.JobResult:
        """One job to exactly one result; CancelledError (a cancelled job) propagates: no result."""
        result = wg.JobResult(job_id=assignment.job_id, lease_token=assignment.lease_token)
        started = time.perf_counter()
        spec = assignment.WhichOneof("spec")
        try:
            handler = self._job_handlers.get(spec or "")
            if handler is None:
                raise GantryError("INVALID_ARGUMENT", f"unknown job spec {spec!r}")
            await handler(assignment, result)
        except GantryError as error:
            log.warning("job %s failed: %s", assignment.job_id, error)
            result.failure.CopyFrom(error.to_failure())
        except Exception as exc:
            log.exception("job %s failed unexpectedly", assignment.job_id)
            loads = assignment.WhichOneof("spec") in ("load", "probe")
            reason = "LOAD_FAILED" if loads else "INTERNAL"
            result.failure.CopyFrom(
                GantryError(reason, f"{type(exc).__name__}: {exc}").to_failure()
            )
        metrics.job_ran(spec or "", result.failure.reason, time.perf_counter() - started)
        return result

    def _job_link(self, job_id: str) -> Link | None:
        """The stream a job came on while it is open; None (any stream) once it is not."""
        link = self._job_links.get(job_id)
        return link if link is not None and link.welcomed else None

    def _job_finished(self, result: wg.JobResult) -> None:
        result.sequence = next(self._sequence)  # once: a resent result is the same result
        self._unacked[result.job_id] = result
        link = self._job_link(result.job_id)
        self._job_links.pop(result.job_id, None)
        self._send(wg.WorkerMessage(job_result=result), link)

    async def _load(self, assignment: wg.JobAssignment, result: wg.JobResult) -> None:
        spec = assignment.load
        if spec.HasField("endpoint"):  # an adopted server: called, never started
            result.load.CopyFrom(await self._adopt(spec))
            return
        # Before anything is admitted or spawned: an adapter the registry does not know is
        # RUNTIME_INCOMPATIBLE, an environment that cannot run it RUNTIME_ENVIRONMENT_UNAVAILABLE
        # (both class CONFIG). Supervision then runs the adapter's prepare and start.
        adapter = runtime_adapter_for(spec.adapter.adapter)
        runtime = await self.environments.require(spec.environment_id, adapter=adapter.name)
        facts = ResidentFacts(
            artifact_digest=spec.manifest_digest,
            environment_id=normalized_environment_id(spec.environment_id),
            adapter_digest=adapter_digest(spec.adapter),
            environment_fingerprint=runtime.fingerprint,
        )
        with _tracer.start_as_current_span(
            "worker.load", attributes={"gantry.deployment_id": spec.deployment_id}
        ):
            trace_context: dict[str, str] = {}
            inject_context(trace_context)
            resident = await self.supervisor.load(
                spec.deployment_id,
                facts,
                serving_load(self.settings, spec),
                trace_context=trace_context,
            )
        result.load.CopyFrom(self.supervisor.load_evidence(resident))
        # The digest whose manifest the adapter verified the bytes against: the control plane
        # compares it (and the verified counts) with the artifact set it asked for.
        result.load.manifest_digest = resident.facts.artifact_digest

    async def _adopt(self, spec: wg.LoadSpec) -> wg.LoadEvidence:
        return await adopt_endpoint(
            spec,
            admit=lambda deployment_id, facts, host: self.supervisor.adopt(
                deployment_id, facts, host, endpoint_url=host.url
            ),
            check_timeout_s=self.supervisor.settings.deep_health_timeout_s,
        )

    async def _inspect(self, assignment: wg.JobAssignment, result: wg.JobResult) -> None:
        with _tracer.start_as_current_span(
            "worker.inspect", attributes={"gantry.job_id": assignment.job_id}
        ):
            evidence = await run_inspect(
                assignment.inspect,
                artifact_root=self.settings.artifact_root,
                environments=self.environments,
            )
        result.inspect.CopyFrom(evidence)

    async def _probe(self, assignment: wg.JobAssignment, result: wg.JobResult) -> None:
        with _tracer.start_as_current_span(
            "worker.probe", attributes={"gantry.job_id": assignment.job_id}
        ):
            evidence = await self.probes.run(
                assignment,
                lambda update: self._send(
                    wg.WorkerMessage(job_update=update), self._job_link(assignment.job_id)
                ),
            )
        result.probe.CopyFrom(evidence)

    async def _unload(self, assignment: wg.JobAssignment, result: wg.JobResult) -> None:
        result.unload.CopyFrom(await self.supervisor.unload(assignment.unload.deployment_id))

    async def _health(self, assignment: wg.JobAssignment, result: wg.JobResult) -> None:
        spec = assignment.health
        result.health.CopyFrom(await self.supervisor.health(spec.deployment_id, deep=spec.deep))

    async def _unload_untracked(self, deployment_id: str) -> None:
        with contextlib.suppress(GantryError):
            await self.supervisor.unload(deployment_id)
        self._report_inventory()

    def _report_inventory(self) -> None:
        self._send(
            wg.WorkerMessage(inventory_report=wg.InventoryReport(inventory=self._inventory()))
        )

    def _inventory(self) -> wg.Inventory:
        """What this process holds now, stamped with its next sequence."""
        inventory = self.residents.inventory(self.generation)
        inventory.sequence = next(self._sequence)
        return inventory
