"""Serving jobs on the worker: one at a time per deployment, in arrival order, each cancellable.

What the control plane can rely on:
- Jobs for one deployment id run one after another (FIFO); jobs for different ids run in parallel.
  An INSPECT or PROBE job queues alone (by its assessment or probe id).
- `CancelJob` cancels a queued or running job and the worker sends **no** JobResult for it: the
  control plane cancelled it and settles it itself. A LOAD or PROBE cancelled this way leaves no
  process (its child is killed and reaped before the job ends).
- An UNLOAD overtakes the LOADs of its deployment instead of waiting behind them: each such LOAD
  (queued or running) is cancelled the same way and answered with the failure
  INVALID_STATE_TRANSITION ("an unload overtook it") so its lease settles; then the unload runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gantry.common.errors import GantryError
from gantry.v1 import worker_gateway_pb2 as wg

log = logging.getLogger(__name__)

RunJob = Callable[[wg.JobAssignment], Coroutine[Any, Any, wg.JobResult]]
EmitResult = Callable[[wg.JobResult], None]


@dataclass(eq=False, kw_only=True)
class _Job:
    assignment: wg.JobAssignment
    deployment_id: str
    task: asyncio.Task[wg.JobResult] | None = None
    # Cancelled because an unload overtook it: answered with a failure, unlike a CancelJob.
    overtaken: bool = False

    @property
    def kind(self) -> str | None:
        return self.assignment.WhichOneof("spec")

    def overtaken_result(self) -> wg.JobResult:
        error = GantryError(
            "INVALID_STATE_TRANSITION",
            f"the load of {self.deployment_id} was cancelled: an unload overtook it",
            deployment_id=self.deployment_id,
        )
        return wg.JobResult(
            job_id=self.assignment.job_id,
            lease_token=self.assignment.lease_token,
            failure=error.to_failure(),
        )


def deployment_of(assignment: wg.JobAssignment) -> str:
    """The queue a job waits in: its deployment's, or its own assessment's or probe's (INSPECT
    and PROBE jobs belong to no deployment, so they never wait behind one)."""
    spec = assignment.WhichOneof("spec")
    if spec is None:
        return ""
    if spec == "inspect":
        return f"inspect:{assignment.inspect.assessment_id}"
    if spec == "probe":
        return f"probe:{assignment.probe.probe_id}"
    deployment_id: str = getattr(assignment, spec).deployment_id
    return deployment_id


class DeploymentJobQueues:
    def __init__(self, *, run: RunJob, emit: EmitResult) -> None:
        self._run = run
        self._emit = emit
        self._queued: dict[str, collections.deque[_Job]] = {}
        self._running: dict[str, _Job] = {}
        self._drainers: dict[str, asyncio.Task[None]] = {}

    def submit(self, assignment: wg.JobAssignment) -> None:
        job = _Job(assignment=assignment, deployment_id=deployment_of(assignment))
        if job.kind == "unload":
            self._overtake_loads(job.deployment_id)
        self._queued.setdefault(job.deployment_id, collections.deque()).append(job)
        if job.deployment_id not in self._drainers:
            self._drainers[job.deployment_id] = asyncio.create_task(
                self._drain(job.deployment_id), name=f"jobs-{job.deployment_id}"
            )

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued or running job; it sends no result. False if it is not here."""
        for deployment_id, queue in self._queued.items():
            for job in queue:
                if job.assignment.job_id == job_id:
                    queue.remove(job)
                    log.info("cancelled queued job %s of %s", job_id, deployment_id)
                    return True
        for job in self._running.values():
            if job.assignment.job_id == job_id and job.task is not None:
                job.task.cancel()
                log.info("cancelling running job %s of %s", job_id, job.deployment_id)
                return True
        return False

    def active_job_ids(self) -> list[str]:
        ids = [job.assignment.job_id for job in self._running.values()]
        ids += [job.assignment.job_id for queue in self._queued.values() for job in queue]
        return sorted(ids)

    async def close(self) -> None:
        for drainer in list(self._drainers.values()):
            drainer.cancel()
        for job in list(self._running.values()):
            if job.task is not None:
                job.task.cancel()
        for task in [*self._drainers.values(), *(j.task for j in self._running.values() if j.task)]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _overtake_loads(self, deployment_id: str) -> None:
        queue = self._queued.get(deployment_id, collections.deque())
        for job in [j for j in queue if j.kind == "load"]:
            queue.remove(job)
            self._emit(job.overtaken_result())
        running = self._running.get(deployment_id)
        if running is not None and running.kind == "load" and running.task is not None:
            running.overtaken = True
            running.task.cancel()

    async def _drain(self, deployment_id: str) -> None:
        queue = self._queued[deployment_id]
        try:
            while queue:
                job = queue.popleft()
                self._running[deployment_id] = job
                job.task = asyncio.create_task(
                    self._run(job.assignment), name=f"job-{job.assignment.job_id}"
                )
                # wait() rather than await: a cancelled job must not end this drainer.
                await asyncio.wait({job.task})
                del self._running[deployment_id]
                if not job.task.cancelled():
                    self._emit(job.task.result())
                elif job.overtaken:
                    self._emit(job.overtaken_result())
        finally:
            self._running.pop(deployment_id, None)
            del self._drainers[deployment_id]
            if not queue:
                del self._queued[deployment_id]
