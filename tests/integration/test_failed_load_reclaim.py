"""A failed LOAD keeps its charge until its child is proven gone: real model host children whose
load fails, judged by the same reclaim rule as an unload (`reclaim_verdict`), never by the time
the start waited. NVML is the one fake (the file-backed table of fake_nvml_worker.py, or none).

A host asked for device "cuda" on this CPU-only machine fails its load for real (torch has no
CUDA here): to the worker it is a GPU residency whose start failed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host.process import ModelHost
from gantry.worker.nvml_readings import Nvml
from gantry.worker.residents import UNCERTAIN, ResidentFacts
from gantry.worker.supervision import ServingLoad, SupervisionSettings, Supervisor
from tests.fixtures.serving_adapters import RecordingAdapters, serving_load
from tests.integration.fake_nvml_worker import FileBackedFakeNvml
from tests.integration.harness import shared_warm_pool

FACTS = ResidentFacts(
    artifact_digest="sha256:artifact",
    environment_id="default",
    adapter_digest="adapter",
    environment_fingerprint="fingerprint",
)
QUIET = SupervisionSettings(ping_interval_s=3600)


class SwitchableNvml:
    """What `open_nvml` returns: NVML over a table file, or (switched off) none that reads."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.readable = False
        table.write_text(json.dumps([{"uuid": "GPU-0", "total": 1, "used": 0, "processes": []}]))

    def __call__(self) -> Nvml:
        if not self.readable:
            return Nvml(None, "NVMLError_DriverNotLoaded: the fake's driver is not loaded")
        return Nvml(FileBackedFakeNvml(self.table))


def _supervisor(nvml: SwitchableNvml) -> Supervisor:
    return Supervisor(
        QUIET,
        on_change=lambda: None,
        host_factory=functools.partial(ModelHost.start, warm_pool=shared_warm_pool()),
        adapters=RecordingAdapters(),
        open_nvml=nvml,
    )


def _on(device: str, load: ServingLoad) -> ServingLoad:
    settings = common_pb2.AdapterSettings()
    settings.CopyFrom(load.prepare.settings)
    settings.device = device
    return dataclasses.replace(load, prepare=dataclasses.replace(load.prepare, settings=settings))


async def test_a_failed_gpu_load_stays_uncertain_until_nvml_proves_its_child_gone(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    nvml = SwitchableNvml(tmp_path / "gpus.json")
    supervisor = _supervisor(nvml)
    load = _on("cuda", serving_load("dep-gpu", directory=tiny_model_dir))
    try:
        with pytest.raises(GantryError) as failed:
            await supervisor.load("dep-gpu", FACTS, load, trace_context={})
        metadata = failed.value.metadata
        # The child was reaped, but NVML could not be read to prove its device memory back.
        assert (metadata["reaped"], metadata["reclaim"]) == ("true", "unverified")
        assert "NVML could not be read" in metadata["reclaim_detail"]
        resident = supervisor.residents.get("dep-gpu")
        assert resident is not None and resident.state == UNCERTAIN  # custody kept
        assert resident.last_failure is not None
        assert resident.last_failure.reason == "RECLAIM_UNVERIFIED"

        # An UNLOAD while NVML still cannot be read proves nothing either.
        again = await supervisor.unload("dep-gpu")
        assert (again.process_exited, again.reclaim.reclaimed) == (True, False)
        assert supervisor.residents.get("dep-gpu") is resident

        # NVML reads, and no longer lists the pid: now the child is proven gone.
        nvml.readable = True
        proven = await supervisor.unload("dep-gpu")
        assert proven.pid == int(metadata["pid"])
        assert (proven.process_exited, proven.reclaim.reclaimed) == (True, True)
        assert "NVML no longer lists the pid" in proven.reclaim.detail
        assert supervisor.residents.get("dep-gpu") is None
    finally:
        await supervisor.shutdown()


async def test_a_failed_cpu_load_is_released_once_its_child_is_reaped(tmp_path: Path) -> None:
    nvml = SwitchableNvml(tmp_path / "gpus.json")  # unreadable: a CPU host needs none
    supervisor = _supervisor(nvml)
    missing = tmp_path / "no-model-here"
    missing.mkdir()
    try:
        with pytest.raises(GantryError) as failed:
            await supervisor.load(
                "dep-cpu", FACTS, serving_load("dep-cpu", directory=missing), trace_context={}
            )
        assert (failed.value.metadata["reaped"], failed.value.metadata["reclaim"]) == (
            "true",
            "verified",
        )
        assert supervisor.residents.get("dep-cpu") is None
    finally:
        await supervisor.shutdown()
