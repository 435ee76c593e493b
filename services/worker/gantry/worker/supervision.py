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
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, cast

from gantry.common.clock import Clock, SystemClock
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker import metrics
from gantry.worker.artifact_copies import discard_copy
from gantry.worker.crash_policy import CrashHistory, RestartDecision, RestartPolicy
from gantry.worker.exit_cause import OomCounter, classify_exit
from gantry.worker.model_host.custody import cancelled_child
from gantry.worker.nvml_readings import Nvml
from gantry.worker.residents import (
    DEFAULT_MAX_RESIDENTS,
    LOADING,
    RESIDENT,
    UNCERTAIN,
    UNLOADING,
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
    health_report,
)
from gantry.worker.runtime_adapters.model_host_runtime import (
    ProbeHost,
    ProbeHostFactory,
    held_runtime,
    running_host,
)
from gantry.worker.runtime_adapters.registry import DEFAULT_ADAPTER, runtime_adapter_for
from gantry.worker.runtime_adapters.serving_evidence import (
    child_gone,
    memory_now,
    reclaim_of_gone,
)
from gantry.worker.stop_plan import StopPlan

if TYPE_CHECKING:
    from gantry.worker.environment_facts import RuntimeFacts

log = logging.getLogger(__name__)

OK = wg.HEALTH_STATUS_OK
FAILED = wg.HEALTH_STATUS_FAILED
NOT_CHECKED = wg.HEALTH_STATUS_NOT_CHECKED


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


class Supervisor:
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

    async def _release(self, resident: Resident, task: asyncio.Task[SupervisedHost | None]) -> None:
        """End custody of a load that did not return. A cancellation can land after the start
        task finished but before this caller resumed (a CancelJob or an overtaking unload in
        that window): the host then runs, RESIDENT, and forgetting it would orphan the process.
        It is stopped here instead, so the unload queued behind this job finds nothing left."""
        if task.done() and not task.cancelled() and task.exception() is None:
            with contextlib.suppress(GantryError):  # unverified: it stays, UNCERTAIN
                await self._stop(resident)
            return
        failed = task.exception() if task.done() and not task.cancelled() else None
        runtime = self._runtimes.get(resident)
        if task.cancelled() and runtime is not None:
            failed = runtime.cancelled_start  # killed, but maybe not proven gone: judge it
        if isinstance(failed, GantryError) and "pid" in failed.metadata:
            if not self._failed_start_reclaimed(resident, failed):
                return  # custody stays, UNCERTAIN, until an UNLOAD proves the child gone
        self._forget(resident)

    def _failed_start_reclaimed(self, resident: Resident, error: GantryError) -> bool:
        """Judge a failed start's child as an unload's (`reclaim_verdict`), on whether the start
        reaped it and on NVML, never on the time its start waited; said in the error's metadata
        (`reclaim`: verified or unverified, and why), which the LOAD's failure carries."""
        runtime = self._runtimes[resident]
        pid = int(error.metadata["pid"])
        reaped = error.metadata.get("reaped") == "true"
        reclaim = self._reclaim_of_gone(pid, runtime, reaped=reaped)
        error.metadata["reclaim"] = "verified" if reclaim.reclaimed else "unverified"
        if reclaim.reclaimed:
            return True
        error.metadata["reclaim_detail"] = reclaim.detail
        runtime.failed_pid = pid
        self._uncertain(resident, _unverified(resident, reclaim))
        return False

    def _reclaim_of_gone(self, pid: int, runtime: _Runtime, *, reaped: bool) -> wg.ReclaimEvidence:
        """The reclaim of a child no runtime holds any more (its start failed)."""
        device = runtime.prepared.settings.device if runtime.prepared is not None else ""
        nvml = self._open_nvml()
        try:
            return reclaim_of_gone(pid, device, nvml, reaped=reaped)
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

    # ---- liveness and health ------------------------------------------------------------------

    async def run_liveness(self) -> None:
        """The worker's one liveness loop: ping every resident host each interval."""
        while True:
            await self._clock.sleep(self.settings.ping_interval_s)
            await self.check_liveness()

    async def check_liveness(self) -> None:
        await asyncio.gather(*(self._check_resident(r) for r in self.residents))

    async def health(self, deployment_id: str, *, deep: bool) -> wg.HealthEvidence:
        """Process, runtime (a ping in time) and, when `deep`, model (one real forward pass)."""
        resident = self.residents.get(deployment_id)
        if resident is None:
            raise GantryError(
                "DEPLOYMENT_NOT_READY",
                f"deployment {deployment_id} is not on this worker",
                deployment_id=deployment_id,
            )
        host = resident.host if resident.state == RESIDENT else None
        if host is None or not host.alive:
            why = resident.last_failure.message if resident.last_failure else "no running host"
            report = health_report(
                process=(FAILED, f"no live model host ({why})"),
                runtime=(NOT_CHECKED, "no process to ping"),
                model=(NOT_CHECKED, "no process to run the model"),
            )
            self._record_health(resident, report, force=True)
            return wg.HealthEvidence(pid=host.pid if host else 0, report=report)
        report = await self._probe(resident, host, deep=deep)
        self._record_health(resident, report, force=True)
        evidence = wg.HealthEvidence(pid=host.pid, report=report)
        runtime = self._runtimes.get(resident)
        memory = self._memory_now(runtime, host) if runtime is not None else None
        if memory is not None:
            evidence.memory.CopyFrom(memory)
        return evidence

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

    def _host_exited(self, exited: object, returncode: int) -> None:
        """A host died without being asked (crash, OOM kill, or killed as hung): restart it."""
        resident = next((r for r in self.residents if r.host is exited), None)
        if resident is None or resident.state != RESIDENT or resident.host is None:
            return
        if self._shutting_down:
            return  # the shutdown reaps it; a restart now would outlive the worker
        host = resident.host
        error = classify_exit(
            deployment_id=resident.deployment_id,
            pid=host.pid,
            returncode=returncode,
            oom_kills_before=resident.oom_kills_at_start,
            oom_kills_after=self._oom_counter.read(),
            oom_counter=self._oom_counter.describe(),
            killed_as_unresponsive=host.unresponsive is not None,
        )
        log.error("%s; restarting in place", error.message)
        resident.state = LOADING
        resident.host = None
        resident.health = health_report(
            process=(FAILED, error.message),
            runtime=(NOT_CHECKED, "no process to ping"),
            model=(NOT_CHECKED, "no process to run the model"),
        )
        decision = self._record_crash(resident, error)
        runtime = self._runtimes[resident]
        crashed, runtime.running = runtime.running, None
        resident.start_task = asyncio.create_task(
            self._restart(resident, runtime, crashed, decision),
            name=f"restart-{resident.deployment_id}",
        )
        self._changed()

    def _record_crash(self, resident: Resident, error: GantryError) -> RestartDecision:
        decision = resident.crashes.record_crash()
        resident.crash_loop = decision.crash_loop
        metrics.host_crashed(error.reason, crash_loop=decision.crash_loop)
        if decision.crash_loop:
            policy = self.settings.restart
            error = GantryError(
                "RUNTIME_CRASH_LOOP",
                f"{decision.crashes_in_window} crashes within {policy.crash_loop_window_s:g}s; "
                f"restarting every {decision.delay_s:g}s. Last: {error.message}",
                **{**error.metadata, "cause": error.reason},
            )
        resident.last_failure = error.to_failure()
        resident.next_restart_at = self._clock.now() + dt.timedelta(seconds=decision.delay_s)
        return decision

    async def _restart(
        self,
        resident: Resident,
        runtime: _Runtime,
        crashed: RunningRuntime | None,
        decision: RestartDecision,
    ) -> SupervisedHost | None:
        if crashed is not None:
            # Already reaped, so no signal is sent: the stop closes the pipe, collects the
            # stderr tail and confirms the pid gone.
            with contextlib.suppress(Exception):
                await runtime.adapter.stop(crashed, grace_s=self.settings.stop_grace_s)
        while True:
            await self._clock.sleep(decision.delay_s)
            resident.next_restart_at = None
            resident.restart_count += 1
            metrics.host_restart_attempted()
            self._changed()
            try:
                host = await self._start(resident, runtime, {})
            except Exception as exc:
                error = (
                    exc
                    if isinstance(exc, GantryError)
                    else GantryError("LOAD_FAILED", f"{type(exc).__name__}: {exc}")
                )
                log.error("restart of %s failed: %s", resident.deployment_id, error.message)
                decision = self._record_crash(resident, error)
                self._changed()
                continue
            resident.start_task = None
            self._now_resident(resident, host)
            log.info(
                "model host of %s restarted in place: pid %d (restart %d)",
                resident.deployment_id,
                host.pid,
                resident.restart_count,
            )
            return host

    async def _cancel_start(self, resident: Resident) -> None:
        task = resident.start_task
        if task is None or task.done():
            return
        task.cancel()
        # The start's own cleanup kills and reaps a half-started child before this returns.
        with contextlib.suppress(asyncio.CancelledError, GantryError):
            await asyncio.shield(task)

    async def _stop(self, resident: Resident) -> wg.UnloadEvidence:
        return await self._end(resident, self._unload_runtime)

    async def _unload_runtime(
        self, runtime: _Runtime, running: RunningRuntime
    ) -> wg.UnloadEvidence:
        """The adapter's unload: the release, the exit and the reclaim check a probe's child
        gets. An adopted endpoint has no process of ours to reclaim: its `stop` forgets it."""
        grace_s = self.settings.stop_grace_s
        if runtime.start is None:
            return await runtime.adapter.stop(running, grace_s=grace_s)
        nvml = self._open_nvml()
        try:
            unloaded = await runtime.adapter.unload(running, grace_s=grace_s, nvml=nvml)
        finally:
            nvml.close()
        log.info("%s runtime unloaded: %s", runtime.adapter.name, unloaded.reclaim.detail)
        evidence = wg.UnloadEvidence()
        evidence.CopyFrom(unloaded.stopped)
        evidence.reclaim.CopyFrom(unloaded.reclaim)
        return evidence

    async def _terminate(self, resident: Resident, plan: StopPlan) -> wg.UnloadEvidence:
        def terminate(runtime: _Runtime, running: RunningRuntime) -> Awaitable[wg.UnloadEvidence]:
            now = asyncio.get_running_loop().time()
            return runtime.adapter.terminate(
                running, grace_s=plan.term_grace_s(now), reap_s=plan.reap_s(now)
            )

        return await self._end(resident, terminate)

    async def _end(
        self,
        resident: Resident,
        stopping: Callable[[_Runtime, RunningRuntime], Awaitable[wg.UnloadEvidence]],
    ) -> wg.UnloadEvidence:
        runtime = self._runtimes.get(resident)
        running = runtime.running if runtime is not None else None
        resident.state = UNLOADING
        self._changed()
        if runtime is not None and running is None and runtime.failed_pid:
            return self._recheck_failed_start(resident, runtime)
        if runtime is None or running is None:
            self._forget(resident)
            return wg.UnloadEvidence(pid=0, process_exited=True)
        evidence = await stopping(runtime, running)
        if evidence.process_exited and (
            not evidence.HasField("reclaim") or evidence.reclaim.reclaimed
        ):
            self._forget(resident)
            return evidence
        if evidence.process_exited:
            # Reaped, but its device memory is not proven back (NVML unreadable, or still
            # listing it): custody stays, UNCERTAIN, and the result carries the reclaim that
            # says why; a later UNLOAD reads NVML again (`reclaim_verdict`).
            self._uncertain(resident, _unverified(resident, evidence.reclaim))
            return evidence
        error = GantryError(
            "RECLAIM_UNVERIFIED",
            f"model host {running.pid} of {resident.deployment_id} was not confirmed gone",
            deployment_id=resident.deployment_id,
            pid=str(running.pid),
        )
        self._uncertain(resident, error)
        raise error

    def _recheck_failed_start(self, resident: Resident, runtime: _Runtime) -> wg.UnloadEvidence:
        """An UNLOAD of a start whose child was not proven gone: gone now (no process of ours at
        its pid) and, on a GPU, NVML no longer listing it, or UNCERTAIN still."""
        pid = runtime.failed_pid
        gone = child_gone(pid)
        reclaim = self._reclaim_of_gone(pid, runtime, reaped=gone)
        evidence = wg.UnloadEvidence(pid=pid, process_exited=gone, reclaim=reclaim)
        if reclaim.reclaimed:
            self._forget(resident)
        else:
            self._uncertain(resident, _unverified(resident, reclaim))
        return evidence

    def _uncertain(self, resident: Resident, error: GantryError) -> None:
        resident.state = UNCERTAIN
        resident.last_failure = error.to_failure()
        self._changed()

    def _forget(self, resident: Resident) -> None:
        """Custody ended (the child is reaped, or never started): drop the resident and the
        private verified copy its hosts loaded from (restarts reused it until now)."""
        runtime = self._runtimes.pop(resident, None)
        if runtime is not None and runtime.prepared is not None:
            discard_copy(runtime.prepared.directory)
        if self.residents.remove(resident):
            self._changed()

    async def _check_resident(self, resident: Resident) -> None:
        if resident.crash_loop and not resident.crashes.crash_loop:
            resident.crash_loop = False  # stayed up past the window: no longer looping
            self._changed()
        host = resident.host
        if resident.state != RESIDENT or host is None or not host.alive:
            return
        self._record_health(resident, await self._probe(resident, host, deep=False))

    async def _probe(
        self, resident: Resident, host: SupervisedHost, *, deep: bool
    ) -> wg.HealthReport:
        """The adapter's health check of a live host. One that leaves its ping unanswered is
        hung: it is killed (its callers fail RUNTIME_UNRESPONSIVE at once) and restarted as a
        crash, unless it went away or was replaced while the check ran."""
        runtime = self._runtimes[resident]
        running = runtime.running
        assert running is not None
        checked = await runtime.adapter.health(
            running,
            deep=deep,
            timeout_s=self.settings.ping_timeout_s,
            model_timeout_s=self.settings.deep_health_timeout_s,
        )
        if checked.unanswered and host is resident.host and host.alive:
            runtime.adapter.kill_unresponsive(running, checked.unanswered)
        return checked.report

    def _record_health(
        self, resident: Resident, report: wg.HealthReport, *, force: bool = False
    ) -> None:
        previous = resident.health
        resident.health = report
        if force or previous is None or _statuses(previous) != _statuses(report):
            self._changed()

    def _changed(self) -> None:
        try:
            self._on_change()
        except Exception:
            log.exception("announcing a resident change failed")


def _unverified(resident: Resident, reclaim: wg.ReclaimEvidence) -> GantryError:
    return GantryError(
        "RECLAIM_UNVERIFIED",
        f"the reclaim of {resident.deployment_id} is unverified: {reclaim.detail}",
        deployment_id=resident.deployment_id,
        pid=str(reclaim.pid),
    )


def _cancelling(task: asyncio.Task[object] | None) -> bool:
    return task is not None and task.cancelling() > 0


def _statuses(report: wg.HealthReport) -> tuple[int, int, int]:
    return (report.process.status, report.runtime.status, report.model.status)
