"""Worker job queues: FIFO per deployment, CancelJob sends nothing, an unload overtakes loads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.jobs import DeploymentJobQueues
from tests.waiting import poll


def _load(job_id: str, deployment_id: str) -> wg.JobAssignment:
    return wg.JobAssignment(job_id=job_id, load=wg.LoadSpec(deployment_id=deployment_id))


def _unload(job_id: str, deployment_id: str) -> wg.JobAssignment:
    return wg.JobAssignment(job_id=job_id, unload=wg.UnloadSpec(deployment_id=deployment_id))


class _Recorder:
    """Runs each job until the test releases it, and records starts, cancels and results."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.results: list[wg.JobResult] = []
        self.release: dict[str, asyncio.Event] = {}

    async def run(self, assignment: wg.JobAssignment) -> wg.JobResult:
        self.started.append(assignment.job_id)
        gate = self.release.setdefault(assignment.job_id, asyncio.Event())
        try:
            await gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(assignment.job_id)
            raise
        return wg.JobResult(job_id=assignment.job_id, unload=wg.UnloadEvidence())

    def finish(self, job_id: str) -> None:
        self.release.setdefault(job_id, asyncio.Event()).set()

    def result_ids(self) -> list[str]:
        return [result.job_id for result in self.results]


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for the state a step leads to (the queues hop through a few tasks per job); what is
    asserted beside it is checked once it holds."""
    await poll(condition, 5.0, what)


async def test_jobs_of_different_deployments_run_in_parallel() -> None:
    recorder = _Recorder()
    queues = DeploymentJobQueues(run=recorder.run, emit=recorder.results.append)
    queues.submit(_load("a1", "dep-a"))
    queues.submit(_load("b1", "dep-b"))
    await _until(lambda: len(recorder.started) == 2, "both deployments' jobs to start")
    assert recorder.started == ["a1", "b1"]
    assert queues.active_job_ids() == ["a1", "b1"]
    recorder.finish("b1")
    await _until(lambda: bool(recorder.results), "b1's result")
    assert recorder.result_ids() == ["b1"]
    recorder.finish("a1")
    await _until(lambda: len(recorder.results) == 2, "a1's result")
    assert recorder.result_ids() == ["b1", "a1"]
    await queues.close()


async def test_fifo_within_one_deployment() -> None:
    recorder = _Recorder()
    queues = DeploymentJobQueues(run=recorder.run, emit=recorder.results.append)
    for job_id in ("h1", "h2", "h3"):
        queues.submit(wg.JobAssignment(job_id=job_id, health=wg.HealthSpec(deployment_id="dep-a")))
    await _until(lambda: bool(recorder.started), "the first job to start")
    assert recorder.started == ["h1"]
    recorder.finish("h1")
    await _until(lambda: len(recorder.started) == 2, "the second job to start")
    assert recorder.started == ["h1", "h2"]
    recorder.finish("h2")
    recorder.finish("h3")
    await _until(lambda: len(recorder.results) == 3, "the three results")
    assert recorder.result_ids() == ["h1", "h2", "h3"]
    await queues.close()


async def test_cancelled_job_sends_no_result_queued_or_running() -> None:
    recorder = _Recorder()
    queues = DeploymentJobQueues(run=recorder.run, emit=recorder.results.append)
    queues.submit(_load("running", "dep-a"))
    queues.submit(wg.JobAssignment(job_id="queued", health=wg.HealthSpec(deployment_id="dep-a")))
    await _until(lambda: recorder.started == ["running"], "the first job to start")
    assert queues.cancel("queued")
    assert queues.cancel("running")
    assert not queues.cancel("unknown")
    await _until(lambda: bool(recorder.cancelled), "the running job to see its cancel")
    assert recorder.cancelled == ["running"]
    assert recorder.results == []
    assert queues.active_job_ids() == []


async def test_unload_overtakes_running_and_queued_loads_which_fail_explicitly() -> None:
    recorder = _Recorder()
    queues = DeploymentJobQueues(run=recorder.run, emit=recorder.results.append)
    queues.submit(_load("load-1", "dep-a"))
    await _until(lambda: recorder.started == ["load-1"], "the load to start")
    queues.submit(_load("load-2", "dep-a"))
    queues.submit(_unload("unload", "dep-a"))
    await _until(
        lambda: len(recorder.started) == 2 and len(recorder.results) == 2,
        "the unload to start and both loads to fail",
    )
    assert recorder.cancelled == ["load-1"]
    assert recorder.started == ["load-1", "unload"]
    failures = {r.job_id: r.failure.reason for r in recorder.results}
    assert failures == {
        "load-2": "INVALID_STATE_TRANSITION",
        "load-1": "INVALID_STATE_TRANSITION",
    }
    recorder.finish("unload")
    await _until(lambda: len(recorder.results) == 3, "the unload's result")
    assert recorder.results[-1].WhichOneof("outcome") == "unload"
    await queues.close()


async def test_inspect_and_probe_jobs_queue_alone_and_are_renewed_like_any_job() -> None:
    recorder = _Recorder()
    queues = DeploymentJobQueues(run=recorder.run, emit=recorder.results.append)
    queues.submit(_load("l1", "dep-a"))
    queues.submit(wg.JobAssignment(job_id="p1", probe=wg.ProbeSpec(probe_id="probe-1")))
    queues.submit(wg.JobAssignment(job_id="p2", probe=wg.ProbeSpec(probe_id="probe-2")))
    queues.submit(wg.JobAssignment(job_id="i1", inspect=wg.InspectSpec(assessment_id="a-1")))
    await _until(lambda: len(recorder.started) == 4, "the four jobs to start")
    # None waits behind the deployment's load or behind another probe.
    assert recorder.started == ["l1", "p1", "p2", "i1"]
    assert queues.active_job_ids() == ["i1", "l1", "p1", "p2"]
    assert queues.cancel("p1")
    await _until(lambda: bool(recorder.cancelled), "the probe to see its cancel")
    assert recorder.cancelled == ["p1"]
    assert queues.active_job_ids() == ["i1", "l1", "p2"]
    for job_id in ("l1", "p2", "i1"):
        recorder.finish(job_id)
    await _until(lambda: len(recorder.results) == 3, "the three results")
    assert sorted(recorder.result_ids()) == ["i1", "l1", "p2"]  # a cancelled probe sends nothing
    await queues.close()
