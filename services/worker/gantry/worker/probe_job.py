"""The PROBE job: load a model in a child that exits afterwards, and report what was measured.

The job drives one runtime adapter (`runtime_adapters`, chosen by name: an unknown one is
RUNTIME_INCOMPATIBLE) through prepare, start, probe and unload. Stages, each announced in a
JobUpdate as it is entered: PREPARING (adapter known, environment available, bytes verified),
LOADING (the child starts exactly as a LOAD's host does, same sandbox and environment),
HEALTHCHECKING (ProbeCheck: a real forward pass, then the profile's worst case, and the child's
memory after them),
READY (evidence taken, NVML read while the child lives), UNLOADING (Shutdown, the child's
HostUnloaded if it sends one, its exit, reaping, NVML again). Invariants:
- A probe host is the job's alone: never in the residents map, never routed, not counted against
  the resident bound.
- The child is reaped before the job reports, whatever happened: a failure, or a CancelJob (the
  child is killed and reaped, a CANCELLED update is sent, and no result, as for every cancelled
  job).
- Every reading is measured or `unavailable` with the reason; reclaim is judged by the one rule
  serving's unloads are (`runtime_adapters/reclaim_verdict.py`): a child that exited and was
  reaped and, where it ran on a GPU, that NVML was read and no longer lists.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gantry.common.digests import adapter_digest
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import discard_copy
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.model_host.inbox import DEFAULT_INBOX_LIMIT
from gantry.worker.model_host.process import DEFAULT_MAX_PENDING
from gantry.worker.model_host.sandbox import IsolationRequirement
from gantry.worker.nvml_readings import Nvml, visible_devices
from gantry.worker.runtime_adapters.base import (
    PrepareRequest,
    RunningRuntime,
    RuntimeAdapter,
    StartRequest,
)
from gantry.worker.runtime_adapters.model_host_runtime import (
    ProbeHost,
    ProbeHostFactory,
    fill_unreported,
    record_unload,
)
from gantry.worker.runtime_adapters.registry import runtime_adapter_for

EmitUpdate = Callable[[wg.JobUpdate], None]
NOT_ROUTED = "NOT_ROUTED"

# Re-exported: tests and callers name the model host a probe needs from here.
__all__ = [
    "NOT_ROUTED",
    "ProbeHost",
    "ProbeHostFactory",
    "ProbeRunner",
    "ProbeSettings",
    "record_unload",
]


@dataclass(frozen=True, kw_only=True)
class ProbeSettings:
    artifact_root: Path
    verified_root: Path | None = None  # where verified copies go; None: the default
    env: Mapping[str, str] = field(default_factory=dict)  # the worker's (CUDA_VISIBLE_DEVICES)
    require_isolation: IsolationRequirement = field(default_factory=IsolationRequirement)
    max_pending: int = DEFAULT_MAX_PENDING
    inbox_limit: int = DEFAULT_INBOX_LIMIT
    load_timeout_s: float = 300.0
    check_timeout_s: float = 120.0
    stop_grace_s: float = 10.0


class ProbeRunner:
    def __init__(
        self,
        settings: ProbeSettings,
        *,
        environments: RuntimeEnvironments,
        host_factory: ProbeHostFactory | None = None,
        open_nvml: Callable[[], Nvml] = Nvml.open,
    ) -> None:
        self._settings = settings
        self._environments = environments
        # A test's host factory replaces how model-host adapters start their children.
        self._host_factory = host_factory
        self._open_nvml = open_nvml
        # The pids of the probes' hosts now running: GPU processes this worker started.
        self.running_pids: set[int] = set()

    def _adapter(self, name: str) -> RuntimeAdapter:
        return runtime_adapter_for(name, host_factory=self._host_factory)

    async def run(self, assignment: wg.JobAssignment, emit: EmitUpdate) -> wg.ProbeEvidence:
        """The probe's evidence; raises GantryError (RUNTIME_INCOMPATIBLE,
        RUNTIME_ENVIRONMENT_UNAVAILABLE, ARTIFACT_MISMATCH, LOAD_FAILED, HEALTH_FAILED, ...)
        and CancelledError only once no child of it is left."""
        spec = assignment.probe

        def enter(state: common_pb2.ProbeState, progress: str) -> None:
            emit(
                wg.JobUpdate(
                    job_id=assignment.job_id,
                    lease_token=assignment.lease_token,
                    state=wg.JOB_STATE_RUNNING,
                    probe_state=state,
                    progress=progress,
                )
            )

        enter(common_pb2.PROBE_STATE_PREPARING, "checking the adapter, environment and bytes")
        # An unknown adapter fails before anything else runs (RUNTIME_INCOMPATIBLE).
        adapter = self._adapter(spec.adapter.adapter)
        prepared = await adapter.prepare(
            self._prepare_request(spec), environments=self._environments
        )
        nvml = self._open_nvml()
        try:
            evidence = wg.ProbeEvidence(
                environment_id=prepared.environment.environment_id,
                environment_fingerprint=prepared.fingerprint,
                files_verified=prepared.files_verified,
                bytes_verified=prepared.bytes_verified,
                adapter=adapter.name,
                adapter_digest=adapter_digest(spec.adapter),
            )
            enter(common_pb2.PROBE_STATE_LOADING, f"model host with {prepared.python_executable}")
            # A failed or cancelled start leaves no process of it behind before it raises.
            running = await adapter.start(prepared, self._start_request(spec))
            with self._running(running.pid):
                try:
                    await self._check(adapter, running, spec.adapter.device, nvml, evidence, enter)
                except BaseException:
                    await adapter.stop(running, grace_s=0)
                    raise
                enter(common_pb2.PROBE_STATE_UNLOADING, f"stopping pid {running.pid}")
                grace_s = self._settings.stop_grace_s
                unloaded = await adapter.unload(running, grace_s=grace_s, nvml=nvml)
            evidence.memory.cuda_allocated_after_unload.CopyFrom(
                unloaded.cuda_allocated_after_unload
            )
            fill_unreported(evidence.memory)
            evidence.reclaim.CopyFrom(unloaded.reclaim)
            return evidence
        except asyncio.CancelledError:
            # Only reached once the child (if any) is reaped: say so, then end without a result.
            enter(common_pb2.PROBE_STATE_CANCELLED, "cancelled; no model host of it is left")
            raise
        finally:
            nvml.close()
            discard_copy(prepared.directory)

    @contextlib.contextmanager
    def _running(self, pid: int) -> Iterator[None]:
        """`pid` is one of `running_pids` while the probe's host runs (until it is unloaded)."""
        self.running_pids.add(pid)
        try:
            yield
        finally:
            self.running_pids.discard(pid)

    def _prepare_request(self, spec: wg.ProbeSpec) -> PrepareRequest:
        return PrepareRequest(
            environment_id=spec.environment_id,
            settings=spec.adapter,
            artifact_root=self._settings.artifact_root,
            artifact_location=spec.artifact.artifact_location,
            manifest=spec.artifact.manifest,
            verified_root=self._settings.verified_root,
        )

    def _start_request(self, spec: wg.ProbeSpec) -> StartRequest:
        return StartRequest(
            name=f"probe-{spec.probe_id}",
            require_isolation=self._settings.require_isolation,
            load_timeout_s=self._settings.load_timeout_s,
            max_pending=self._settings.max_pending,
            inbox_limit=self._settings.inbox_limit,
        )

    async def _check(
        self,
        adapter: RuntimeAdapter,
        running: RunningRuntime,
        device: str,
        nvml: Nvml,
        evidence: wg.ProbeEvidence,
        enter: Callable[[common_pb2.ProbeState, str], None],
    ) -> None:
        evidence.runtime_versions.update(running.runtime_versions)
        evidence.load_seconds = running.load_seconds
        enter(common_pb2.PROBE_STATE_HEALTHCHECKING, f"pid {running.pid}: a forward pass")
        result = await adapter.probe(running, timeout_s=self._settings.check_timeout_s)
        evidence.offline.CopyFrom(result.offline)
        evidence.first_invoke_seconds = result.first_invoke_seconds
        evidence.output_shape.extend(result.output_shape)
        evidence.output_finite = result.output_finite
        evidence.health.CopyFrom(result.health)
        # The worker never routes a probe's host, whatever the child believes.
        evidence.health.capability.CopyFrom(
            wg.HealthLayer(status=wg.HEALTH_STATUS_NOT_CHECKED, detail=NOT_ROUTED)
        )
        evidence.worst_case.CopyFrom(result.worst_case)
        if not result.HasField("worst_case"):  # a managed server's probe runs none
            evidence.worst_case.detail = f"the {adapter.name} runtime ran no worst-case pass"
        evidence.memory.CopyFrom(result.memory)
        memory = evidence.memory
        # Read right after the worst-case pass: the caching allocator keeps what that pass
        # reserved, so the process's figure is its peak (the CUDA context included).
        total, used = nvml.device_memory(device, visible_devices(self._settings.env))
        memory.nvml_device_total.CopyFrom(total)
        memory.nvml_device_used.CopyFrom(used)
        memory.nvml_process_used.CopyFrom(nvml.process_usage(running.pid).measurement)
        model = evidence.health.model
        verdict = wg.HealthStatus.Name(model.status).removeprefix("HEALTH_STATUS_")
        enter(common_pb2.PROBE_STATE_READY, f"evidence taken; model {verdict}: {model.detail}")
