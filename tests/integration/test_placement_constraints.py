"""An operator aims a deployment: GPU model, compute capability, free VRAM and node labels.

A real control plane and scheduler (real gRPC, a real database) and two scripted workers (named
fakes of the worker protocol) whose Hellos carry what a real worker's would: their GPUs as NVML
names them; each node was registered with an operator's label. A deployment no node satisfies waits
PENDING with NO_ELIGIBLE_NODE and each node's reason; one the H100 node satisfies is placed there
and goes READY; a constraint that could never be compared is refused before anything is written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.pipeline_support import Pipeline
from tests.integration.scripted_worker import ScriptedWorker, host_ram
from tests.integration.test_external_gpu_usage import gantry, gpu_worker  # noqa: F401
from tests.integration.test_resource_domains import scheduler_snapshot

GIB = 1 << 30


def vram(capacity_bytes: int) -> common_pb2.ResourceDomain:
    return common_pb2.ResourceDomain(
        name="gpu0.vram", kind=common_pb2.RESOURCE_KIND_VRAM, capacity_bytes=capacity_bytes
    )


async def _gpu_worker(
    harness: Harness, name: str, model: str, capability: str, vram_bytes: int, label: str
) -> tuple[ScriptedWorker, str]:
    worker = ScriptedWorker(resource_domains=(host_ram(64 * GIB), vram(vram_bytes)))
    worker.gpus = [common_pb2.GpuDevice(device=0, name=model, compute_capability=capability)]
    key, _, value = label.partition("=")
    registered = await harness.operator.RegisterNode(
        cp.RegisterNodeRequest(name=name, labels={key: value}), metadata=harness.op_md
    )
    await worker.start(harness.channel, registered.credential)
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    return worker, next(node.node_id for node in listed.nodes if node.name == name)


@pytest.fixture
async def aimed(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Harness, str, str]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        a10, a10_id = await _gpu_worker(harness, "a10", "NVIDIA A10", "8.6", 24 * GIB, "zone=a")
        h100, h100_id = await _gpu_worker(
            harness, "h100", "NVIDIA H100 80GB HBM3", "9.0", 80 * GIB, "zone=b"
        )
        try:
            yield harness, a10_id, h100_id
        finally:
            await a10.stop()
            await h100.stop()


async def _create(
    harness: Harness, approval_id: str, capability: str, **constraints: object
) -> cp.Deployment:
    return await harness.operator.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval_id,
            capability=capability,
            constraints=common_pb2.PlacementConstraints(**constraints),  # type: ignore[arg-type]
        ),
        metadata=harness.op_md,
    )


async def test_an_unsatisfiable_deployment_waits_with_each_nodes_reason_and_an_aimed_one_is_placed(
    aimed: tuple[Harness, str, str], tiny_model_dir: Path
) -> None:
    harness, a10_id, h100_id = aimed
    snapshot = await scheduler_snapshot(harness)
    seen = {node.node_id: node for node in snapshot.nodes}
    assert [g.name for g in seen[h100_id].gpus] == ["NVIDIA H100 80GB HBM3"]
    assert "zone=a" in seen[a10_id].labels and "zone=b" in seen[h100_id].labels

    artifact = await harness.register_model(tiny_model_dir, "tiny")
    approval = await harness.approve(artifact.artifact_set_id, "tiny", device="cpu")

    nowhere = await _create(
        harness, approval.approval_id, "nowhere", gpu_model="H100", node_labels=["zone=a"]
    )
    pending = await harness.deployment(nowhere.deployment_id)
    assert pending.state == cp.DEPLOYMENT_STATE_PENDING and list(pending.residencies) == []
    assert pending.last_failure.reason == "NO_ELIGIBLE_NODE"
    message = pending.last_failure.message
    assert f"{a10_id} NO_ELIGIBLE_NODE (gpu model NVIDIA A10 is not H100)" in message, message
    assert f"{h100_id} NO_ELIGIBLE_NODE (missing labels: zone=a)" in message, message
    assert pending.constraints.gpu_model == "H100"

    short = await _create(harness, approval.approval_id, "short", min_free_vram_bytes=100 * GIB)
    refused = await harness.deployment(short.deployment_id)
    assert refused.last_failure.reason == "NO_CAPACITY"
    assert f"{h100_id} NO_CAPACITY (free VRAM 80.0 GiB < 100.0 GiB)" in (
        refused.last_failure.message
    )

    there = await _create(
        harness,
        approval.approval_id,
        "aimed",
        gpu_model="h100",
        min_compute_capability="9.0",
        min_free_vram_bytes=40 * GIB,
        node_labels=["zone=b"],
    )
    assert [r.node_id for r in there.residencies] == [h100_id], there
    ready = await harness.wait_deployment(there.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert list(ready.constraints.node_labels) == ["zone=b"]


async def test_a_constraint_that_could_never_be_compared_is_refused_before_it_is_written(
    aimed: tuple[Harness, str, str], tiny_model_dir: Path
) -> None:
    harness, _, _ = aimed
    artifact = await harness.register_model(tiny_model_dir, "tiny")
    approval = await harness.approve(artifact.artifact_set_id, "tiny", device="cpu")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _create(harness, approval.approval_id, "bad", min_compute_capability="eight")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_of(caught.value)
    assert info is not None and info.reason == "INVALID_ARGUMENT"
    assert info.metadata["field"] == "constraints.min_compute_capability"
    listed = await harness.operator.ListDeployments(
        cp.ListDeploymentsRequest(), metadata=harness.op_md
    )
    assert [d.capability for d in listed.deployments] == []


async def _cuda_approval_on_the_lab(gantry: Pipeline) -> cp.ProductionApproval:  # noqa: F811
    """Every gate, on the scripted lab node, for a profile on cuda:0 charging 8 GiB of VRAM."""
    await gantry.worker("lab")
    lab = (await gantry.node("lab")).node_id
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id, node_id=lab)
    profile = await gantry.op.CreateRuntimeProfile(
        cp.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name="tiny-cuda",
            adapter=common_pb2.AdapterSettings(adapter="sentence_transformers", device="cuda:0"),
            vram_estimate_bytes=8 * GIB,
        ),
        metadata=gantry.md,
    )
    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id, node_id=lab), metadata=gantry.md
    )
    done = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    return await gantry.approve(done.candidate_id, reason="probed by a scripted node")


async def test_a_real_worker_names_its_gpu_and_a_constraint_on_it_decides_placement(
    gantry: Pipeline,  # noqa: F811
    gpu_worker: tuple[str, Path],  # noqa: F811
) -> None:
    """A real `gantry worker` process (NVML its one fake: "Fake GPU", compute capability 8.0)
    names its GPU in its Hello; the scripted lab node has none."""
    node_id, _ = gpu_worker

    async def named() -> bool:
        snapshot = await scheduler_snapshot(gantry.harness)
        return any(
            node.node_id == node_id
            and [(g.device, g.name, g.compute_capability) for g in node.gpus]
            == [(0, "Fake GPU", "8.0")]
            for node in snapshot.nodes
        )

    await wait_for(named, timeout=30, what="the worker's GPU named at the scheduler")
    approval = await _cuda_approval_on_the_lab(gantry)
    lab = (await gantry.node("lab")).node_id
    newer = await gantry.op.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval.approval_id,
            capability="needs-hopper",
            constraints=common_pb2.PlacementConstraints(min_compute_capability="9.0"),
        ),
        metadata=gantry.md,
    )
    assert newer.state == cp.DEPLOYMENT_STATE_PENDING
    message = newer.last_failure.message
    assert f"{node_id} NO_ELIGIBLE_NODE (compute capability 8.0 < 9.0)" in message, message
    assert f"{lab} NO_ELIGIBLE_NODE (" in message, message  # no GPU, no device:cuda there
    fake = await gantry.op.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval.approval_id,
            capability="on-the-fake",
            constraints=common_pb2.PlacementConstraints(
                gpu_model="fake gpu", min_compute_capability="8.0"
            ),
        ),
        metadata=gantry.md,
    )
    assert [r.node_id for r in fake.residencies] == [node_id], fake
