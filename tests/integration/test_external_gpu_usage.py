"""GPU memory held by a process Gantry did not start: a real worker process (NVML its one fake,
tests/integration/fake_nvml_worker.py) reports it in its heartbeats, `gantry inventory` shows it
marked external, and placement refuses the node whose VRAM it takes, naming it; once the
process is gone the node's VRAM is available again and the deployment is placed there.

The scheduler and control plane run in this process (real gRPC, the reconciler on real time); the
evidence gates are walked on a scripted node, so the real worker never loads a model.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gantry.cli.main import main as gantry_cli
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import wait_for
from tests.integration.pipeline_support import Pipeline, make_model_dir, pipeline_of
from tests.integration.test_resource_domains import scheduler_snapshot

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, make_model_dir(tmp_path), clock=None):
        yield pipeline


def gpu_table(path: Path, *processes: tuple[int, int]) -> None:
    """One 24 GiB GPU holding `processes` (pid, bytes), as the fake NVML reads it."""
    used = sum(size for _, size in processes) + GIB // 2  # the driver's own share
    device = {"uuid": "GPU-0", "total": 24 * GIB, "used": used, "processes": list(processes)}
    path.write_text(json.dumps([device]))


@pytest.fixture
def external_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process this test started, not the worker: to the worker, an external GPU process."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


# How long the real worker may take to exit after SIGTERM before the fixture kills it (its stop
# bound is gantry.common.process.WORKER_STOP_BOUND_S, 10 s).
WORKER_EXIT_S = 30.0


@pytest.fixture
async def gpu_worker(gantry: Pipeline, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """(node id, the fake's GPU table) of a real `gantry worker` process on node "gpu"."""
    table = tmp_path / "gpus.json"
    gpu_table(table)
    credential = tmp_path / "gpu.credential"
    credential.write_text(await gantry.harness.register_node("gpu") + "\n")
    worker = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "tests.integration.fake_nvml_worker", str(table)),
        *("--control-plane", gantry.harness.address, "--credential-file", str(credential)),
        *("--artifact-root", str(gantry.harness.artifact_root), "--no-warm-pool"),
        *("--heartbeat-file", str(tmp_path / "gpu.heartbeat")),
        cwd=REPO,
    )
    try:
        node = await gantry.node("gpu")
        yield node.node_id, table
    finally:
        worker.terminate()
        try:
            await asyncio.wait_for(worker.wait(), WORKER_EXIT_S)
        except TimeoutError:
            # Seen once (issue 29's fresh-clone run): the worker logged "stopped in 0.01s" with
            # a LOAD in flight and did not exit within the 120 s test timeout. Said, not hidden;
            # the test's own assertions are about placement, not the worker's exit.
            print(f"the gpu worker did not exit {WORKER_EXIT_S:g}s after SIGTERM; killed")
            worker.kill()
            await worker.wait()


async def inventory_of(gantry: Pipeline, node_id: str) -> cp.NodeInventory:
    return await gantry.op.GetInventory(cp.GetInventoryRequest(node_id=node_id), metadata=gantry.md)


async def cuda_approval(gantry: Pipeline) -> cp.ProductionApproval:
    """Every gate for a profile that runs on cuda:0 and charges 8 GiB of VRAM (scripted node)."""
    await gantry.worker("lab")
    # The scripted node assesses and probes (the probe follows the assessing node): the real GPU
    # worker beside it would inspect the manifest-only artifact and find nothing it can run.
    lab = await gantry.node("lab")
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id, node_id=lab.node_id)
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
        cp.StartProbeRequest(profile_id=profile.profile_id, node_id=lab.node_id),
        metadata=gantry.md,
    )
    done = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    return await gantry.approve(done.candidate_id, reason="probed by a scripted node")


async def test_an_external_gpu_process_is_shown_and_charged_until_it_is_gone(
    gantry: Pipeline,
    gpu_worker: tuple[str, Path],
    external_process: subprocess.Popen[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    approval = await cuda_approval(gantry)
    node_id, table = gpu_worker
    gpu_table(table, (external_process.pid, 18 * GIB))

    async def external_seen() -> bool:
        gpus = (await inventory_of(gantry, node_id)).gpus
        return [(c.device, c.bytes) for c in gpus.external_usage] == [(0, 18 * GIB)]

    await wait_for(external_seen, timeout=60, what="the external process in the inventory")

    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "operator.token").write_text(gantry.harness.operator_token + "\n")
    argv = ["--address", gantry.harness.address, "--state-dir", str(state_dir), "inventory", "gpu"]
    capsys.readouterr()
    status = await asyncio.to_thread(gantry_cli, argv)
    out, err = capsys.readouterr()
    assert (status, err) == (0, "")
    processes = out.split("GPU PROCESSES\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert processes[0].split() == ["DEVICE", "PID", "USED", "OWNER"]
    assert processes[1].split() == ["cuda:0", str(external_process.pid), "19.3", "GB", "external"]
    gpus = out.split("GPUS (as of ", 1)[1].split("\n\n", 1)[0].splitlines()
    assert gpus[1].split() == ["DEVICE", "USED", "TOTAL", "EXTERNAL", "PROCESSES"]
    assert gpus[2].split() == ["cuda:0", "19.9", "GB", "25.8", "GB", "19.3", "GB", "1"]

    registry = await gantry.op.GetRegistrySnapshot(
        cp.GetRegistrySnapshotRequest(), metadata=gantry.md
    )
    by_node = {reading.node_id: reading for reading in registry.node_gpus}
    [listed] = by_node[node_id].gpus[0].processes
    assert (listed.pid, listed.managed) == (external_process.pid, False)
    assert by_node[(await gantry.node("lab")).node_id].unavailable  # no reading: said so

    # 24 GiB less the 10 % margin is 21.6 GiB usable; 18 GiB of it is taken: 8 GiB does not fit.
    deployment = await gantry.deploy(approval.approval_id, "tiny-cuda")
    assert deployment.state == cp.DEPLOYMENT_STATE_PENDING
    assert deployment.last_failure.reason == "NO_CAPACITY"
    refusal = deployment.last_failure.message
    assert f"{node_id} NO_CAPACITY (gpu0.vram needs 8.0 GiB, 3.6 GiB available" in refusal
    assert "18.0 GiB held by GPU processes Gantry did not start" in refusal

    gpu_table(table)  # the external process let go of its memory

    async def freed() -> bool:
        snapshot = await scheduler_snapshot(gantry.harness)
        vram = [e for e in snapshot.ledger if (e.node_id, e.domain.name) == (node_id, "gpu0.vram")]
        return bool(vram) and vram[0].available_bytes > 8 * GIB

    await wait_for(freed, timeout=60, what="the node's VRAM available again")

    async def placed() -> bool:
        current = await gantry.harness.deployment(deployment.deployment_id)
        return [r.node_id for r in current.residencies] == [node_id]

    # The freed memory made the refused placement due again: it lands on the node.
    await wait_for(placed, timeout=30, what="the deployment placed on the freed node")
