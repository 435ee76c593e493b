"""Memory a model host reads of itself: its RSS from the kernel, CUDA from torch's allocator.

Every reading is a `Measurement`: bytes with their source, or `unavailable` with the reason. A
source that cannot be read is never reported as zero. torch is imported only for a CUDA device
(and only after the sandbox is entered, since readings are taken on the load path or later).
"""

from __future__ import annotations

from typing import Any

from gantry.v1 import common_pb2
from gantry.worker.model_host.proc_facts import peak_rss_bytes_of, rss_bytes_of

RSS_SOURCE = "/proc/self/status VmRSS"
RSS_PEAK_SOURCE = "/proc/self/status VmHWM"
CUDA_SOURCE = "torch.cuda"


def measured(value: int, source: str) -> common_pb2.Measurement:
    return common_pb2.Measurement(bytes=value, source=source)


def unavailable(reason: str, source: str) -> common_pb2.Measurement:
    return common_pb2.Measurement(unavailable=reason, source=source)


def _from_proc(value: int | None, source: str) -> common_pb2.Measurement:
    if value is None:
        return unavailable("cannot read /proc/self/status", source)
    return measured(value, source)


def rss_current() -> common_pb2.Measurement:
    """The resident set now (VmRSS)."""
    return _from_proc(rss_bytes_of(), RSS_SOURCE)


def rss_peak() -> common_pb2.Measurement:
    """The resident set's high-water mark since the process started (VmHWM)."""
    return _from_proc(peak_rss_bytes_of(), RSS_PEAK_SOURCE)


def is_cuda_device(device: str) -> bool:
    return device == "cuda" or device.startswith("cuda:")


class CudaAllocator:
    """torch's CUDA caching allocator on the adapter's device, or the reason there is none."""

    def __init__(self, device: str) -> None:
        self._device = device or "cpu"
        self._torch: Any = None
        self._reason: str | None = None
        if not is_cuda_device(self._device):
            self._reason = f"device is {self._device}"
            return
        import torch

        if not torch.cuda.is_available():
            self._reason = "torch.cuda.is_available() is false"
            return
        self._torch = torch

    @property
    def available(self) -> bool:
        return self._reason is None

    def allocated(self) -> common_pb2.Measurement:
        return self._read("memory_allocated")

    def reserved(self) -> common_pb2.Measurement:
        return self._read("memory_reserved")

    def peak_allocated(self) -> common_pb2.Measurement:
        return self._read("max_memory_allocated")

    def _read(self, name: str) -> common_pb2.Measurement:
        source = f"{CUDA_SOURCE}.{name}"
        if self._reason is not None:
            return unavailable(self._reason, source)
        try:
            value = int(getattr(self._torch.cuda, name)(self._device))
        except Exception as exc:  # a driver error is a missing reading, not a crash
            return unavailable(f"{name} failed: {type(exc).__name__}: {exc}", source)
        return measured(value, source)
