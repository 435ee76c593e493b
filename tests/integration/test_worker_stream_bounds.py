"""Issue 26, items 5 and 6, on a real control plane with a hand-driven worker stream: a node
credential can neither flood the control plane (every field bounded on receipt, logs bounded and
rate-limited) nor make a deployment READY with evidence of bytes it never verified."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import wait_for
from tests.integration.pipeline_support import Pipeline, audited, make_model_dir, pipeline_of
from tests.integration.scripted_worker import ScriptedWorker

JOB_ID = "0b7c2f4e-9f1a-4d55-8f0e-2d3c1b0a9e88"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path)


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, model_dir, clock=None):
        yield pipeline


async def _refused_and_closed(worker: ScriptedWorker, field: str) -> None:
    await asyncio.wait_for(worker.ended.wait(), 10)
    assert worker.rejects, "the worker is told why before its stream closes"
    failure = worker.rejects[-1].failure
    assert failure.reason == "INVALID_ARGUMENT"
    assert failure.metadata["field"] == field


async def test_an_oversize_progress_string_is_refused_and_never_logged_whole(
    gantry: Pipeline, caplog: pytest.LogCaptureFixture
):
    worker = await gantry.worker("flooder")
    with caplog.at_level(logging.DEBUG):
        worker.send(
            wg.WorkerMessage(job_update=wg.JobUpdate(job_id=JOB_ID, progress="x" * 8_000_000))
        )
        await _refused_and_closed(worker, "WorkerMessage.job_update.progress")
    assert worker.rejects[-1].failure.metadata["value"] == "8000000"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "x" * 1_000 not in logged
    assert max(len(record.getMessage()) for record in caplog.records) < 10_000
    # The node dials again and is served as before.
    again = await gantry.worker("flooder", generation=worker.generation)
    assert again.welcome is not None


async def test_a_heartbeat_naming_40000_jobs_is_refused(gantry: Pipeline):
    worker = await gantry.worker("beater")
    worker.heartbeat([JOB_ID] * 40_000)
    await _refused_and_closed(worker, "WorkerMessage.heartbeat.active_job_ids")
    assert worker.rejects[-1].failure.metadata["value"] == "40000"


async def test_a_hello_past_its_bounds_is_refused_as_the_call_status(gantry: Pipeline):
    credential = await gantry.harness.register_node("huge-hello")
    worker = ScriptedWorker()
    worker.residents = {
        f"d{index}": wg.ResidentModel(deployment_id=f"d{index}") for index in range(1_025)
    }
    await worker.start(gantry.harness.channel, credential, wait=False)
    await asyncio.wait_for(worker.ended.wait(), 10)
    assert worker.end_error is not None and worker.welcome is None
    assert worker.end_error.code().name == "INVALID_ARGUMENT"
    node = await gantry.node("huge-hello")
    assert node.state == common_pb2.NODE_STATE_REGISTERED  # nothing of it was kept


def _fake_load(worker: ScriptedWorker):  # type: ignore[no-untyped-def]
    """What the review's impostor answered a LOAD with: no digest, nothing verified, no
    isolation; every other job as usual."""

    def answer(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") != "load":
            return worker.default_answer(job)
        return wg.JobResult(
            job_id=job.job_id, lease_token=job.lease_token, load=wg.LoadEvidence(pid=1, dim=4)
        )

    return answer


async def test_fake_load_evidence_does_not_make_a_deployment_ready(gantry: Pipeline):
    worker = await gantry.worker("liar")
    worker.answer = _fake_load(worker)
    approval = await gantry.approved()
    deployment = await gantry.deploy(approval.approval_id, "lied-to")

    async def refused() -> bool:
        current = await gantry.harness.deployment(deployment.deployment_id)
        return any(r.last_failure.reason == "LOAD_EVIDENCE_MISMATCH" for r in current.residencies)

    await wait_for(refused, timeout=20, what="the load refused for its evidence")
    current = await gantry.harness.deployment(deployment.deployment_id)
    assert current.state != cp.DEPLOYMENT_STATE_READY
    # The refused load may be retried meanwhile (a new residency): the one refused is read.
    assert all(r.state != common_pb2.RESIDENCY_STATE_RESIDENT for r in current.residencies)
    [residency, *_] = [
        r for r in current.residencies if r.last_failure.reason == "LOAD_EVIDENCE_MISMATCH"
    ]
    events = await audited(gantry, "load.evidence_refused", residency.residency_id)
    assert events and events[0].detail["reason"] == "LOAD_EVIDENCE_MISMATCH"
    assert events[0].actor.startswith("node:")
