"""The worker's one seam to NVML: device memory and per-process GPU memory, or why there is none.

`pynvml` (the `nvidia-ml-py` package) is optional: without it, or without the driver's library,
every reading is `Measurement.unavailable` with the reason ("NVML not installed ...",
"NVMLError_LibraryNotFound ..."), never a zero. NVML names processes by their pid in the host's
pid namespace; a worker in a container with its own pid namespace sees other pids there, so the
per-process readings of its children can be missing even with NVML working (said in `detail`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gantry.v1 import common_pb2

log = logging.getLogger(__name__)

SOURCE = "nvml"


def _measured(value: int, source: str) -> common_pb2.Measurement:
    return common_pb2.Measurement(bytes=value, source=source)


def _unavailable(reason: str, source: str = SOURCE) -> common_pb2.Measurement:
    return common_pb2.Measurement(unavailable=reason, source=source)


@dataclass(frozen=True)
class ListedProcess:
    """A process NVML lists on one GPU: `used` is None where the driver does not account per
    process (MIG, some virtualised GPUs)."""

    pid: int
    used: int | None


@dataclass(frozen=True)
class ProcessUsage:
    """One reading of a pid's device memory: `listed` is None when NVML could not say."""

    measurement: common_pb2.Measurement
    listed: bool | None


class Nvml:
    """An initialised NVML, or the reason it is not; `close()` when done."""

    def __init__(self, library: Any | None, unavailable_reason: str = "") -> None:
        self._nvml = library
        self.unavailable_reason = unavailable_reason

    @classmethod
    def open(cls, library: Any | None = None) -> Nvml:
        """Initialise NVML (`library`: the pynvml module, or a stand-in for tests)."""
        if library is None:
            try:
                import pynvml  # type: ignore[import-not-found,unused-ignore]
            except ImportError as exc:
                return cls(None, f"NVML not installed (nvidia-ml-py: {exc})")
            library = pynvml
        try:
            library.nvmlInit()
        except Exception as exc:
            return cls(None, f"{type(exc).__name__}: {exc}")
        return cls(library)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self.unavailable_reason = "NVML was closed"

    def device_count(self) -> tuple[int, str]:
        """(GPUs NVML sees, "") or (0, why it cannot say)."""
        if self._nvml is None:
            return 0, self.unavailable_reason
        try:
            return int(self._nvml.nvmlDeviceGetCount()), ""
        except Exception as exc:
            return 0, f"{type(exc).__name__}: {exc}"

    def device_memory(
        self, device: str, visible_devices: str | None
    ) -> tuple[common_pb2.Measurement, common_pb2.Measurement]:
        """(total, used) of the GPU a torch device string names, through CUDA_VISIBLE_DEVICES."""
        source = f"{SOURCE} nvmlDeviceGetMemoryInfo"
        if self._nvml is None:
            reason = self.unavailable_reason
            return _unavailable(reason, source), _unavailable(reason, source)
        if not (device == "cuda" or device.startswith("cuda:")):
            reason = f"the model runs on {device or 'cpu'}, not on a GPU"
            return _unavailable(reason, source), _unavailable(reason, source)
        try:
            handle = self._handle(device, visible_devices)
            info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return _unavailable(reason, source), _unavailable(reason, source)
        source = f"{source} ({device})"
        return _measured(int(info.total), source), _measured(int(info.used), source)

    def process_usage(self, pid: int) -> ProcessUsage:
        """The device memory NVML lists for `pid`, summed over every GPU (0 when not listed)."""
        source = f"{SOURCE} nvmlDeviceGetComputeRunningProcesses"
        if self._nvml is None:
            return ProcessUsage(_unavailable(self.unavailable_reason, source), None)
        try:
            used: list[int | None] = []
            for index in range(self._nvml.nvmlDeviceGetCount()):
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if int(process.pid) == pid:
                        used.append(process.usedGpuMemory)
        except Exception as exc:
            return ProcessUsage(_unavailable(f"{type(exc).__name__}: {exc}", source), None)
        if not used:
            return ProcessUsage(_measured(0, f"{source} (pid {pid} not listed)"), False)
        if any(value is None for value in used):
            # Listed, but the driver does not account per process (MIG, some virtualised GPUs).
            reason = f"NVML lists pid {pid} but reports no per-process usage"
            return ProcessUsage(_unavailable(reason, source), True)
        return ProcessUsage(_measured(sum(v for v in used if v is not None), source), True)

    def device_identity(self, index: int, visible_devices: str | None) -> tuple[str, str, str]:
        """(name, compute capability as "major.minor", "") of the GPU CUDA numbers `index`
        through CUDA_VISIBLE_DEVICES, or ("", "", why NVML cannot say)."""
        if self._nvml is None:
            return "", "", self.unavailable_reason
        try:
            handle = self._handle(f"cuda:{index}", visible_devices)
            name = self._nvml.nvmlDeviceGetName(handle)
            major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(handle)
        except Exception as exc:
            return "", "", f"{type(exc).__name__}: {exc}"
        # Older nvidia-ml-py returns the name as bytes.
        text = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        return text.strip(), f"{int(major)}.{int(minor)}", ""

    def device_processes(
        self, device: str, visible_devices: str | None
    ) -> tuple[list[ListedProcess], str]:
        """(every compute process NVML lists on the GPU a torch device string names, "") or
        ([], why it cannot list them)."""
        if self._nvml is None:
            return [], self.unavailable_reason
        try:
            handle = self._handle(device, visible_devices)
            listed = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            return [ListedProcess(int(p.pid), _optional_int(p.usedGpuMemory)) for p in listed], ""
        except Exception as exc:
            return [], f"{type(exc).__name__}: {exc}"

    def _handle(self, device: str, visible_devices: str | None) -> Any:
        assert self._nvml is not None
        index = int(device.partition(":")[2] or 0)
        if visible_devices is None or not visible_devices.strip():
            return self._nvml.nvmlDeviceGetHandleByIndex(index)
        visible = [entry.strip() for entry in visible_devices.split(",") if entry.strip()]
        if index >= len(visible):
            raise LookupError(f"{device} is not among CUDA_VISIBLE_DEVICES={visible_devices!r}")
        entry = visible[index]
        if entry.isdigit():
            return self._nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return self._nvml.nvmlDeviceGetHandleByUUID(entry)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def visible_devices(env: Mapping[str, str]) -> str | None:
    return env.get("CUDA_VISIBLE_DEVICES")
