"""Liveness and health of the serving residents (supervision.py holds their loads): one loop
pings every resident host each interval through its adapter's `health`, a HEALTH job checks one
deeper. A host that misses a ping deadline is hung: it is SIGKILLed (its callers fail at once with
RUNTIME_UNRESPONSIVE) and restarted like a crash (`supervision_restarts`). Routine pings change
nothing reported unless a health layer's status changes. Mixed into `Supervisor`, whose state it
reads and moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.residents import RESIDENT, Resident, ResidentMap, SupervisedHost
from gantry.worker.runtime_adapters.base import health_report

if TYPE_CHECKING:
    from gantry.worker.supervision import SupervisionSettings, _Runtime

OK = wg.HEALTH_STATUS_OK
FAILED = wg.HEALTH_STATUS_FAILED
NOT_CHECKED = wg.HEALTH_STATUS_NOT_CHECKED


class SupervisionHealth:
    if TYPE_CHECKING:  # what of Supervisor these checks read and move
        settings: SupervisionSettings
        residents: ResidentMap
        _clock: Clock
        _runtimes: dict[Resident, _Runtime]
        _memory_now: Callable[[_Runtime, SupervisedHost], wg.MemoryEvidence | None]
        _changed: Callable[[], None]

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


def _statuses(report: wg.HealthReport) -> tuple[int, int, int]:
    return (report.process.status, report.runtime.status, report.model.status)
