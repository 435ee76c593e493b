"""A probe's evidence as the child sees it: a forward pass, its memory, how it stayed offline.

The load path records what can only be read then (the CUDA allocator before the model existed,
the first forward pass's duration, the sandbox reached); a later ProbeCheck adds a fresh forward
pass and the memory now. NVML readings are the worker's: the child leaves them unset.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import timestamp_pb2

from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.model_host import cuda_oom, hardening, observed
from gantry.worker.model_host.adapters import ForwardCheck, ModelAdapter
from gantry.worker.model_host.landlock import Isolation
from gantry.worker.model_host.memory_readings import CudaAllocator, rss_current, rss_peak

# The environment variables that keep Hugging Face libraries off the network, as the child sees
# them (whatever their value: a flag set to "0" is evidence too).
OFFLINE_ENV_PREFIXES = ("HF_", "TRANSFORMERS_")
NOT_ROUTED = "NOT_ROUTED"


@dataclass(frozen=True, kw_only=True)
class LoadRecord:
    """Facts only the load path can take, kept for a later ProbeCheck and Shutdown."""

    isolation: Isolation
    # The verified artifact copy the model was read from: the weight files' expected origin.
    model_directory: Path
    cuda: CudaAllocator
    cuda_allocated_before_load: common_pb2.Measurement
    # Read right after the model is constructed, before its first forward pass.
    cuda_allocated_after_load: common_pb2.Measurement
    cuda_reserved_after_load: common_pb2.Measurement
    first_invoke_seconds: float


def network_guard_installed() -> bool:
    """Whether `hardening.install_network_guard` replaced the socket calls in this process."""
    return all(
        getattr(function, "__module__", None) == hardening.__name__
        for function in (socket.socket.connect, socket.socket.connect_ex, socket.create_connection)
    )


def offline_evidence(
    adapter: ModelAdapter, isolation: Isolation, model_directory: Path
) -> wg.OfflineEvidence:
    """The adapter's declared library settings, then what this process observes of itself now:
    its environment, its network guard, the code it imported and the weight files it read."""
    seen = observed.observe(model_directory)
    return wg.OfflineEvidence(
        local_files_only=adapter.local_files_only,
        trust_remote_code=adapter.trust_remote_code,
        offline_env={
            name: value
            for name, value in sorted(os.environ.items())
            if name.startswith(OFFLINE_ENV_PREFIXES)
        },
        isolation=isolation.wire,
        isolation_reason=isolation.reason,
        network_guard=network_guard_installed(),
        remote_code_modules=seen.remote_code_modules,
        weight_files=seen.weight_files,
        weight_files_outside_copy=seen.weight_files_outside_copy,
        opens_observed=seen.opens_observed,
    )


def _layer(status: wg.HealthStatus, detail: str) -> wg.HealthLayer:
    return wg.HealthLayer(status=status, detail=detail)


def model_layer(check: ForwardCheck) -> wg.HealthLayer:
    if check.ok:
        return _layer(wg.HEALTH_STATUS_OK, check.detail)
    return _layer(wg.HEALTH_STATUS_FAILED, check.problem or check.detail)


def run_check(adapter: ModelAdapter, *, oom_raises: bool = False) -> ForwardCheck:
    """The adapter's health check; a forward pass that raises is a failed check, not a crash. A
    CUDA out-of-memory hands the failed pass's memory back first, or with `oom_raises` (the
    load's own check) is raised for the load to fail with."""
    started = time.monotonic()
    try:
        return adapter.health_check()
    except Exception as exc:
        if cuda_oom.is_cuda_oom(exc):
            if oom_raises:
                raise
            cuda_oom.release_after(exc)
        problem = f"forward pass failed: {type(exc).__name__}: {exc}"
        return ForwardCheck(
            shape=(),
            finite=False,
            seconds=time.monotonic() - started,
            problem=problem,
            detail=problem,
        )


def run_worst_case(
    adapter: ModelAdapter, check: ForwardCheck
) -> tuple[ForwardCheck, wg.WorstCasePass]:
    """After a passing health check, the adapter's worst-case pass: what it ran, and the check
    failed when it fails (a profile whose own worst case fails, CUDA out of memory included, is
    not one to approve)."""
    if not check.ok:
        return check, wg.WorstCasePass(detail="not run: the health check failed")
    try:
        ran = adapter.worst_case_check()
    except Exception as exc:
        if cuda_oom.is_cuda_oom(exc):
            cuda_oom.release_after(exc)
        problem = f"worst-case pass failed: {type(exc).__name__}: {exc}"
        return check.failed(problem), wg.WorstCasePass(detail=problem)
    if ran is None:
        detail = (
            f"adapter {adapter.name!r} has no worst-case pass: the peaks are those of its "
            "health check's one input"
        )
        return check, wg.WorstCasePass(detail=detail)
    worst, case = ran
    wire = wg.WorstCasePass(
        ran=True,
        batch_inputs=case.batch_inputs,
        input_tokens=case.input_tokens,
        generated_tokens=case.generated_tokens,
        context_tokens=case.context_tokens,
        detail=case.detail,
    )
    if not worst.ok:
        return check.failed(f"worst-case pass ({case.detail}): {worst.problem}"), wire
    return check, wire


def probe_result(adapter: ModelAdapter, record: LoadRecord) -> model_host_pb2.ProbeResult:
    """One real forward pass now, then the profile's worst case, then the memory as it stands
    after them: the allocator's peak covers both, and the worker reads NVML right after."""
    started = time.monotonic()
    check, worst_case = run_worst_case(adapter, run_check(adapter))
    checked_at = timestamp_pb2.Timestamp()
    checked_at.GetCurrentTime()
    health = wg.HealthReport(
        process=_layer(wg.HEALTH_STATUS_OK, f"pid {os.getpid()} running"),
        runtime=_layer(wg.HEALTH_STATUS_OK, "answered ProbeCheck over its pipe"),
        model=model_layer(check),
        latency_seconds=time.monotonic() - started,
        checked_at=checked_at,
        capability=_layer(wg.HEALTH_STATUS_NOT_CHECKED, NOT_ROUTED),
    )
    memory = wg.MemoryEvidence(
        rss_current=rss_current(),
        rss_peak=rss_peak(),
        cuda_allocated_before_load=record.cuda_allocated_before_load,
        cuda_allocated_after_load=record.cuda_allocated_after_load,
        cuda_reserved_after_load=record.cuda_reserved_after_load,
        # The allocator's high-water mark since the process started: load and forward passes.
        cuda_peak_allocated=record.cuda.peak_allocated(),
    )
    return model_host_pb2.ProbeResult(
        health=health,
        output_shape=list(check.shape),
        output_finite=check.finite,
        first_invoke_seconds=record.first_invoke_seconds,
        memory=memory,
        offline=offline_evidence(adapter, record.isolation, record.model_directory),
        worst_case=worst_case,
    )


def unloaded(adapter: ModelAdapter, cuda: CudaAllocator) -> model_host_pb2.HostUnloaded:
    """Release the model, then read what the CUDA allocator still holds."""
    adapter.release()
    return model_host_pb2.HostUnloaded(cuda_allocated_after_unload=cuda.allocated())
