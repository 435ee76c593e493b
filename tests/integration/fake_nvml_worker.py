"""`gantry worker` in a child process whose NVML is a fake: for tests only, never installed.

    python -m tests.integration.fake_nvml_worker TABLE_JSON [gantry worker flags...]

NVML is the one part of a GPU node this machine lacks, so it alone is replaced, at its seam
(`Nvml.open`, which both the worker's measured resource domains and its heartbeats call): the
rest is the real worker process, speaking the real protocol to a real control plane. The fake
reads TABLE_JSON at every call, so a test changes what the GPUs hold while the worker runs:

    [{"uuid": "GPU-0", "total": 25769803776, "used": 19327352832,
      "processes": [[4242, 19327352832]]}]

A device's "name" and "compute_capability" ("8.6") are optional ("Fake GPU", "8.0").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gantry.worker import main as worker_main
from gantry.worker.nvml_readings import Nvml


class FileBackedFakeNvml:
    """pynvml's calls the worker makes, over the device table a test keeps in a JSON file."""

    def __init__(self, table: Path) -> None:
        self._table = table

    def _devices(self) -> list[dict[str, Any]]:
        devices: list[dict[str, Any]] = json.loads(self._table.read_text())
        return devices

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._devices())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return [d["uuid"] for d in self._devices()].index(uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        device = self._devices()[handle]
        return SimpleNamespace(
            total=device["total"], used=device["used"], free=device["total"] - device["used"]
        )

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._devices()[handle].get("name", "Fake GPU"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = str(self._devices()[handle].get("compute_capability", "8.0")).split(".")
        return int(major), int(minor)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self._devices()[handle]["processes"]
        ]


def main() -> int:
    table = Path(sys.argv[1])
    # Every Nvml.open() in this process (measured domains, heartbeats, probes) opens the fake.
    Nvml.open = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls, library=None: cls(FileBackedFakeNvml(table))
    )
    return worker_main.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
