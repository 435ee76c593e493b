"""The lifecycle shared by adapters whose model runs inside a model-host child.

Everything here delegates: bytes to `artifact_copies`, environments to `RuntimeEnvironments`,
the child to `ModelHost` (its stop ladder, probe check, ping), device memory to `nvml_readings`.
A probe's child and a serving resident's are started, checked and stopped by the same methods;
serving adds an exit callback (`StartRequest.on_exit`), `terminate` and `kill_unresponsive`.
An adapter module adds only what differs: its name, task, modalities, the packages it needs and
the layout it supports (a `layouts.LayoutMatch`, which answers `inspect_support`). Invariant:
nothing this module starts outlives a failed, cancelled or finished stop: `stop` kills again
until the child is confirmed gone or the attempts run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Unpack, runtime_checkable

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.artifact_copies import manifest_of, verified_copy
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.nvml_readings import Nvml, ProcessUsage
from gantry.worker.runtime_adapters.base import (
    AdapterFacts,
    EnvironmentResolver,
    Health,
    HealthCheck,
    Prepared,
    PrepareRequest,
    RunningRuntime,
    RuntimeAdapter,
    StartRequest,
    Unloaded,
    health_report,
)
from gantry.worker.runtime_adapters.layouts import LayoutMatch
from gantry.worker.runtime_adapters.reclaim_verdict import reclaim_verdict

if TYPE_CHECKING:
    from gantry.worker.runtime_adapters.base import Support

log = logging.getLogger(__name__)

# A child not confirmed gone after a stop is stopped again (SIGKILL each time) this often.
_REAP_ATTEMPTS = 3
OK = wg.HEALTH_STATUS_OK
FAILED = wg.HEALTH_STATUS_FAILED
NOT_CHECKED = wg.HEALTH_STATUS_NOT_CHECKED


class ProbeHost(Protocol):
    """What the lifecycle needs of a model host child (`ModelHost`; tests pass wrappers)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def ready(self) -> model_host_pb2.HostReady: ...

    @property
    def unloaded(self) -> model_host_pb2.HostUnloaded | None: ...

    async def probe_check(self, *, timeout_s: float) -> model_host_pb2.ProbeResult: ...

    async def stop(self, *, grace_s: float = ...) -> wg.UnloadEvidence: ...

    async def kill(self) -> wg.UnloadEvidence: ...


@runtime_checkable
class _CheckableHost(Protocol):
    """A host that answers a ping and a model check (`ModelHost`) as well."""

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong: ...

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport: ...


@runtime_checkable
class _ServingHost(Protocol):
    """A host a serving resident runs on (`ModelHost`, `ManagedServer`): the worker's own stop
    and the liveness kill, beyond what a probe needs."""

    async def terminate(self, *, grace_s: float, reap_s: float = ...) -> wg.UnloadEvidence: ...

    def kill_unresponsive(self, why: str) -> None: ...


class ProbeHostFactory(Protocol):
    """How an adapter starts its child (`ModelHost.start`; a warm pool's fork; a test's)."""

    async def __call__(
        self,
        spec: HostLaunchSpec,
        *,
        on_exit: Callable[[Any, int], None] | None = ...,
        trace_context: Mapping[str, str] | None = ...,
    ) -> ProbeHost: ...


@dataclass(eq=False, kw_only=True)
class HostRunning(RunningRuntime):
    """A running model-host child; only this module reads `host`."""

    host: ProbeHost


class ModelHostRuntime(RuntimeAdapter):
    """An adapter whose model a model-host child loads (`model_host/adapters` of the same name)."""

    # Distribution names, as the facts script reports their versions.
    packages: ClassVar[tuple[str, ...]]
    # The inspected layout it runs; a kind that decides otherwise overrides `inspect_support`.
    layout: ClassVar[LayoutMatch]

    def __init__(self, *, host_factory: ProbeHostFactory | None = None) -> None:
        self._host_factory: ProbeHostFactory = host_factory or ModelHost.start

    def launched_by(self, host_factory: ProbeHostFactory) -> ModelHostRuntime:
        """This adapter starting its children with `host_factory` (a test's wrapper)."""
        return type(self)(host_factory=host_factory)

    def inspect_support(self, inspection: wg.Inspection) -> Support:
        return self.layout.support(self.name, inspection)

    def collect_runtime_facts(self, facts: Mapping[str, object]) -> AdapterFacts:
        # The facts script proves importability without importing (see environment_facts) and
        # lists the adapters whose packages it found; this reads its answer for this adapter.
        listed = facts.get("adapters")
        versions = facts.get("versions")
        known = versions if isinstance(versions, dict) else {}
        found = {package: str(known[package]) for package in self.packages if package in known}
        if isinstance(listed, list) and self.name in listed:
            return AdapterFacts(
                adapter=self.name, available=True, modalities=self.modalities, versions=found
            )
        missing = [package for package in self.packages if package not in found]
        why = (
            f"missing {', '.join(missing)}"
            if missing
            else "the facts script did not find it importable"
        )
        return AdapterFacts(
            adapter=self.name,
            available=False,
            modalities=self.modalities,
            versions=found,
            reason=f"adapter {self.name!r} needs {', '.join(self.packages)}: {why}",
        )

    async def prepare(
        self, request: PrepareRequest, *, environments: EnvironmentResolver
    ) -> Prepared:
        runtime = await environments.require(request.environment_id, adapter=self.name)
        verified = await verified_copy(
            request.artifact_root,
            request.artifact_location,
            manifest_of(request.manifest),
            allow_pickle=request.settings.allow_pickle_weights,
            verified_root=request.verified_root,
        )
        return Prepared(
            adapter=self.name,
            settings=request.settings,
            directory=verified.directory,
            files_verified=verified.files_verified,
            bytes_verified=verified.bytes_verified,
            python_executable=runtime.python_executable,
            environment=runtime.environment,
        )

    async def start(self, prepared: Prepared, request: StartRequest) -> RunningRuntime:
        launch = HostLaunchSpec(
            deployment_id=request.name,
            model_directory=prepared.directory,
            adapter=prepared.settings,
            python_executable=prepared.python_executable,
            require_isolation=request.require_isolation,
            load_timeout_s=request.load_timeout_s,
            max_pending=request.max_pending,
            inbox_limit=request.inbox_limit,
        )
        # A failed or cancelled start kills and reaps its child before it raises.
        host = await self._host_factory(
            launch, on_exit=request.on_exit, trace_context=dict(request.trace_context)
        )
        return HostRunning(
            adapter=self.name,
            pid=host.pid,
            load_seconds=host.ready.load_seconds,
            runtime_versions=dict(host.ready.runtime_versions),
            device=prepared.settings.device,
            host=host,
        )

    async def probe(
        self, running: RunningRuntime, *, timeout_s: float
    ) -> model_host_pb2.ProbeResult:
        try:
            return await _host(running).probe_check(timeout_s=timeout_s)
        except GantryError as error:
            # No answer in time, or an answer that is not a probe result: the check failed.
            # A crash stays RUNTIME_CRASHED (its own, more precise reason).
            if error.reason in ("DEADLINE_EXCEEDED", "INVOKE_FAILED"):
                raise GantryError(
                    "HEALTH_FAILED", f"the probe check failed: {error.message}", **error.metadata
                ) from error
            raise

    async def health(self, running: RunningRuntime, **check: Unpack[HealthCheck]) -> Health:
        deep, timeout_s = check["deep"], check["timeout_s"]
        model_timeout_s = check.get("model_timeout_s") or timeout_s
        host = _host(running)
        if host.returncode is not None:
            return Health(
                report=health_report(
                    process=(FAILED, f"pid {host.pid} exited ({host.returncode})"),
                    runtime=(NOT_CHECKED, "the process is gone"),
                    model=(NOT_CHECKED, "the process is gone"),
                )
            )
        process = (OK, f"pid {host.pid} alive")
        started = time.monotonic()
        if not isinstance(host, _CheckableHost):
            return Health(
                report=health_report(
                    process=process,
                    runtime=(NOT_CHECKED, "this host answers no ping"),
                    model=(NOT_CHECKED, "this host answers no ping"),
                )
            )
        try:
            await host.ping(timeout_s=timeout_s)
        except GantryError as error:
            # No answer in time from a live process is a hang; any other failure says itself.
            hung = error.reason == "DEADLINE_EXCEEDED"
            why = f"no answer to a ping within {timeout_s:g}s" if hung else error.message
            report = health_report(process=process, runtime=(FAILED, why), model=_unchecked(deep))
            return Health(report=report, unanswered=why if hung else "")
        runtime = (OK, f"ping answered in {time.monotonic() - started:.3f}s")
        if not deep:
            return Health(
                report=health_report(
                    process=process, runtime=runtime, model=_unchecked(deep), since=started
                )
            )
        try:
            checked = await host.check_model(timeout_s=model_timeout_s)
        except GantryError as error:
            return Health(
                report=health_report(
                    process=process, runtime=runtime, model=(FAILED, error.message)
                )
            )
        model = (checked.model.status, checked.model.detail)
        return Health(
            report=health_report(process=process, runtime=runtime, model=model, since=started)
        )

    async def stop(self, running: RunningRuntime, *, grace_s: float) -> wg.UnloadEvidence:
        host = _host(running)
        stopped = await (host.kill() if grace_s <= 0 else host.stop(grace_s=grace_s))
        for _ in range(_REAP_ATTEMPTS):
            if stopped.process_exited:
                break
            log.warning("model host %d not confirmed gone; killing it again", host.pid)
            with contextlib.suppress(Exception):
                stopped = await host.kill()
        return stopped

    async def terminate(
        self, running: RunningRuntime, *, grace_s: float, reap_s: float
    ) -> wg.UnloadEvidence:
        return await _serving_host(running).terminate(grace_s=grace_s, reap_s=reap_s)

    def kill_unresponsive(self, running: RunningRuntime, why: str) -> None:
        _serving_host(running).kill_unresponsive(why)

    async def unload(self, running: RunningRuntime, *, grace_s: float, nvml: Nvml) -> Unloaded:
        # NVML's reading of the pid before the stop: the "before" of the reclaim, and proof
        # that it held device memory (then its reclaim must see NVML let go of it).
        before = read_process_usage(running, nvml)
        # The child releases the model as it handles Shutdown (answering HostUnloaded first).
        try:
            stopped = await self.stop(running, grace_s=grace_s)
        except asyncio.CancelledError:
            await self.stop(running, grace_s=0)
            raise
        host = _host(running)
        evidence = wg.ProbeEvidence()
        evidence.reclaim.nvml_process_used_before.CopyFrom(before.measurement)
        record_unload(host, stopped, nvml, evidence, on_gpu=running.on_gpu)
        return Unloaded(
            stopped=stopped,
            reclaim=evidence.reclaim,
            cuda_allocated_after_unload=evidence.memory.cuda_allocated_after_unload,
        )


def _host(running: RunningRuntime) -> ProbeHost:
    if not isinstance(running, HostRunning):
        raise GantryError(
            "INTERNAL", f"a {running.adapter} runtime is not a model host (pid {running.pid})"
        )
    return running.host


def running_host(running: RunningRuntime) -> ProbeHost:
    """The host a running model-host or managed-server runtime holds: serving routes its
    invocations to it (supervision starts every serving host through an adapter)."""
    return _host(running)


def held_runtime(host: ProbeHost, *, adapter: str) -> RunningRuntime:
    """A runtime no adapter started (an adopted endpoint's client, pid 0): checked and
    forgotten by the same `health` and `stop`, never started, restarted or signalled."""
    return HostRunning(
        adapter=adapter,
        pid=host.pid,
        load_seconds=host.ready.load_seconds,
        runtime_versions=dict(host.ready.runtime_versions),
        host=host,
    )


def _serving_host(running: RunningRuntime) -> _ServingHost:
    host = _host(running)
    if not isinstance(host, _ServingHost):
        raise GantryError(
            "INTERNAL", f"the {running.adapter} host (pid {running.pid}) is not a serving host"
        )
    return host


def _unchecked(deep: bool) -> tuple[wg.HealthStatus, str]:
    if deep:
        return (NOT_CHECKED, "the runtime did not answer, so the model was not run")
    return (NOT_CHECKED, "a liveness ping does not run the model")


def read_process_usage(running: RunningRuntime, nvml: Nvml) -> ProcessUsage:
    """NVML's reading of a running runtime's pid; a pid NVML lists marks the runtime as one
    that held device memory (`RunningRuntime.gpu_seen`), whatever its device says."""
    usage = nvml.process_usage(running.pid)
    if usage.listed:
        running.gpu_seen = True
    return usage


def record_unload(
    host: ProbeHost,
    stopped: wg.UnloadEvidence,
    nvml: Nvml,
    evidence: wg.ProbeEvidence,
    *,
    on_gpu: bool,
) -> None:
    """The after-unload CUDA reading and the reclaim verdict (`reclaim_verdict`) of a stopped
    child, into `evidence` (its memory readings left unset are said to be unreported, never
    zero). `on_gpu`: it ran on a GPU, or NVML listed it (`RunningRuntime.on_gpu`)."""
    memory = evidence.memory
    unloaded = host.unloaded
    if unloaded is not None and unloaded.HasField("cuda_allocated_after_unload"):
        memory.cuda_allocated_after_unload.CopyFrom(unloaded.cuda_allocated_after_unload)
    else:
        memory.cuda_allocated_after_unload.CopyFrom(
            common_pb2.Measurement(
                unavailable="the model host sent no HostUnloaded before exiting",
                source="torch.cuda.memory_allocated",
            )
        )
    fill_unreported(memory)
    reaped = host.returncode is not None
    after = nvml.process_usage(host.pid)
    reclaim = evidence.reclaim
    reclaim.pid = stopped.pid
    reclaim.process_exited = stopped.process_exited
    reclaim.reaped = reaped
    reclaim.has_exit_code = stopped.has_exit_code
    reclaim.exit_code = stopped.exit_code
    reclaim.exit_signal = stopped.exit_signal
    reclaim.nvml_process_used_after.CopyFrom(after.measurement)
    reclaim.on_gpu = on_gpu or after.listed is True
    verdict = reclaim_verdict(
        process_exited=stopped.process_exited,
        reaped=reaped,
        on_gpu=reclaim.on_gpu,
        nvml_listed=after.listed,
    )
    reclaim.reclaimed = verdict.verified
    if not stopped.process_exited:
        ended = "was NOT confirmed gone"
    elif stopped.has_exit_code:
        ended = f"exited with code {stopped.exit_code}"
    else:
        ended = f"was ended by signal {stopped.exit_signal}"
    if after.listed is True:
        device = "NVML still lists it holding device memory"
    elif after.listed is False:
        device = "NVML lists no device memory for it"
    else:
        device = f"device memory not checked ({after.measurement.unavailable})"
    reaping = "reaped" if reaped else "NOT reaped"
    verdict_said = "" if verdict.verified else f"; unverified: {verdict.why}"
    reclaim.detail = f"pid {stopped.pid} {ended}, {reaping}; {device}{verdict_said}"


def fill_unreported(memory: wg.MemoryEvidence) -> None:
    """A reading the child left unset is unavailable, said so, never a zero."""
    for descriptor in memory.DESCRIPTOR.fields:
        measurement = getattr(memory, descriptor.name)
        if measurement.WhichOneof("value") is None:
            measurement.unavailable = "not reported by the model host"
