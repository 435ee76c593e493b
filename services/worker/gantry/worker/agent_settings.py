"""What a worker agent runs with (`WorkerSettings`, from `gantry worker`'s flags in settings.py),
and the parts of the agent those settings make: how it starts model hosts, its warm pool, its
probes' settings, the resource domains and GPUs it offers. Kept apart from agent.py, which runs
the streams and jobs with them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gantry.common import tokens
from gantry.common.tls import ClientTls
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.crash_policy import RestartPolicy
from gantry.worker.environment_facts import DEFAULT_FACTS_TIMEOUT_S
from gantry.worker.invocations import DEFAULT_MAX_IN_FLIGHT
from gantry.worker.model_host.cpu_calibration import HostCpu, default_cache_dir
from gantry.worker.model_host.inbox import DEFAULT_INBOX_LIMIT
from gantry.worker.model_host.process import (
    DEFAULT_MAX_PENDING,
    HostLaunchSpec,
    ModelHost,
    OnExit,
)
from gantry.worker.model_host.sandbox import IsolationRequirement
from gantry.worker.model_host.warm_pool import WarmPool
from gantry.worker.nvml_readings import Nvml, visible_devices
from gantry.worker.probe_job import ProbeSettings
from gantry.worker.residents import DEFAULT_MAX_RESIDENTS
from gantry.worker.resource_domains import DeclaredDomain, gpu_devices, measure_node_domains
from gantry.worker.runtime_adapters.base import PrepareRequest, StartRequest
from gantry.worker.supervision import ServingLoad, SupervisionSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    # One address, a comma-separated list, or dns:///name:port (control_planes.py).
    control_plane: str
    credential: str
    artifact_root: Path
    max_residents: int = DEFAULT_MAX_RESIDENTS
    reconnect_max_seconds: float = 10.0
    # How often a dns:/// control plane is resolved again (a replica added or gone is followed).
    resolve_interval_s: float = 30.0
    tls: ClientTls | None = None  # to the control plane; None: plaintext
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # Supervision of model hosts: in-place restarts with backoff, crash loops, liveness pings.
    restart_initial_backoff_s: float = 0.5
    restart_max_backoff_s: float = 30.0
    crash_loop_threshold: int = 3
    crash_loop_window_s: float = 300.0
    crash_loop_backoff_s: float = 60.0
    ping_interval_s: float = 5.0
    ping_timeout_s: float = 3.0
    # Bounds: beyond each, QUEUE_FULL (or, for the outbox, a counted drop: see the docstring).
    outbox_limit: int = 4096
    max_in_flight_invokes: int = DEFAULT_MAX_IN_FLIGHT
    host_max_pending: int = DEFAULT_MAX_PENDING
    host_inbox_limit: int = DEFAULT_INBOX_LIMIT
    # A serving host's start: its load and health check (a managed server: until it answers).
    load_timeout_s: float = 300.0
    # The least sandbox a model host must reach; below it the load fails
    # RUNTIME_ENVIRONMENT_UNAVAILABLE.
    require_isolation: IsolationRequirement = field(default_factory=IsolationRequirement)
    # Each environment's facts script (run at start, concurrently) must answer within this.
    environment_facts_timeout_s: float = DEFAULT_FACTS_TIMEOUT_S
    # A probe's child: its load, its ProbeCheck, and its exit after Shutdown.
    probe_load_timeout_s: float = 300.0
    probe_check_timeout_s: float = 120.0
    probe_stop_grace_s: float = 10.0
    # What the node offers placement (Hello.resource_domains), validated whole; None: measured
    # at start (host.ram, and gpuN.vram per GPU NVML reads).
    resource_domains: tuple[DeclaredDomain, ...] | None = None
    # Model hosts forked from a preloaded fork server per environment (imports done, ready in
    # about a second); False spawns each one as a fresh interpreter (`--no-warm-pool`).
    warm_pool: bool = True
    # Rewritten on each tick of the heartbeat and reconnect loops, connected or not, for
    # `gantry worker --check`; None: no file (`gantry worker` always names one).
    heartbeat_file: Path | None = None
    # Where the model hosts' measured CPU wait policy is kept per machine and environment
    # (model_host/cpu_calibration.py); None: nothing measured, hosts wait PASSIVE.
    host_cpu_cache: Path | None = field(default_factory=default_cache_dir)

    def supervision(self) -> SupervisionSettings:
        return SupervisionSettings(
            restart=RestartPolicy(
                initial_backoff_s=self.restart_initial_backoff_s,
                max_backoff_s=self.restart_max_backoff_s,
                crash_loop_threshold=self.crash_loop_threshold,
                crash_loop_window_s=self.crash_loop_window_s,
                crash_loop_backoff_s=self.crash_loop_backoff_s,
            ),
            ping_interval_s=self.ping_interval_s,
            ping_timeout_s=self.ping_timeout_s,
            max_residents=self.max_residents,
        )


def pooled_host_factory(
    warm_pool: WarmPool | None, host_cpu: HostCpu | None
) -> Callable[..., Coroutine[Any, Any, ModelHost]]:
    """How this agent starts model hosts, residents and probes alike: forked by its warm pool
    (spawned without one), their CPU threads waiting as `host_cpu` measured."""

    async def start(
        spec: HostLaunchSpec,
        *,
        on_exit: OnExit | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> ModelHost:
        return await ModelHost.start(
            spec,
            on_exit=on_exit,
            trace_context=trace_context,
            warm_pool=warm_pool,
            host_cpu=host_cpu,
        )

    return start


def credential_node_id(credential: str) -> str:
    """The node id the node credential names; ValueError when it is malformed."""
    parsed = tokens.parse_token(credential, kind=tokens.NODE_CREDENTIAL)
    if parsed is None:
        raise ValueError("the node credential is malformed")
    return parsed.token_id


def warm_pool_for(
    settings: WorkerSettings, *, shared: WarmPool | None
) -> tuple[WarmPool | None, bool]:
    """The agent's warm pool, and whether it owns it (and so stops it at shutdown): `shared`
    when given, else its own, when its settings ask for one at all."""
    if not settings.warm_pool:
        return None, False
    return shared or WarmPool(), shared is None


def probe_settings(settings: WorkerSettings) -> ProbeSettings:
    return ProbeSettings(
        artifact_root=settings.artifact_root,
        env=settings.env,
        require_isolation=settings.require_isolation,
        max_pending=settings.host_max_pending,
        inbox_limit=settings.host_inbox_limit,
        load_timeout_s=settings.probe_load_timeout_s,
        check_timeout_s=settings.probe_check_timeout_s,
        stop_grace_s=settings.probe_stop_grace_s,
    )


def node_domains(settings: WorkerSettings) -> tuple[DeclaredDomain, ...]:
    """The resource domains placement may fill: as declared, else as measured here (logged)."""
    domains = (
        settings.resource_domains
        if settings.resource_domains is not None
        else measure_node_domains(settings.env)
    )
    log.info("resource domains: %s", ", ".join(d.describe() for d in domains) or "none")
    return domains


def gpu_devices_of(
    settings: WorkerSettings, open_nvml: Callable[[], Nvml]
) -> tuple[common_pb2.GpuDevice, ...]:
    """The GPUs this worker's CUDA processes see, named by NVML (none without it)."""
    nvml = open_nvml()
    try:
        return gpu_devices(nvml, visible_devices(settings.env))
    finally:
        nvml.close()


def serving_load(settings: WorkerSettings, spec: wg.LoadSpec) -> ServingLoad:
    """What supervision prepares and starts for a LOAD job's spec, bounded by these settings."""
    return ServingLoad(
        prepare=PrepareRequest(
            environment_id=spec.environment_id,
            settings=spec.adapter,
            artifact_root=settings.artifact_root,
            artifact_location=spec.artifact_location,
            manifest=spec.manifest,
        ),
        start=StartRequest(
            name=spec.deployment_id,
            load_timeout_s=settings.load_timeout_s,
            max_pending=settings.host_max_pending,
            inbox_limit=settings.host_inbox_limit,
            require_isolation=settings.require_isolation,
        ),
    )
