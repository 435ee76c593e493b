"""CUDA out of memory in a model host, typed: RUNTIME_OOM at load, INVOKE_OOM at invoke.

torch raises `torch.cuda.OutOfMemoryError` (a RuntimeError, defined in CPU builds too) when its
caching allocator cannot get the memory a kernel asks for. The process is intact, unlike one the
kernel's OOM killer ends (RUNTIME_OOM_KILLED). At load the envelope was too small for the model:
the load fails, class CONFIG, and is not retried. At invoke the request was too large for what
the envelope leaves: that request fails, the allocator's cache is handed back, and the host
serves the next call. Either failure carries the figures the allocator and the error itself give
(`oom_metadata`), so the envelope can be corrected from what was measured.
"""

from __future__ import annotations

import gc
import re
import sys
import traceback
from collections.abc import Mapping

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host.memory_readings import CudaAllocator

_UNITS: Mapping[str, int] = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?(B|KiB|MiB|GiB|TiB)"
# torch's own wording, in its 2.x form ("GPU 0 has a total capacity of 79.19 GiB of which
# 1.50 GiB is free") and its 1.x one ("(GPU 0; 15.78 GiB total capacity; ...; 1.12 GiB free;").
_FIGURES: Mapping[str, tuple[re.Pattern[str], ...]] = {
    "cuda_tried_to_allocate_bytes": (re.compile(r"Tried to allocate " + _SIZE),),
    "cuda_total_bytes": (
        re.compile(r"total capacity of " + _SIZE),
        re.compile(_SIZE + r" total capacity"),
    ),
    "cuda_free_bytes": (
        re.compile(r"of which " + _SIZE + r" is free"),
        re.compile(_SIZE + r" free;"),
    ),
}


def is_cuda_oom(exc: BaseException) -> bool:
    """Whether `exc` is torch's CUDA out-of-memory error. A process that never imported torch
    cannot have raised it, so torch is never imported to answer."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    oom = getattr(cuda, "OutOfMemoryError", None)
    return isinstance(oom, type) and isinstance(exc, oom)


def figures_of(message: str) -> dict[str, str]:
    """The byte figures torch's OOM message states, by metadata key; those it does not, absent."""
    found: dict[str, str] = {}
    for key, patterns in _FIGURES.items():
        for pattern in patterns:
            match = pattern.search(message)
            if match is not None:
                found[key] = str(int(float(match.group(1)) * _UNITS[match.group(2)]))
                break
    return found


def _reading(measurement: common_pb2.Measurement) -> str:
    if measurement.unavailable:
        return f"unavailable: {measurement.unavailable}"
    return str(measurement.bytes)


def oom_metadata(exc: BaseException, cuda: CudaAllocator) -> dict[str, str]:
    """What was measured when the allocator gave up: its own readings (bytes, or why there are
    none), then the figures in the error's message."""
    return {
        "cuda_allocated": _reading(cuda.allocated()),
        "cuda_reserved": _reading(cuda.reserved()),
        "cuda_peak_allocated": _reading(cuda.peak_allocated()),
        **figures_of(str(exc)),
    }


def _summary(metadata: Mapping[str, str]) -> str:
    parts = [
        f"{label} {int(metadata[key]) / 1024**2:.1f} MiB"
        for key, label in (
            ("cuda_tried_to_allocate_bytes", "tried to allocate"),
            ("cuda_free_bytes", "free"),
            ("cuda_total_bytes", "of"),
        )
        if key in metadata
    ]
    return f" ({', '.join(parts)})" if parts else ""


def load_oom(exc: BaseException, cuda: CudaAllocator) -> GantryError:
    """RUNTIME_OOM for a load the allocator could not fit; its figures in the metadata."""
    metadata = oom_metadata(exc, cuda)
    return GantryError(
        "RUNTIME_OOM",
        f"CUDA out of memory loading the model{_summary(metadata)}: the envelope is too small "
        f"for it (peak allocated {metadata['cuda_peak_allocated']})",
        **metadata,
    )


def invoke_oom(exc: BaseException, cuda: CudaAllocator) -> GantryError:
    """INVOKE_OOM for a forward pass the allocator could not fit. Its own first line, not
    torch's, reaches the client: torch's names other processes on the device."""
    metadata = oom_metadata(exc, cuda)
    return GantryError(
        "INVOKE_OOM",
        f"CUDA out of memory running the request{_summary(metadata)}: too large for this "
        "deployment's envelope; the model host released its cached memory and serves on",
        **metadata,
    )


def release_after(exc: BaseException) -> None:
    """Hand the memory a failed forward pass held back to the device: the traceback's frames
    keep its activations alive until cleared, and the allocator keeps freed blocks cached."""
    traceback.clear_frames(exc.__traceback__)
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
