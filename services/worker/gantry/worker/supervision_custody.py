"""Ending a serving resident's custody (supervision.py holds its loads): the stop, the worker's
own terminate, a failed or cancelled start, and the reclaim each must prove before the resident
leaves the map. Mixed into `Supervisor`, whose state it reads and moves.

A resident leaves only once its child is reaped and reclaim is verified (the probe's rule,
`reclaim_verdict`: on a GPU, NVML read and no longer listing the pid); what cannot prove that
stays UNCERTAIN, still holding its pid, and a later UNLOAD looks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import discard_copy
from gantry.worker.residents import UNCERTAIN, UNLOADING, Resident, ResidentMap, SupervisedHost
from gantry.worker.runtime_adapters.base import RunningRuntime
from gantry.worker.runtime_adapters.serving_evidence import child_gone, reclaim_of_gone
from gantry.worker.stop_plan import StopPlan

if TYPE_CHECKING:
    from gantry.worker.nvml_readings import Nvml
    from gantry.worker.supervision import SupervisionSettings, _Runtime

# Supervision's one logger, whichever of its parts logs: what operators filter on.
log = logging.getLogger("gantry.worker.supervision")


class SupervisionCustody:
    if TYPE_CHECKING:  # what of Supervisor these steps read and move
        settings: SupervisionSettings
        residents: ResidentMap
        _runtimes: dict[Resident, _Runtime]
        _open_nvml: Callable[[], Nvml]
        _changed: Callable[[], None]

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


def _unverified(resident: Resident, reclaim: wg.ReclaimEvidence) -> GantryError:
    return GantryError(
        "RECLAIM_UNVERIFIED",
        f"the reclaim of {resident.deployment_id} is unverified: {reclaim.detail}",
        deployment_id=resident.deployment_id,
        pid=str(reclaim.pid),
    )
