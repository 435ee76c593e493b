"""Serving equals probing: a serving residency's LOAD, HEALTH and UNLOAD read NVML per process as a
probe does, and an UNLOAD is COLD only once its process is reaped and NVML no longer lists it.

A real worker agent (in this process) and a real model host on CPU; NVML is the one fake, the
file-backed table of tests/integration/fake_nvml_worker.py, which the test rewrites while the
worker runs. The host's device is made a GPU's at that boundary alone: once NVML lists its pid
(read at a HEALTH check) the worker holds it to a GPU's reclaim, whatever its profile's device.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.nvml_readings import Nvml
from tests.integration.fake_nvml_worker import FileBackedFakeNvml
from tests.integration.harness import Harness, running_gantry, shared_warm_pool, wait_for
from tests.integration.test_external_gpu_usage import GIB, gpu_table
from tests.integration.test_resource_domains import scheduler_snapshot

CAPABILITY = "reclaimed"
UNCERTAIN = common_pb2.RESIDENCY_STATE_UNCERTAIN
COLD = common_pb2.RESIDENCY_STATE_COLD


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        yield harness


async def _gpu_worker(gantry: Harness, table: Path) -> str:
    """A real worker agent whose every NVML reading is the fake's table; its node id."""
    credential = await gantry.register_node("gpu")
    settings = WorkerSettings(
        control_plane=gantry.address, credential=credential, artifact_root=gantry.artifact_root
    )
    agent = WorkerAgent(
        settings,
        warm_pool=shared_warm_pool(),
        open_nvml=lambda: Nvml(FileBackedFakeNvml(table)),
    )
    gantry.workers.append((agent, asyncio.create_task(agent.run())))
    await wait_for(lambda: agent.connected.is_set(), what="worker connected")
    return agent.node_id


async def _jobs(gantry: Harness, deployment_id: str, job_type: int) -> list[cp.ServingJob]:
    listed = await gantry.operator.ListServingJobs(
        cp.ListServingJobsRequest(deployment_id=deployment_id), metadata=gantry.op_md
    )
    return [job for job in listed.jobs if job.job_type == job_type]


async def _residency(gantry: Harness, deployment_id: str) -> common_pb2.Residency:
    return (await gantry.deployment(deployment_id)).residencies[0]


async def _reserved(gantry: Harness, node_id: str) -> int:
    """What the node's RAM ledger holds for its residencies (the VRAM domain's reading moves
    with what NVML lists; the residency's envelope is RAM here: its profile's device is CPU)."""
    snapshot = await scheduler_snapshot(gantry)
    return sum(
        e.reserved_bytes
        for e in snapshot.ledger
        if e.node_id == node_id and e.domain.kind == common_pb2.RESOURCE_KIND_RAM
    )


async def _unload_settled(
    gantry: Harness, deployment_id: str, detail: str
) -> tuple[common_pb2.Residency, cp.ServingJob]:
    """The residency once an UNLOAD whose reclaim detail names `detail` has been committed."""
    seen: list[object] = []

    async def answered() -> bool:
        jobs = await _jobs(gantry, deployment_id, cp.SERVING_JOB_TYPE_UNLOAD)
        seen[:] = [job.unload.reclaim.detail for job in jobs]
        return any(detail in job.unload.reclaim.detail for job in jobs)

    await wait_for(answered, timeout=30, what=f"an UNLOAD saying {detail!r}", last=seen)
    jobs = await _jobs(gantry, deployment_id, cp.SERVING_JOB_TYPE_UNLOAD)
    return await _residency(gantry, deployment_id), next(
        job for job in jobs if detail in job.unload.reclaim.detail
    )


async def test_an_unload_is_cold_only_once_nvml_proves_the_gpu_process_gone(
    gantry: Harness, tiny_model_dir: Path, tmp_path: Path
) -> None:
    table = tmp_path / "gpus.json"
    gpu_table(table)
    node_id = await _gpu_worker(gantry, table)
    artifact = await gantry.register_model(tiny_model_dir, CAPABILITY)
    deployment = await gantry.deploy(artifact.artifact_set_id, CAPABILITY)
    deployment_id = deployment.deployment_id
    await gantry.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_READY)
    pid = (await _residency(gantry, deployment_id)).pid

    # LOAD's evidence is the probe's kind: NVML read for the pid (not listed yet), the
    # allocator readings a serving host does not report said unavailable, never zero.
    (load,) = await _jobs(gantry, deployment_id, cp.SERVING_JOB_TYPE_LOAD)
    memory = load.load.memory
    assert memory.nvml_process_used.WhichOneof("value") == "bytes"
    assert f"pid {pid} not listed" in memory.nvml_process_used.source
    assert memory.rss_current.bytes > 0
    assert "reports no allocator readings" in memory.cuda_allocated_after_load.unavailable

    # NVML now lists the host holding device memory: a HEALTH check reads it.
    gpu_table(table, (pid, GIB))
    checked = await gantry.operator.CheckDeploymentHealth(
        cp.CheckDeploymentHealthRequest(deployment_id=deployment_id), metadata=gantry.op_md
    )
    (health_job,) = checked.jobs

    async def health_read() -> bool:
        jobs = await _jobs(gantry, deployment_id, cp.SERVING_JOB_TYPE_HEALTH)
        done = [j for j in jobs if j.job_id == health_job.job_id and j.HasField("health_memory")]
        return bool(done) and done[0].health_memory.nvml_process_used.bytes == GIB

    await wait_for(health_read, timeout=30, what="the HEALTH job's NVML reading of the pid")
    charged = await _reserved(gantry, node_id)
    assert charged > 0

    # NVML cannot be read: the host exits and is reaped, yet its device memory is unproven.
    table.write_text("not json: NVML cannot be read")
    await gantry.operator.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=deployment_id), metadata=gantry.op_md
    )
    residency, unload = await _unload_settled(gantry, deployment_id, "NVML could not be read")
    assert (residency.state, residency.last_failure.reason) == (UNCERTAIN, "RECLAIM_UNVERIFIED")
    reclaim = unload.unload.reclaim
    assert (reclaim.process_exited, reclaim.reaped, reclaim.on_gpu) == (True, True, True)
    assert not reclaim.reclaimed
    assert reclaim.nvml_process_used_before.unavailable  # read, and said why it could not be
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone: only NVML's silence keeps it UNCERTAIN
    assert await _reserved(gantry, node_id) == charged  # its charge is kept

    # NVML reads again and still lists the pid: the retried UNLOAD stays unverified.
    gpu_table(table, (pid, GIB))
    residency, unload = await _unload_settled(gantry, deployment_id, "NVML still lists the pid")
    assert residency.state == UNCERTAIN
    assert unload.unload.reclaim.nvml_process_used_after.bytes == GIB
    assert await _reserved(gantry, node_id) == charged

    # NVML lets go of the pid: the next retry proves the reclaim, and only now is it COLD.
    gpu_table(table)
    residency, unload = await _unload_settled(gantry, deployment_id, "NVML lists no device memory")
    assert unload.unload.reclaim.reclaimed
    await gantry.wait_deployment(deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    assert (await _residency(gantry, deployment_id)).state == COLD

    async def released() -> bool:
        return await _reserved(gantry, node_id) == 0

    await wait_for(released, what="the residency's charge released")
