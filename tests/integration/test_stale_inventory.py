"""A late inventory, end to end: a real in-process control plane and a scripted worker stream.

A replica resumed after SIGSTOP (tests/chaos/test_control_plane_replicas.py, case C) reads the
inventories its stream queued while it was stopped, after another replica applied the worker's
newer LOAD result. Here one stream delivers the same order: the LOAD result (sequence 12), then
an inventory taken before it (sequence 5) that does not list the residency. The residency stays
RESIDENT with its one LOAD; an inventory taken after the result (sequence 13) that does not list
it is judged as always (gone: loaded again). Both stores run it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import SILENT_WORKER, ScriptedWorker

LOAD_RESULT_SEQUENCE = 12
RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT


@pytest.fixture
async def harness(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(database_url, tmp_path, reconciler=SILENT_WORKER) as running:
        yield running


class SequencedWorker(ScriptedWorker):
    """Stamps its results as a worker process does (Inventory.sequence): the first LOAD result
    with LOAD_RESULT_SEQUENCE, each later one with the next number."""

    def __init__(self) -> None:
        super().__init__()
        self.sequence = LOAD_RESULT_SEQUENCE
        self.answer = self._stamped

    def _stamped(self, job: wg.JobAssignment) -> wg.JobResult | None:
        result = self.default_answer(job)
        if result is not None and job.WhichOneof("spec") == "load":
            result.sequence = self.sequence
            self.sequence += 2  # room for the inventory the test sends after it
        return result

    def report(self, sequence: int, *deployment_ids: str) -> None:
        """An inventory stamped `sequence` holding what it holds now, of `deployment_ids` only."""
        residents = [r for d, r in self.residents.items() if d in deployment_ids]
        # A marker no record accounts for: GetInventory shows it once this report is applied.
        residents.append(wg.ResidentModel(deployment_id=f"marker-{sequence}", state=RESIDENT))
        inventory = wg.Inventory(generation=self.generation, sequence=sequence, residents=residents)
        self.send(wg.WorkerMessage(inventory_report=wg.InventoryReport(inventory=inventory)))


async def _load_jobs(harness: Harness, deployment_id: str) -> int:
    listed = await harness.operator.ListServingJobs(
        cp.ListServingJobsRequest(deployment_id=deployment_id, page_size=100),
        metadata=harness.op_md,
    )
    return sum(job.job_type == cp.SERVING_JOB_TYPE_LOAD for job in listed.jobs)


async def _applied(harness: Harness, node_id: str, sequence: int) -> None:
    async def shown() -> bool:
        inventory = await harness.operator.GetInventory(
            cp.GetInventoryRequest(node_id=node_id), metadata=harness.op_md
        )
        return f"marker-{sequence}" in {r.deployment_id for r in inventory.unmanaged}

    await wait_for(shown, timeout=20, what=f"the inventory of sequence {sequence} applied")


async def test_an_inventory_older_than_the_load_result_leaves_the_residency_resident(
    harness: Harness, tiny_model_dir: Path
) -> None:
    worker = SequencedWorker()
    await worker.start(harness.channel, await harness.register_node("sequenced"))
    assert worker.welcome is not None
    node_id = worker.welcome.node_id
    artifact = await harness.register_model(tiny_model_dir, "stale")
    deployment = await harness.deploy(artifact.artifact_set_id, "stale")
    deployment_id = deployment.deployment_id
    await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=20)
    assert await _load_jobs(harness, deployment_id) == 1

    # Taken before the load: it does not list the deployment. Said nothing about its residency.
    worker.report(LOAD_RESULT_SEQUENCE - 7)
    await _applied(harness, node_id, LOAD_RESULT_SEQUENCE - 7)
    after = await harness.deployment(deployment_id)
    assert [r.state for r in after.residencies] == [RESIDENT]
    assert after.state == cp.DEPLOYMENT_STATE_READY
    assert await _load_jobs(harness, deployment_id) == 1

    # Taken after it, and still not listing it: the worker lost it. Gone, and loaded again.
    worker.report(LOAD_RESULT_SEQUENCE + 1)

    async def loaded_again() -> bool:
        return await _load_jobs(harness, deployment_id) == 2

    await wait_for(loaded_again, timeout=20, what="the residency loaded again")
    await harness.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=20)
    await worker.stop()
