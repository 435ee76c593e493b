"""A CUDA deployment's VRAM charge from its probe: unknown VRAM (no estimate, nothing measured)
keeps it PENDING with VRAM_UNMEASURED and charges nothing; a measured peak (the larger of NVML's
per-process figure and the allocator's peak) is charged with its margin in the GPU's ledger.

The scheduler and control plane run in this process (real gRPC, a real database); the worker is a
scripted stream whose probe reports what a GPU node's would. Time is a ManualClock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gantry.controlplane.evidence.envelope import vram_with_margin
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import gantry_on_a_manual_clock
from tests.integration.scripted_worker import ScriptedWorker, healthy_probe_evidence, host_ram
from tests.integration.test_resource_domains import SETTINGS, World, scheduler_snapshot

GIB = 1 << 30
GPU0 = common_pb2.ResourceDomain(
    name="gpu0.vram", kind=common_pb2.RESOURCE_KIND_VRAM, capacity_bytes=16 * GIB, device=0
)


@pytest.fixture
async def world(database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    async with gantry_on_a_manual_clock(database_url, tmp_path, SETTINGS) as (harness, clock):
        world = World(harness=harness, clock=clock, workers=[])
        try:
            yield world
        finally:
            for worker in world.workers:
                await worker.stop()


def measured_on_gpu(nvml: int, allocator: int) -> Callable[[wg.ProbeSpec], wg.ProbeEvidence]:
    """A GPU node's probe: NVML's figure for the host's process and the allocator's peak."""

    def evidence(probe: wg.ProbeSpec) -> wg.ProbeEvidence:
        found = healthy_probe_evidence(probe)
        found.memory.nvml_process_used.CopyFrom(common_pb2.Measurement(bytes=nvml, source="nvml"))
        found.memory.cuda_peak_allocated.CopyFrom(
            common_pb2.Measurement(bytes=allocator, source="torch.cuda.max_memory_allocated")
        )
        return found

    return evidence


async def vram_reserved(world: World) -> dict[str, int]:
    snapshot = await scheduler_snapshot(world.harness)
    return {e.node_id: e.reserved_bytes for e in snapshot.ledger if e.domain.name == "gpu0.vram"}


async def test_a_cuda_deployment_with_unknown_vram_stays_pending_and_charges_nothing(
    world: World, tiny_model_dir: Path
) -> None:
    worker: ScriptedWorker = await world.worker("gpu", host_ram(64 * GIB), GPU0)
    assert worker.probe_evidence is healthy_probe_evidence  # NVML unread, CUDA unavailable
    artifact = await world.harness.register_model(tiny_model_dir, "unmeasured")
    deployment = await world.harness.deploy(artifact.artifact_set_id, "unmeasured", device="cuda:0")

    pending = await world.harness.deployment(deployment.deployment_id)
    assert pending.state == cp.DEPLOYMENT_STATE_PENDING
    assert pending.last_failure.reason == "VRAM_UNMEASURED", pending.last_failure
    assert "cuda:0" in pending.last_failure.message
    assert list(pending.residencies) == []
    await world.reconcile()  # asked again: still unknown, still not placed
    still = await world.harness.deployment(deployment.deployment_id)
    assert (still.state, still.last_failure.reason) == (
        cp.DEPLOYMENT_STATE_PENDING,
        "VRAM_UNMEASURED",
    )
    assert list(still.residencies) == []
    assert set((await vram_reserved(world)).values()) == {0}


async def test_a_measured_peak_is_charged_with_its_margin_on_its_gpu(
    world: World, tiny_model_dir: Path
) -> None:
    worker = await world.worker("gpu", host_ram(64 * GIB), GPU0)
    worker.probe_evidence = measured_on_gpu(nvml=3 * GIB, allocator=2 * GIB)
    node_id = await world.node_id("gpu")
    artifact = await world.harness.register_model(tiny_model_dir, "measured")
    deployment = await world.harness.deploy(artifact.artifact_set_id, "measured", device="cuda:0")

    placed = await world.harness.deployment(deployment.deployment_id)
    assert [r.node_id for r in placed.residencies] == [node_id], placed
    assert await vram_reserved(world) == {node_id: vram_with_margin(3 * GIB)}
