"""What serving reads of its runtimes, in the probe's evidence types: a host's memory at LOAD and
HEALTH (its RSS, NVML's device and per-process readings), and the reclaim of a child no runtime
holds any more (its start failed), judged by `reclaim_verdict` like every unload's.

The caller opens and closes the NVML it hands in (`Nvml.open`, or a test's named fake).
"""

from __future__ import annotations

import os

import psutil

from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host.proc_facts import process_identity
from gantry.worker.nvml_readings import Nvml
from gantry.worker.runtime_adapters.base import RunningRuntime
from gantry.worker.runtime_adapters.model_host_runtime import fill_unreported, read_process_usage
from gantry.worker.runtime_adapters.reclaim_verdict import is_gpu_device, reclaim_verdict

# The allocator's readings are the child's own, and only a probe's check asks it for them.
ALLOCATOR_READINGS = (
    "cuda_allocated_before_load",
    "cuda_allocated_after_load",
    "cuda_reserved_after_load",
    "cuda_peak_allocated",
    "cuda_allocated_after_unload",
)
NO_ALLOCATOR_READING = "a serving host reports no allocator readings (a probe's check does)"


def memory_now(
    running: RunningRuntime, *, rss_bytes: int, nvml: Nvml, visible_devices: str | None
) -> wg.MemoryEvidence:
    """A serving host's memory now. A pid NVML lists marks the runtime as holding device memory
    (`RunningRuntime.gpu_seen`), so its reclaim needs NVML too. Never a zero for "unknown"."""
    memory = wg.MemoryEvidence()
    if rss_bytes > 0:
        memory.rss_current.CopyFrom(common_pb2.Measurement(bytes=rss_bytes, source="VmRSS"))
    else:
        memory.rss_current.unavailable = "the process is gone or its /proc is unreadable"
    total, used = nvml.device_memory(running.device, visible_devices)
    memory.nvml_device_total.CopyFrom(total)
    memory.nvml_device_used.CopyFrom(used)
    memory.nvml_process_used.CopyFrom(read_process_usage(running, nvml).measurement)
    for reading in ALLOCATOR_READINGS:
        getattr(memory, reading).unavailable = NO_ALLOCATOR_READING
    fill_unreported(memory)
    return memory


def reclaim_of_gone(pid: int, device: str, nvml: Nvml, *, reaped: bool) -> wg.ReclaimEvidence:
    """The reclaim of a failed start's child: `reaped` (its start reaped it, or no child of ours
    is at its pid any more) and, where it ran on a GPU (`device`, or NVML lists it), NVML read
    and no longer listing it."""
    after = nvml.process_usage(pid)
    on_gpu = is_gpu_device(device) or after.listed is True
    verdict = reclaim_verdict(
        process_exited=reaped, reaped=reaped, on_gpu=on_gpu, nvml_listed=after.listed
    )
    return wg.ReclaimEvidence(
        pid=pid,
        process_exited=reaped,
        reaped=reaped,
        nvml_process_used_after=after.measurement,
        reclaimed=verdict.verified,
        on_gpu=on_gpu,
        detail=f"pid {pid} of a failed start: {verdict.why}",
    )


def child_gone(pid: int) -> bool:
    """No child of this worker is at `pid` any more: no process there, or one that is not ours
    (the pid was reused after the reaping). A zombie not yet reaped is still ours."""
    process = process_identity(pid)
    if process is None:
        return True
    try:
        return process.ppid() != os.getpid()
    except psutil.Error:
        return True  # gone between the two reads
