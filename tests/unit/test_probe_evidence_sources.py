"""Where a probe's evidence comes from: NVML through its seam, the exit of the child, reclaim."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.exit_status import exit_evidence
from gantry.worker.nvml_readings import Nvml
from gantry.worker.probe_job import record_unload


class NVMLError_LibraryNotFound(Exception):  # named as pynvml names it
    pass


class NVMLError_NotSupported(Exception):  # named as pynvml names it
    pass


Device = tuple[str, int, int, list[tuple[int, int | None]]]


@dataclass
class FakeNvml:
    """pynvml's calls the seam makes, over a table of devices: uuid -> (total, used, processes)."""

    devices: list[Device]
    init_error: Exception | None = None
    shut_down: list[bool] = field(default_factory=list)
    # Each device's (name, compute capability), by index; a device past the list is unnamed.
    names: list[tuple[str | bytes, tuple[int, int]]] = field(default_factory=list)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down.append(True)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return [d[0] for d in self.devices].index(uuid)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        _, total, used, _ = self.devices[handle]
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.devices[handle][3]]

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        if handle >= len(self.names):
            raise NVMLError_NotSupported("Not Supported")
        return self.names[handle][0]

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        if handle >= len(self.names):
            raise NVMLError_NotSupported("Not Supported")
        return self.names[handle][1]


TWO_GPUS: list[Device] = [
    ("GPU-aaaa", 80 << 30, 10 << 30, [(4242, 3 << 30)]),
    ("GPU-bbbb", 80 << 30, 20 << 30, [(4242, 1 << 30), (999, 5 << 30)]),
]


def test_without_the_library_every_reading_says_why() -> None:
    nvml = Nvml.open(FakeNvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library")))
    assert not nvml.available
    total, used = nvml.device_memory("cuda", None)
    assert total.unavailable == "NVMLError_LibraryNotFound: NVML Shared Library"
    assert used.unavailable == total.unavailable
    usage = nvml.process_usage(4242)
    assert (usage.measurement.unavailable, usage.listed) == (total.unavailable, None)


def test_device_memory_follows_cuda_visible_devices_by_index_or_uuid() -> None:
    nvml = Nvml.open(FakeNvml(TWO_GPUS))
    total, used = nvml.device_memory("cuda:0", "1")
    assert (total.bytes, used.bytes) == (80 << 30, 20 << 30)
    total, used = nvml.device_memory("cuda", "GPU-aaaa,GPU-bbbb")
    assert used.bytes == 10 << 30
    missing, _ = nvml.device_memory("cuda:2", "0,1")
    assert "not among CUDA_VISIBLE_DEVICES" in missing.unavailable
    on_cpu, _ = nvml.device_memory("cpu", None)
    assert on_cpu.unavailable == "the model runs on cpu, not on a GPU"


def test_process_usage_sums_every_gpu_and_a_missing_pid_is_a_measured_zero() -> None:
    nvml = Nvml.open(FakeNvml(TWO_GPUS))
    usage = nvml.process_usage(4242)
    assert (usage.measurement.bytes, usage.listed) == (4 << 30, True)
    gone = nvml.process_usage(1234)
    assert (gone.measurement.WhichOneof("value"), gone.measurement.bytes, gone.listed) == (
        "bytes",
        0,
        False,
    )
    unaccounted = Nvml.open(FakeNvml([("GPU-mig", 1, 1, [(4242, None)])])).process_usage(4242)
    assert unaccounted.listed is True
    assert "reports no per-process usage" in unaccounted.measurement.unavailable


def test_an_exit_code_only_for_a_process_that_exited_by_itself() -> None:
    assert exit_evidence(7, 0, exited=True) == wg.UnloadEvidence(
        pid=7, process_exited=True, has_exit_code=True, exit_code=0
    )
    assert exit_evidence(7, -signal.SIGKILL, exited=True) == wg.UnloadEvidence(
        pid=7, process_exited=True, exit_signal=signal.SIGKILL
    )
    # Not confirmed gone: no code, no signal, nothing claimed.
    assert exit_evidence(7, None, exited=False) == wg.UnloadEvidence(pid=7)


@dataclass
class _StoppedHost:
    pid: int
    returncode: int | None
    unloaded: model_host_pb2.HostUnloaded | None = None


def _reclaim(
    host: _StoppedHost, nvml: Nvml, *, exited: bool, on_gpu: bool = False
) -> wg.ProbeEvidence:
    evidence = wg.ProbeEvidence()
    stopped = exit_evidence(host.pid, host.returncode, exited=exited)
    record_unload(host, stopped, nvml, evidence, on_gpu=on_gpu)  # type: ignore[arg-type]
    return evidence


def test_reclaim_needs_the_exit_the_reaping_and_no_device_memory_left() -> None:
    clean = _reclaim(_StoppedHost(4242, 0), Nvml.open(FakeNvml(TWO_GPUS[:0])), exited=True)
    assert clean.reclaim.reclaimed
    assert (
        clean.reclaim.detail
        == "pid 4242 exited with code 0, reaped; NVML lists no device memory for it"
    )
    assert clean.reclaim.nvml_process_used_after.bytes == 0

    still_listed = _reclaim(_StoppedHost(4242, 0), Nvml.open(FakeNvml(TWO_GPUS)), exited=True)
    assert not still_listed.reclaim.reclaimed
    assert still_listed.reclaim.nvml_process_used_after.bytes == 4 << 30

    not_gone = _reclaim(_StoppedHost(4242, None), Nvml.open(FakeNvml([])), exited=False)
    assert (not_gone.reclaim.reclaimed, not_gone.reclaim.reaped) == (False, False)
    assert not_gone.reclaim.detail.startswith("pid 4242 was NOT confirmed gone, NOT reaped")

    no_nvml = Nvml.open(FakeNvml([], init_error=NVMLError_LibraryNotFound("not found")))
    killed = _reclaim(_StoppedHost(4242, -signal.SIGKILL), no_nvml, exited=True)
    # On a CPU nothing is left to check the device for: the exit and the reaping decide.
    assert killed.reclaim.reclaimed
    assert (killed.reclaim.has_exit_code, killed.reclaim.exit_signal) == (False, signal.SIGKILL)
    assert "device memory not checked (NVMLError_LibraryNotFound: not found)" in (
        killed.reclaim.detail
    )
    # On a GPU an NVML that cannot be read proves nothing: unverified, and said why.
    on_gpu = _reclaim(_StoppedHost(4242, 0), no_nvml, exited=True, on_gpu=True)
    assert (on_gpu.reclaim.reclaimed, on_gpu.reclaim.on_gpu) == (False, True)
    assert on_gpu.reclaim.detail.endswith(
        "unverified: it ran on a GPU and NVML could not be read to prove it released"
    )
    # NVML still listing the pid marks it a GPU process whatever its profile said.
    assert still_listed.reclaim.on_gpu


def test_readings_the_child_did_not_send_are_unavailable_never_zero() -> None:
    evidence = _reclaim(_StoppedHost(1, 0), Nvml.open(FakeNvml([])), exited=True)
    memory = evidence.memory
    assert memory.cuda_allocated_after_unload == common_pb2.Measurement(
        unavailable="the model host sent no HostUnloaded before exiting",
        source="torch.cuda.memory_allocated",
    )
    for name in ("rss_current", "rss_peak", "cuda_peak_allocated", "nvml_device_total"):
        assert getattr(memory, name).unavailable == "not reported by the model host", name
