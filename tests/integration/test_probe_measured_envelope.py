"""A probe's measured envelope end to end on this machine: a real ProbeRunner starts a real model
host child (the tiny embedding model on the CPU), which runs the profile's worst case; NVML is the
one named fake (a pynvml stand-in listing the probe's host as a GPU process), read by the worker
after that pass. The control plane's rules then charge the larger peak plus the margin."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gantry.common.artifact_walk import build_manifest
from gantry.common.ids import new_id
from gantry.common.manifest import manifest_digest
from gantry.controlplane.deployments.requirements import residency_charge
from gantry.controlplane.evidence.envelope import profile_envelope, vram_with_margin
from gantry.controlplane.evidence.job_plans import ProbeResultSnapshot, plan_probe_result
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.platform.models import RuntimeProfile
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.nvml_readings import Nvml
from gantry.worker.probe_job import ProbeRunner, ProbeSettings

GIB = 1 << 30
HOST_DEVICE_BYTES = 3 * GIB  # what the fake NVML says the probe's host holds
BATCH = 6


class FakePynvml:
    """pynvml's calls the probe makes: one 24 GiB GPU listing each probe host's pid while that
    process exists, as a driver lists a process until it is gone."""

    def __init__(self, running_pids: set[int]) -> None:
        self._running = running_pids
        self.process_reads = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=24 * GIB, used=HOST_DEVICE_BYTES)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self.process_reads += 1
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=HOST_DEVICE_BYTES)
            for pid in self._running
            if Path(f"/proc/{pid}").exists()
        ]


def _assignment(root: Path, source: Path) -> wg.JobAssignment:
    shutil.copytree(source, root / "tiny")
    manifest = build_manifest(root / "tiny")
    return wg.JobAssignment(
        job_id=new_id(),
        job_type=wg.JOB_TYPE_PROBE,
        lease_token="lease",
        probe=wg.ProbeSpec(
            probe_id=new_id(),
            profile_id=new_id(),
            artifact=wg.ArtifactRef(
                artifact_set_id=new_id(),
                artifact_location="tiny",
                manifest_digest=manifest_digest(manifest),
                manifest=[
                    common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                    for e in manifest
                ],
            ),
            adapter=common_pb2.AdapterSettings(
                adapter="sentence_transformers", device="cpu", max_batch_size=BATCH
            ),
        ),
    )


async def test_the_worst_case_probe_is_measured_by_nvml_and_charged_with_its_margin(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    fakes: list[FakePynvml] = []

    def open_fake_nvml() -> Nvml:
        fakes.append(FakePynvml(runner.running_pids))
        return Nvml.open(fakes[-1])

    runner = ProbeRunner(
        ProbeSettings(artifact_root=root, verified_root=tmp_path / "verified", load_timeout_s=90),
        environments=RuntimeEnvironments({}),
        open_nvml=open_fake_nvml,
    )
    assignment = _assignment(root, tiny_model_dir)
    evidence = await runner.run(assignment, lambda update: None)

    worst = evidence.worst_case
    assert worst.ran and (worst.batch_inputs, worst.input_tokens) == (BATCH, 128), worst
    memory = evidence.memory
    assert evidence.health.model.status == wg.HEALTH_STATUS_OK, evidence.health.model.detail
    assert memory.nvml_process_used.bytes == HOST_DEVICE_BYTES  # read while the host lived
    assert memory.cuda_peak_allocated.unavailable == "device is cpu"
    assert [fake.process_reads > 0 for fake in fakes] == [True]
    assert evidence.reclaim.reclaimed, evidence.reclaim.detail  # no longer listed after exit

    [recorded] = plan_probe_result(
        ProbeResultSnapshot(
            probe_id=assignment.probe.probe_id,
            ended=False,
            profile_id=assignment.probe.profile_id,
            artifact_set_id=assignment.probe.artifact.artifact_set_id,
            node_id="gpu-node",
            result=wg.JobResult(probe=evidence),
        )
    )
    assert isinstance(recorded, act.RecordProbeEvidence)
    assert recorded.vram_peak_bytes == HOST_DEVICE_BYTES
    profile = RuntimeProfile(
        ram_estimate_bytes=0,
        vram_estimate_bytes=GIB,  # too low: the measured peak and its margin win
        ram_measured_peak_bytes=recorded.ram_peak_bytes,
        vram_measured_peak_bytes=recorded.vram_peak_bytes,
    )
    charge = residency_charge(
        common_pb2.AdapterSettings(device="cuda:0"), profile_envelope(profile)
    )
    assert (charge.vram_device, charge.vram_bytes) == (0, vram_with_margin(HOST_DEVICE_BYTES))
