"""Supervision of the worker's serving residents: loads, in-place restarts, liveness, health,
unloads, custody.

Every serving host is started, health-checked and stopped through the runtime adapter its
deployment names (`runtime_adapters.registry`, the one the PROBE job uses): LOAD is the adapter's
`prepare` then `start`, a restart in place its `start` again, HEALTH and the liveness pings its
`health`, UNLOAD its `unload` (the probe's reclaim check), the worker's own stop its `terminate`.
No path in the worker starts, checks or stops a serving host otherwise; an adopted endpoint (no
process of ours) is checked and forgotten through the same `health` and `stop`.

Invariants this module keeps:
- A resident stays in the map until its child is reaped and reclaim is verified (the probe's
  rule, `reclaim_verdict`: on a GPU, NVML read and no longer listing the pid); a stop, or a
  failed start, that cannot prove that leaves it UNCERTAIN (still holding its pid), never
  silently forgotten. LOAD and HEALTH evidence read its memory as a probe's is (NVML per
  process, RSS), and an UNLOAD's carries the reclaim (NVML before and after).
- A host that exits on its own is restarted in place (same verified directory, adapter and
  interpreter) after the backoff `CrashHistory` decides; while down it is LOADING with
  `last_failure`, `restart_count` and `next_restart_at`. A crash loop keeps restarting, slowly.
- A host that misses a ping deadline is hung: it is SIGKILLed (its callers fail at once with
  RUNTIME_UNRESPONSIVE) and restarted like a crash. One liveness loop serves all residents.
- Every change of a resident's reported state calls `on_change` at once (the agent then sends an
  InventoryReport). Routine pings change nothing unless a health layer's status changes.

`Supervisor` (here: loads, adoption, unloads, the host an invoke goes to) is composed of three
parts, each its own module: ending custody with its reclaim proven (`supervision_custody`),
restarts in place (`supervision_restarts`), liveness and health (`supervision_health`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, cast

from gantry.common.clock import Clock, SystemClock
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker import metrics
from gantry.worker.crash_policy import CrashHistory, RestartPolicy
from gantry.worker.exit_cause import OomCounter
from gantry.worker.model_host.custody import cancelled_child
from gantry.worker.nvml_readings import Nvml
from gantry.worker.residents import (
    DEFAULT_MAX_RESIDENTS,
    LOADING,
    RESIDENT,
    Resident,
    ResidentFacts,
    ResidentMap,
    SupervisedHost,
)
from gantry.worker.runtime_adapters.base import (
    EnvironmentResolver,
    Prepared,
    PrepareRequest,
    RunningRuntime,
    RuntimeAdapter,
    StartRequest,
)
from gantry.worker.runtime_adapters.model_host_runtime import (
    ProbeHost,
    ProbeHostFactory,
    held_runtime,
    running_host,
)
from gantry.worker.runtime_adapters.registry import DEFAULT_ADAPTER, runtime_adapter_for
from gantry.worker.runtime_adapters.serving_evidence import (
    memory_now,
)
from gantry.worker.stop_plan import StopPlan
from gantry.worker.supervision_custody import SupervisionCustody
from gantry.worker.supervision_health import SupervisionHealth
from gantry.worker.supervision_restarts import SupervisionRestarts

if TYPE_CHECKING:
    from gantry.worker.environment_facts import RuntimeFacts

log = logging.getLogger(__name__)


class AdapterLookup(Protocol):
    """The registry seam: the adapter a name means (`registry.runtime_adapter_for`)."""

    def __call__(
        self, name: str, *, host_factory: ProbeHostFactory | None = ...
    ) -> RuntimeAdapter: ...


@dataclass(frozen=True, kw_only=True)
class SupervisionSettings:
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    ping_interval_s: float = 5.0
    ping_timeout_s: float = 3.0
    # A deep health check runs a forward pass queued behind real work: give it room.
    deep_health_timeout_s: float = 30.0
    stop_grace_s: float = 10.0
    max_residents: int = DEFAULT_MAX_RESIDENTS
    # Which GPUs a torch device index means, for NVML's device readings (as a probe reads them).
    visible_devices: str | None = field(
        default_factory=lambda: os.environ.get("CUDA_VISIBLE_DEVICES")
    )


@dataclass(frozen=True, kw_only=True)
class ServingLoad:
    """What one LOAD asks: the bytes and environment to prepare (its settings name the adapter)
    and how to start them (named by the deployment id, with their bounds)."""

    prepare: PrepareRequest
    start: StartRequest


@dataclass(eq=False, kw_only=True)
class _Runtime:
    """What supervision holds beside a resident: the adapter that runs it, what restarts reuse
    (the start request and the prepared bytes), and the runtime while one runs."""

    adapter: RuntimeAdapter
    start: StartRequest | None = None  # None: adopted, never started here
    prepared: Prepared | None = None
    running: RunningRuntime | None = None
    # The pid of a start that failed without its reclaim proven: custody stays (UNCERTAIN)
    # until an UNLOAD finds it gone (`_recheck_failed_start`).
    failed_pid: int = 0
    # The child of a start cancelled after it spawned one (`cancelled_child`): judged by
    # `_release` as a failed start's.
    cancelled_start: GantryError | None = None


class _NoEnvironments:
    """The resolver of a supervisor given none: it can hold adopted endpoints, load nothing."""

    async def require(self, environment_id: str, *, adapter: str | None = None) -> RuntimeFacts:
        raise GantryError(
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            f"this worker's supervisor resolves no environment (asked for {environment_id!r})",
        )


class Supervisor(SupervisionRestarts, SupervisionHealth, SupervisionCustody):
    def __init__(
        self,
        settings: SupervisionSettings,
        *,
        on_change: Callable[[], None],
        clock: Clock | None = None,
        host_factory: ProbeHostFactory | None = None,
        oom_counter: OomCounter | None = None,
        environments: EnvironmentResolver | None = None,
        adapters: AdapterLookup = runtime_adapter_for,
        open_nvml: Callable[[], Nvml] = Nvml.open,
    ) -> None:
        """`host_factory`: how model-host adapters start their children (the warm pool's fork,
        a test's wrapper); None: each adapter's own. A managed server kind starts its server."""
        self.settings = settings
        self.residents = ResidentMap(max_residents=settings.max_residents)
        self._on_change = on_change
        self._clock = clock or SystemClock()
        self._host_factory = host_factory
        self._oom_counter = oom_counter or OomCounter.for_current_process()
        self._environments: EnvironmentResolver = environments or _NoEnvironments()
        self._adapters = adapters
        self._open_nvml = open_nvml
        self._runtimes: dict[Resident, _Runtime] = {}
        self._shutting_down = False

    # ---- load and unload ----------------------------------------------------------------------

    async def load(
        self,
        deployment_id: str,
        facts: ResidentFacts,
        request: ServingLoad,
        *,
        trace_context: dict[str, str],
    ) -> Resident:
        """Admit, prepare (the adapter verifies the bytes), start; RESIDENT when this returns.

        An unknown adapter is RUNTIME_INCOMPATIBLE before anything is admitted. An unload
        meanwhile cancels the start (the child is killed and reaped) and this raises
        INVALID_STATE_TRANSITION. Cancelling the caller cancels the start the same way.
        """
        adapter = self._adapter(request.prepare.settings.adapter)
        resident = Resident(
            deployment_id=deployment_id,
            facts=facts,
            crashes=CrashHistory(self.settings.restart, self._clock),
        )
        self.residents.admit(resident)
        runtime = _Runtime(adapter=adapter, start=request.start)
        self._runtimes[resident] = runtime
        self._changed()

        async def start() -> SupervisedHost | None:
            runtime.prepared = await adapter.prepare(
                request.prepare, environments=self._environments
            )
            try:
                host = await self._start(resident, runtime, trace_context)
            except asyncio.CancelledError as cancelled:
                runtime.cancelled_start = cancelled_child(cancelled)
                raise
            # In this task, with no await after the start: an unload that finds the task done
            # also finds the host to stop.
            self._now_resident(resident, host)
            return host

        task = asyncio.create_task(start(), name=f"load-{deployment_id}")
        resident.start_task = task
        try:
            await task
        except BaseException as exc:
            await self._release(resident, task)
            if not isinstance(exc, asyncio.CancelledError) or _cancelling(asyncio.current_task()):
                raise  # a failed start, or our caller was cancelled (CancelJob, an overtake)
            raise self._overtaken(deployment_id) from None
        finally:
            if resident.start_task is task:
                resident.start_task = None
        if self.residents.get(deployment_id) is not resident:
            raise self._overtaken(deployment_id)  # unloaded the moment it became resident
        return resident

    def load_evidence(self, resident: Resident) -> wg.LoadEvidence:
        """What a LOAD established: the bytes its adapter verified and the host it started."""
        runtime = self._runtimes.get(resident)
        host = resident.host
        if runtime is None or runtime.prepared is None or host is None:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"deployment {resident.deployment_id} has no host loaded on this worker",
                deployment_id=resident.deployment_id,
            )
        return wg.LoadEvidence(
            pid=host.pid,
            load_seconds=host.ready.load_seconds,
            dim=host.ready.dim,
            rss_bytes=host.rss_bytes(),
            runtime_versions=dict(host.ready.runtime_versions),
            files_verified=runtime.prepared.files_verified,
            bytes_verified=runtime.prepared.bytes_verified,
            adapter_digest=resident.facts.adapter_digest,
            environment_fingerprint=resident.facts.environment_fingerprint,
            isolation=host.ready.isolation,
            isolation_reason=host.ready.isolation_reason,
            memory=self._memory_now(runtime, host),
        )

    def _memory_now(self, runtime: _Runtime, host: SupervisedHost) -> wg.MemoryEvidence | None:
        """A started host's memory now, in the probe's evidence type: its RSS, NVML's readings
        of its device and of its pid (a pid NVML lists marks it as holding device memory, so
        its reclaim needs NVML too). None for an adopted endpoint: no process of ours."""
        running = runtime.running
        if runtime.start is None or running is None:
            return None
        nvml = self._open_nvml()
        try:
            return memory_now(
                running,
                rss_bytes=host.rss_bytes(),
                nvml=nvml,
                visible_devices=self.settings.visible_devices,
            )
        finally:
            nvml.close()

    def adopt(
        self, deployment_id: str, facts: ResidentFacts, host: SupervisedHost, *, endpoint_url: str
    ) -> Resident:
        """Hold an external server (already checked to answer) as RESIDENT. It has no launch, so
        nothing here can restart it, and it never reports an exit: its failed pings only mark
        its health. It is checked by the default adapter's `health` (a ping, a model check) and
        unloading it goes through that adapter's `stop`, which only forgets it."""
        resident = Resident(
            deployment_id=deployment_id,
            facts=facts,
            crashes=CrashHistory(self.settings.restart, self._clock),
            adopted=True,
            endpoint_url=endpoint_url,
        )
        self.residents.admit(resident)
        adapter = self._adapter(DEFAULT_ADAPTER)
        # An adopted endpoint answers the ping, model check and stop `health`/`stop` ask for.
        running = held_runtime(cast(ProbeHost, host), adapter=adapter.name)
        self._runtimes[resident] = _Runtime(adapter=adapter, running=running)
        self._now_resident(resident, host)
        return resident

    @staticmethod
    def _overtaken(deployment_id: str) -> GantryError:
        return GantryError(
            "INVALID_STATE_TRANSITION",
            f"the load of {deployment_id} was cancelled: an unload overtook it",
            deployment_id=deployment_id,
        )

    async def unload(self, deployment_id: str) -> wg.UnloadEvidence:
        """Stop the host through its adapter's `unload` and end custody once reclaim is
        verified; UNCERTAIN and RECLAIM_UNVERIFIED otherwise. Cancels a load or restart in
        progress first."""
        resident = self.residents.get(deployment_id)
        if resident is None:
            # Nothing of it runs here (already gone): unloading is done, and says so.
            return wg.UnloadEvidence(pid=0, process_exited=True)
        await self._cancel_start(resident)
        if self.residents.get(deployment_id) is not resident:
            return wg.UnloadEvidence(pid=0, process_exited=True)  # a cancelled load cleaned up
        return await self._stop(resident)

    async def shutdown(self, plan: StopPlan | None = None) -> None:
        """The worker is stopping: every host this process started, all at once against the
        plan's deadlines (SIGTERM now, SIGKILL at `kill_at`); the unverifiable ones stay,
        UNCERTAIN. Nothing is restarted from here on."""
        plan = plan or StopPlan.starting(asyncio.get_running_loop().time())
        self._shutting_down = True
        await asyncio.gather(*(self._cancel_start(r) for r in list(self.residents)))
        results = await asyncio.gather(
            *(self._terminate(r, plan) for r in list(self.residents)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.error("shutdown could not verify a reclaim: %s", result)

    # ---- serving ------------------------------------------------------------------------------

    def host_for_invoke(self, deployment_id: str) -> SupervisedHost:
        """The host to send an invoke to, or the failure that explains why there is none."""
        resident = self.residents.get(deployment_id)
        if resident is None:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"deployment {deployment_id} is not resident on this worker",
                deployment_id=deployment_id,
            )
        if resident.state == RESIDENT and resident.host is not None:
            return resident.host
        if resident.state == LOADING and resident.last_failure is not None:
            # Down and restarting: fail fast with the reason it went down.
            failure = resident.last_failure
            raise GantryError(
                failure.reason,
                f"deployment {deployment_id} is restarting on this worker: {failure.message}",
                deployment_id=deployment_id,
            )
        raise GantryError(
            "DEPLOYMENT_NOT_READY",
            f"deployment {deployment_id} is {common_pb2.ResidencyState.Name(resident.state)} "
            "on this worker",
            deployment_id=deployment_id,
        )

    # ---- internals ----------------------------------------------------------------------------

    def _adapter(self, name: str) -> RuntimeAdapter:
        return self._adapters(name, host_factory=self._host_factory)

    async def _start(
        self, resident: Resident, runtime: _Runtime, trace_context: dict[str, str]
    ) -> SupervisedHost:
        """The adapter's `start` of the prepared bytes (a load, or a restart in place)."""
        assert runtime.prepared is not None and runtime.start is not None
        oom_kills = self._oom_counter.read()
        restart = resident.restart_count > 0
        request = replace(runtime.start, on_exit=self._host_exited, trace_context=trace_context)
        try:
            running = await runtime.adapter.start(runtime.prepared, request)
        except GantryError as error:
            metrics.host_started(restart=restart, failure_reason=error.reason)
            raise
        except Exception:
            metrics.host_started(restart=restart, failure_reason="LOAD_FAILED")
            raise
        metrics.host_started(restart=restart)
        resident.oom_kills_at_start = oom_kills
        runtime.running = running
        # Started with this supervisor's factory (or the adapter's own: `ModelHost.start`,
        # `ManagedServer.start`), so the host is a serving one that invocations can use.
        return cast(SupervisedHost, running_host(running))

    def _now_resident(self, resident: Resident, host: SupervisedHost) -> None:
        resident.host = host
        resident.state = RESIDENT
        resident.next_restart_at = None
        resident.crash_loop = resident.crashes.crash_loop
        resident.health = None
        self._changed()

    async def _cancel_start(self, resident: Resident) -> None:
        task = resident.start_task
        if task is None or task.done():
            return
        task.cancel()
        # The start's own cleanup kills and reaps a half-started child before this returns.
        with contextlib.suppress(asyncio.CancelledError, GantryError):
            await asyncio.shield(task)

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception:
            log.exception("announcing a resident change failed")


def _cancelling(task: asyncio.Task[object] | None) -> bool:
    return task is not None and task.cancelling() > 0
