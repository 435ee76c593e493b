"""Restarts in place (supervision.py holds the first start): a host that exits on its own
(a crash, an OOM kill, or killed as hung) is started again with the same verified directory,
adapter and interpreter after the backoff `CrashHistory` decides; while down it is LOADING with
`last_failure`, `restart_count` and `next_restart_at`. A crash loop keeps restarting, slowly.
Mixed into `Supervisor`, whose state it reads and moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.worker import metrics
from gantry.worker.crash_policy import RestartDecision
from gantry.worker.exit_cause import OomCounter, classify_exit
from gantry.worker.residents import LOADING, RESIDENT, Resident, ResidentMap, SupervisedHost
from gantry.worker.runtime_adapters.base import RunningRuntime, health_report
from gantry.worker.supervision_health import FAILED, NOT_CHECKED

if TYPE_CHECKING:
    from gantry.worker.supervision import SupervisionSettings, _Runtime

# Supervision's one logger, whichever of its parts logs: what operators filter on.
log = logging.getLogger("gantry.worker.supervision")


class SupervisionRestarts:
    if TYPE_CHECKING:  # what of Supervisor these steps read and move
        settings: SupervisionSettings
        residents: ResidentMap
        _clock: Clock
        _oom_counter: OomCounter
        _runtimes: dict[Resident, _Runtime]
        _shutting_down: bool
        _start: Callable[[Resident, _Runtime, dict[str, str]], Awaitable[SupervisedHost]]
        _now_resident: Callable[[Resident, SupervisedHost], None]
        _changed: Callable[[], None]

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
