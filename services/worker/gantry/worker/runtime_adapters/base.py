"""What every worker-side runtime adapter does, from static inspection to a reclaimed process.

The lifecycle is the same whatever runs the model: `inspect_support` (can it execute what static
inspection found), `collect_runtime_facts` (can an environment run it), `prepare` (verified bytes
and a resolved environment), `start`, `probe`, `health`, `stop` and `unload`, and for serving
`terminate` (the worker's own stop) and `kill_unresponsive` (a hung runtime). The PROBE job
(`probe_job`) and serving (`supervision`) both drive these methods and nothing else: no path in
the worker starts, checks or stops a runtime except through its adapter. A model runs in a
model-host child (`model_host_runtime`) or a managed server process (`managed_server_runtime`);
what crosses `start`, `health` and `stop` is this module's own small dataclasses and the
gateway's evidence messages, never a model-host type. Adapters are stateless: one instance per
adapter serves every job (see `registry`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NotRequired, Protocol, TypedDict, Unpack

from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.v1.model_host_pb2 import ProbeResult
from gantry.worker.model_host.sandbox import IsolationRequirement
from gantry.worker.nvml_readings import Nvml
from gantry.worker.runtime_adapters.reclaim_verdict import is_gpu_device

if TYPE_CHECKING:
    from gantry.worker.environment_facts import RuntimeFacts


@dataclass(frozen=True, kw_only=True)
class Support:
    """Whether an adapter can execute what static inspection found, and why not when it cannot."""

    adapter: str
    supported: bool
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class AdapterFacts:
    """What one adapter has in one runtime environment, read from its facts script's answer."""

    adapter: str
    available: bool
    modalities: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)  # of the packages it needs
    reason: str = ""  # why it is unavailable; empty when available


class EnvironmentResolver(Protocol):
    """What `prepare` needs of the worker's environments (`RuntimeEnvironments`)."""

    async def require(self, environment_id: str, *, adapter: str | None = ...) -> RuntimeFacts: ...


@dataclass(frozen=True, kw_only=True)
class PrepareRequest:
    """The bytes and environment one job asks an adapter to run."""

    environment_id: str
    settings: common_pb2.AdapterSettings
    artifact_root: Path
    artifact_location: str  # relative to artifact_root
    manifest: Sequence[common_pb2.ManifestEntry]
    verified_root: Path | None = None  # where the verified copy goes; None: the default


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """Verified bytes and the environment that will run them. The caller owns `directory` (a
    private verified copy) and removes it when its job ends (`artifact_copies.discard_copy`)."""

    adapter: str
    settings: common_pb2.AdapterSettings
    directory: Path
    files_verified: int
    bytes_verified: int
    python_executable: str
    environment: wg.RuntimeEnvironment

    @property
    def fingerprint(self) -> str:
        return self.environment.fingerprint


@dataclass(frozen=True, kw_only=True)
class StartRequest:
    """How to start a runtime for prepared bytes: what it is known by, and its bounds."""

    name: str  # the deployment id, or "probe-<id>": what the process is known by
    load_timeout_s: float
    max_pending: int  # requests awaiting an answer; QUEUE_FULL beyond
    inbox_limit: int  # requests queued inside the runtime; QUEUE_FULL beyond
    require_isolation: IsolationRequirement = field(default_factory=IsolationRequirement)
    trace_context: Mapping[str, str] = field(default_factory=dict)
    # Serving's: told (with the process's handle and its return code) when the process exits
    # without being asked, so supervision restarts it. A probe's runtime reports no exit.
    on_exit: Callable[[Any, int], None] | None = None


@dataclass(eq=False, kw_only=True)
class RunningRuntime:
    """A started runtime: a loaded model in a process the worker holds custody of. Adapters
    subclass it to keep their own handle; callers read only these fields."""

    adapter: str
    pid: int
    load_seconds: float
    runtime_versions: Mapping[str, str]
    device: str = ""  # the profile's torch device ("cpu", "cuda:0"); "" where none (adopted)
    # NVML listed the pid at some reading (load, health, before the unload): it holds device
    # memory whatever its device says, so its reclaim needs NVML too (`reclaim_verdict`).
    gpu_seen: bool = False

    @property
    def on_gpu(self) -> bool:
        return is_gpu_device(self.device) or self.gpu_seen


class HealthCheck(TypedDict):
    """What a health check is asked (one declaration for the adapters that answer it)."""

    deep: bool  # the model layer too: one real forward pass
    timeout_s: float  # for the ping (and the forward pass unless model_timeout_s)
    model_timeout_s: NotRequired[float | None]


@dataclass(frozen=True, kw_only=True)
class Health:
    """A health check's report, and whether the runtime left its ping unanswered in time while
    its process lived: hung. What to do about that is the caller's policy (supervision kills
    and restarts it); the check itself never acts."""

    report: wg.HealthReport
    unanswered: str = ""  # why it counts as hung; empty when it answered (or failed otherwise)


@dataclass(frozen=True, kw_only=True)
class Unloaded:
    """What an unload established: how the process ended and whether its memory came back."""

    stopped: wg.UnloadEvidence
    reclaim: wg.ReclaimEvidence
    # The runtime's own reading after it released the model, or unavailable with the reason.
    cuda_allocated_after_unload: common_pb2.Measurement


class RuntimeAdapter(abc.ABC):
    """One way of running a model, seen from the worker. Subclasses set the class attributes."""

    name: ClassVar[str]  # as AdapterSettings.adapter names it
    task: ClassVar[str]  # "embedding", "reranking"
    modalities: ClassVar[tuple[str, ...]]

    @abc.abstractmethod
    def inspect_support(self, inspection: wg.Inspection) -> Support:
        """Whether this adapter executes the layout static inspection found (inspector, task,
        details), and the reason when not. Pure; never raises for the inspection's content.
        Refusing findings and the environment are the dispatcher's concern."""

    @abc.abstractmethod
    def collect_runtime_facts(self, facts: Mapping[str, object]) -> AdapterFacts:
        """What this adapter has in one environment, from the environment's facts-script answer
        (a JSON object: `versions`, `adapters`, ...): available or why not, and the versions of
        the packages it needs. Pure; a malformed answer is unavailable, never an exception."""

    @abc.abstractmethod
    async def prepare(
        self, request: PrepareRequest, *, environments: EnvironmentResolver
    ) -> Prepared:
        """Resolve the environment (it must be able to run this adapter), then verify the bytes
        into a private copy. Raises GantryError: RUNTIME_ENVIRONMENT_UNAVAILABLE, ARTIFACT_MISMATCH,
        ARTIFACT_PATH_INVALID, RUNTIME_INCOMPATIBLE (the static gate refused the bytes). Leaves no
        copy behind when it raises or is cancelled."""

    @abc.abstractmethod
    async def start(self, prepared: Prepared, request: StartRequest) -> RunningRuntime:
        """Start a runtime with the model loaded and health-checked. Raises GantryError:
        LOAD_FAILED, HEALTH_FAILED, RUNTIME_ENVIRONMENT_UNAVAILABLE (cannot be spawned, or less
        isolation than required). Nothing it started outlives a failed or cancelled start."""

    @abc.abstractmethod
    async def probe(self, running: RunningRuntime, *, timeout_s: float) -> ProbeResult:
        """One real forward pass on the adapter's fixed input, with the runtime's own memory and
        offline evidence: the probe's measurement. Raises GantryError: HEALTH_FAILED (no answer
        in time, or not a probe result), RUNTIME_CRASHED (the runtime died)."""

    @abc.abstractmethod
    async def health(self, running: RunningRuntime, **check: Unpack[HealthCheck]) -> Health:
        """The process, runtime (a ping answered within `timeout_s`) and, when `deep`, model
        (one real forward pass within `model_timeout_s`, else `timeout_s`) layers. Never raises
        for the runtime's faults: a failed layer says why."""

    @abc.abstractmethod
    async def stop(self, running: RunningRuntime, *, grace_s: float) -> wg.UnloadEvidence:
        """End the process (asked to exit within `grace_s`, killed after; `grace_s <= 0` kills at
        once) and confirm it gone, killing again a bounded number of times. The evidence says
        `process_exited=false` when it could not be confirmed; it does not raise for that."""

    @abc.abstractmethod
    async def terminate(
        self, running: RunningRuntime, *, grace_s: float, reap_s: float
    ) -> wg.UnloadEvidence:
        """The worker itself is stopping: SIGTERM now, SIGKILL after `grace_s`, reaped within
        `reap_s` more; nothing is released or measured first. Evidence as `stop` reports it."""

    @abc.abstractmethod
    def kill_unresponsive(self, running: RunningRuntime, why: str) -> None:
        """End a runtime that stopped answering: its calls fail RUNTIME_UNRESPONSIVE from now on
        and it is SIGKILLed; its exit still reaches `StartRequest.on_exit`, like a crash."""

    @abc.abstractmethod
    async def unload(self, running: RunningRuntime, *, grace_s: float, nvml: Nvml) -> Unloaded:
        """Release the model, stop the process and check reclaim (`reclaim_verdict`): it exited,
        was reaped, and, where it ran on a GPU, NVML was read and no longer lists it. NVML is
        read for the pid before the stop and after. A cancelled unload kills the process before
        it re-raises."""


def health_report(
    *,
    process: tuple[wg.HealthStatus, str],
    runtime: tuple[wg.HealthStatus, str],
    model: tuple[wg.HealthStatus, str],
    since: float | None = None,
) -> wg.HealthReport:
    """A health report of its three layers (status, detail), checked now; its latency runs from
    `since` (a monotonic reading), or is 0 when nothing was timed."""
    report = wg.HealthReport(
        process=wg.HealthLayer(status=process[0], detail=process[1]),
        runtime=wg.HealthLayer(status=runtime[0], detail=runtime[1]),
        model=wg.HealthLayer(status=model[0], detail=model[1]),
        latency_seconds=time.monotonic() - since if since is not None else 0.0,
    )
    report.checked_at.GetCurrentTime()
    return report
