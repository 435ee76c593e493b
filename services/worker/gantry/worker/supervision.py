"""Supervision of the worker's model hosts: starts, in-place restarts, liveness, health, custody.

Invariants this module keeps:
- A resident stays in the map until its child is reaped and reclaim is verified; a stop that
  cannot confirm that leaves it UNCERTAIN (still holding its pid), never silently forgotten.
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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gantry.common.clock import Clock, SystemClock
from gantry.common.errors import GantryError
from gantry.common.manifest import remove_verified_copy
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker import metrics
from gantry.worker.crash_policy import CrashHistory, RestartDecision, RestartPolicy
from gantry.worker.exit_cause import OomCounter, classify_exit
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.residents import (
    DEFAULT_MAX_RESIDENTS,
    LOADING,
    RESIDENT,
    UNCERTAIN,
    UNLOADING,
    HostFactory,
    Resident,
    ResidentFacts,
    ResidentMap,
    SupervisedHost,
)
from gantry.worker.runtime_adapters.base import health_report
from gantry.worker.stop_plan import StopPlan

log = logging.getLogger(__name__)

OK = wg.HEALTH_STATUS_OK
FAILED = wg.HEALTH_STATUS_FAILED
NOT_CHECKED = wg.HEALTH_STATUS_NOT_CHECKED


@dataclass(frozen=True, kw_only=True)
class SupervisionSettings:
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    ping_interval_s: float = 5.0
    ping_timeout_s: float = 3.0
    # A deep health check runs a forward pass queued behind real work: give it room.
    deep_health_timeout_s: float = 30.0
    stop_grace_s: float = 10.0
    max_residents: int = DEFAULT_MAX_RESIDENTS


class Supervisor:
    def __init__(
        self,
        settings: SupervisionSettings,
        *,
        on_change: Callable[[], None],
        clock: Clock | None = None,
        host_factory: HostFactory | None = None,
        oom_counter: OomCounter | None = None,
    ) -> None:
        self.settings = settings
        self.residents = ResidentMap(max_residents=settings.max_residents)
        self._on_change = on_change
        self._clock = clock or SystemClock()
        self._host_factory: HostFactory = host_factory or ModelHost.start
        self._oom_counter = oom_counter or OomCounter.for_current_process()
        self._shutting_down = False

    # ---- load and unload ----------------------------------------------------------------------

    async def load(
        self,
        deployment_id: str,
        facts: ResidentFacts,
        prepare: Callable[[], Awaitable[HostLaunchSpec]],
        *,
        trace_context: dict[str, str],
    ) -> Resident:
        """Admit, prepare (verify the artifact), start the host; RESIDENT when this returns.

        An unload meanwhile cancels the start (the child is killed and reaped) and this raises
        INVALID_STATE_TRANSITION. Cancelling the caller cancels the start the same way.
        """
        resident = Resident(
            deployment_id=deployment_id,
            facts=facts,
            crashes=CrashHistory(self.settings.restart, self._clock),
        )
        self.residents.admit(resident)
        self._changed()

        async def start() -> SupervisedHost | None:
            resident.launch = await prepare()
            host = await self._start(resident, trace_context)
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

    async def _release(self, resident: Resident, task: asyncio.Task[SupervisedHost | None]) -> None:
        """End custody of a load that did not return. A cancellation can land after the start
        task finished but before this caller resumed (a CancelJob or an overtaking unload in
        that window): the host then runs, RESIDENT, and forgetting it would orphan the process.
        It is stopped here instead, so the unload queued behind this job finds nothing left."""
        if task.done() and not task.cancelled() and task.exception() is None:
            with contextlib.suppress(GantryError):  # unverified: it stays, UNCERTAIN
                await self._stop(resident)
            return
        self._forget(resident)

    def adopt(
        self, deployment_id: str, facts: ResidentFacts, host: SupervisedHost, *, endpoint_url: str
    ) -> Resident:
        """Hold an external server (already checked to answer) as RESIDENT. It has no launch, so
        nothing here can restart it, and it never reports an exit: its failed pings only mark
        its health. Unloading it goes through `_stop`, which only forgets it."""
        resident = Resident(
            deployment_id=deployment_id,
            facts=facts,
            crashes=CrashHistory(self.settings.restart, self._clock),
            adopted=True,
            endpoint_url=endpoint_url,
        )
        self.residents.admit(resident)
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
        """Stop the host and end custody once reclaim is verified; UNCERTAIN and
        RECLAIM_UNVERIFIED otherwise. Cancels a load or restart in progress first."""
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
        return wg.HealthEvidence(pid=host.pid, report=report)

    # ---- internals ----------------------------------------------------------------------------

    async def _start(self, resident: Resident, trace_context: dict[str, str]) -> SupervisedHost:
        assert resident.launch is not None
        oom_kills = self._oom_counter.read()
        restart = resident.restart_count > 0
        try:
            host = await self._host_factory(
                resident.launch, on_exit=self._host_exited, trace_context=trace_context
            )
        except GantryError as error:
            metrics.host_started(restart=restart, failure_reason=error.reason)
            raise
        except Exception:
            metrics.host_started(restart=restart, failure_reason="LOAD_FAILED")
            raise
        metrics.host_started(restart=restart)
        resident.oom_kills_at_start = oom_kills
        return host

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
        resident.start_task = asyncio.create_task(
            self._restart(resident, host, decision), name=f"restart-{resident.deployment_id}"
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
        self, resident: Resident, crashed: SupervisedHost, decision: RestartDecision
    ) -> SupervisedHost | None:
        # Already reaped; stopping closes the pipe and collects the stderr tail.
        with contextlib.suppress(Exception):
            await crashed.stop(grace_s=0)
        while True:
            await self._clock.sleep(decision.delay_s)
            resident.next_restart_at = None
            resident.restart_count += 1
            metrics.host_restart_attempted()
            self._changed()
            try:
                host = await self._start(resident, {})
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
        return await self._end(resident, lambda host: host.stop(grace_s=self.settings.stop_grace_s))

    async def _terminate(self, resident: Resident, plan: StopPlan) -> wg.UnloadEvidence:
        def terminate(host: SupervisedHost) -> Awaitable[wg.UnloadEvidence]:
            now = asyncio.get_running_loop().time()
            return host.terminate(grace_s=plan.term_grace_s(now), reap_s=plan.reap_s(now))

        return await self._end(resident, terminate)

    async def _end(
        self,
        resident: Resident,
        stopping: Callable[[SupervisedHost], Awaitable[wg.UnloadEvidence]],
    ) -> wg.UnloadEvidence:
        host = resident.host
        resident.state = UNLOADING
        self._changed()
        if host is None:
            self._forget(resident)
            return wg.UnloadEvidence(pid=0, process_exited=True)
        evidence = await stopping(host)
        if evidence.process_exited:
            self._forget(resident)
            return evidence
        error = GantryError(
            "RECLAIM_UNVERIFIED",
            f"model host {host.pid} of {resident.deployment_id} was not confirmed gone",
            deployment_id=resident.deployment_id,
            pid=str(host.pid),
        )
        resident.state = UNCERTAIN
        resident.last_failure = error.to_failure()
        self._changed()
        raise error

    def _forget(self, resident: Resident) -> None:
        """Custody ended (the child is reaped, or never started): drop the resident and the
        private verified copy its hosts loaded from (restarts reused it until now)."""
        if resident.launch is not None:
            try:
                remove_verified_copy(resident.launch.model_directory)
            except (OSError, ValueError) as error:
                log.warning(
                    "could not remove the verified copy of %s: %s", resident.deployment_id, error
                )
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
        started = time.monotonic()
        process = (OK, f"pid {host.pid} alive")
        try:
            await host.ping(timeout_s=self.settings.ping_timeout_s)
        except GantryError as error:
            if error.reason == "DEADLINE_EXCEEDED" and host is resident.host and host.alive:
                why = f"no answer to a ping within {self.settings.ping_timeout_s:g}s"
                host.kill_unresponsive(why)
                return health_report(process=process, runtime=(FAILED, why), model=_unchecked(deep))
            return health_report(
                process=process, runtime=(FAILED, error.message), model=_unchecked(deep)
            )
        runtime = (OK, f"ping answered in {time.monotonic() - started:.3f}s")
        if not deep:
            return health_report(
                process=process, runtime=runtime, model=_unchecked(deep), since=started
            )
        try:
            checked = await host.check_model(timeout_s=self.settings.deep_health_timeout_s)
        except GantryError as error:
            return health_report(process=process, runtime=runtime, model=(FAILED, error.message))
        model = (checked.model.status, checked.model.detail)
        return health_report(process=process, runtime=runtime, model=model, since=started)

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


def _cancelling(task: asyncio.Task[object] | None) -> bool:
    return task is not None and task.cancelling() > 0


def _unchecked(deep: bool) -> tuple[wg.HealthStatus, str]:
    if deep:
        return (NOT_CHECKED, "the runtime did not answer, so the model was not run")
    return (NOT_CHECKED, "a liveness ping does not run the model")


def _statuses(report: wg.HealthReport) -> tuple[int, int, int]:
    return (report.process.status, report.runtime.status, report.model.status)
