"""The worker agent: one outbound stream to the control plane, jobs and invocations over it.

The agent opens no port. Each process start draws a new generation; results the control plane has
not acknowledged are kept and resent after a reconnect within the same generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from gantry.common import tokens
from gantry.common.auth import auth_metadata
from gantry.common.errors import GantryError
from gantry.common.grpc_server import insecure_channel
from gantry.common.ids import new_generation
from gantry.common.manifest import ManifestEntry, verify_artifact
from gantry.common.status import error_from_rpc
from gantry.common.telemetry import extract_context, inject_context, tracer
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.v1 import worker_gateway_pb2_grpc
from gantry.worker.environment_facts import default_environment
from gantry.worker.model_host.environments import resolve_python
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.residents import DEFAULT_MAX_RESIDENTS, Resident, ResidentMap

log = logging.getLogger(__name__)
_tracer = tracer("gantry.worker")


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    control_plane: str
    credential: str
    artifact_root: Path
    max_residents: int = DEFAULT_MAX_RESIDENTS
    reconnect_max_seconds: float = 10.0
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


class FencedError(Exception):
    """The control plane holds a newer generation of this node: this process must stop."""


class WorkerAgent:
    def __init__(self, settings: WorkerSettings, *, generation: int | None = None) -> None:
        parsed = tokens.parse_token(settings.credential, kind=tokens.NODE_CREDENTIAL)
        if parsed is None:
            raise ValueError("the node credential is malformed")
        self.settings = settings
        self.node_id = parsed.token_id
        self.generation = generation if generation is not None else new_generation()
        self.residents = ResidentMap(max_residents=settings.max_residents)
        self.connected = asyncio.Event()
        self._outbox: asyncio.Queue[wg.WorkerMessage | None] = asyncio.Queue()
        self._unacked: dict[str, wg.JobResult] = {}
        self._active_jobs: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._heartbeat_seconds = 5.0

    # ---- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff; returns only when fenced or cancelled."""
        delay = 0.2
        while True:
            try:
                await self._serve_stream()
                delay = 0.2
            except FencedError as error:
                log.error("stopping: %s", error)
                return
            except grpc.aio.AioRpcError as error:
                gantry_error = error_from_rpc(error)
                if gantry_error.reason in ("STALE_GENERATION", "NODE_DISABLED"):
                    log.error("stopping: %s", gantry_error.message)
                    return
                log.warning("control plane stream ended: %s", gantry_error)
            finally:
                self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.reconnect_max_seconds)

    async def shutdown(self) -> None:
        """Stop every model host this process started and confirm each is gone."""
        for task in list(self._tasks):
            task.cancel()
        for resident in list(self.residents):
            self.residents.pop(resident.deployment_id)
            with contextlib.suppress(Exception):
                await resident.host.stop(grace_s=5.0)

    # ---- the stream ---------------------------------------------------------------------------

    async def _serve_stream(self) -> None:
        async with insecure_channel(self.settings.control_plane) as channel:
            stub = worker_gateway_pb2_grpc.WorkerGatewayStub(channel)
            self._outbox = asyncio.Queue()
            self._send(wg.WorkerMessage(hello=self._hello()))
            call = stub.Connect(self._outgoing(), metadata=auth_metadata(self.settings.credential))
            heartbeat = asyncio.create_task(self._heartbeats(), name="heartbeats")
            try:
                async for message in call:
                    self._handle(message)
            finally:
                heartbeat.cancel()
                self._outbox.put_nowait(None)

    async def _outgoing(self) -> AsyncIterator[wg.WorkerMessage]:
        outbox = self._outbox
        while (message := await outbox.get()) is not None:
            yield message

    def _send(self, message: wg.WorkerMessage) -> None:
        message.node_id = self.node_id
        message.generation = self.generation
        self._outbox.put_nowait(message)

    def _hello(self) -> wg.Hello:
        return wg.Hello(
            inventory=self.residents.inventory(self.generation),
            environments=[default_environment(sys.executable)],
            agent_version="0.1.0",
            hostname=socket.gethostname(),
        )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_seconds)
            sent_at = timestamp_pb2.Timestamp()
            sent_at.GetCurrentTime()
            self._send(
                wg.WorkerMessage(
                    heartbeat=wg.Heartbeat(
                        sent_at=sent_at,
                        active_job_ids=sorted(self._active_jobs),
                        resident_count=len(self.residents),
                    )
                )
            )

    def _handle(self, message: wg.ControlMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            self._welcome(message.welcome)
        elif kind == "job_assignment":
            self._spawn(
                self._run_job(message.job_assignment), f"job-{message.job_assignment.job_id}"
            )
        elif kind == "invoke":
            self._spawn(self._invoke(message.invoke, message.trace_context), "invoke")
        elif kind == "ack":
            self._unacked.pop(message.ack.job_id, None)
        elif kind == "reject":
            self._rejected(message.reject)
        elif kind == "cancel_job":
            log.info(
                "cancel requested for job %s (jobs here run to completion)",
                message.cancel_job.job_id,
            )
        else:
            raise GantryError("INVALID_ARGUMENT", f"unknown control message {kind!r}")

    def _welcome(self, welcome: wg.Welcome) -> None:
        if welcome.heartbeat_interval.seconds:
            self._heartbeat_seconds = float(welcome.heartbeat_interval.seconds)
        self.connected.set()
        log.info("welcomed as node %s generation %d", self.node_id, self.generation)
        for deployment_id in welcome.unload_deployment_ids:
            self._spawn(self._unload_untracked(deployment_id), f"unload-{deployment_id}")
        for result in self._unacked.values():
            self._send(wg.WorkerMessage(job_result=result))

    def _rejected(self, reject: wg.Reject) -> None:
        log.warning(
            "control plane rejected %s: %s", reject.job_id or "a message", reject.failure.message
        )
        if reject.job_id:
            self._unacked.pop(reject.job_id, None)
        if reject.failure.reason == "STALE_GENERATION":
            raise FencedError(reject.failure.message)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- jobs ---------------------------------------------------------------------------------

    async def _run_job(self, assignment: wg.JobAssignment) -> None:
        result = wg.JobResult(job_id=assignment.job_id, lease_token=assignment.lease_token)
        self._active_jobs.add(assignment.job_id)
        try:
            spec = assignment.WhichOneof("spec")
            if spec == "load":
                result.load.CopyFrom(await self._load(assignment.load))
            elif spec == "unload":
                result.unload.CopyFrom(await self._unload(assignment.unload.deployment_id))
            else:
                raise GantryError("INVALID_ARGUMENT", f"unknown job spec {spec!r}")
        except GantryError as error:
            log.warning("job %s failed: %s", assignment.job_id, error)
            result.failure.CopyFrom(error.to_failure())
        except Exception as exc:
            log.exception("job %s failed unexpectedly", assignment.job_id)
            result.failure.CopyFrom(
                GantryError("LOAD_FAILED", f"{type(exc).__name__}: {exc}").to_failure()
            )
        finally:
            self._active_jobs.discard(assignment.job_id)
        self._unacked[assignment.job_id] = result
        self._send(wg.WorkerMessage(job_result=result))

    async def _load(self, spec: wg.LoadSpec) -> wg.LoadEvidence:
        self.residents.reserve(spec.deployment_id)
        try:
            manifest = [
                ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                for e in spec.manifest
            ]
            # Hashing gigabytes must not stall the stream: it runs in a thread.
            verified = await asyncio.to_thread(
                verify_artifact, self.settings.artifact_root, spec.artifact_location, manifest
            )
            python = resolve_python(spec.environment_id, self.settings.env)
            with _tracer.start_as_current_span(
                "worker.load", attributes={"gantry.deployment_id": spec.deployment_id}
            ):
                trace_context: dict[str, str] = {}
                inject_context(trace_context)
                host = await ModelHost.start(
                    HostLaunchSpec(
                        deployment_id=spec.deployment_id,
                        model_directory=verified.directory,
                        adapter=spec.adapter,
                        python_executable=python,
                    ),
                    on_exit=self._host_exited,
                    trace_context=trace_context,
                )
        except BaseException:
            self.residents.release(spec.deployment_id)
            raise
        self.residents.add(
            Resident(
                deployment_id=spec.deployment_id,
                artifact_digest=spec.manifest_digest,
                environment_id=spec.environment_id or "default",
                host=host,
            )
        )
        ready = host.ready
        return wg.LoadEvidence(
            pid=ready.pid,
            load_seconds=ready.load_seconds,
            dim=ready.dim,
            rss_bytes=ready.rss_bytes,
            runtime_versions=dict(ready.runtime_versions),
            files_verified=verified.files_verified,
            bytes_verified=verified.bytes_verified,
        )

    async def _unload(self, deployment_id: str) -> wg.UnloadEvidence:
        resident = self.residents.pop(deployment_id)
        if resident is None:
            # Nothing of it runs here (already gone): unloading is done, and says so.
            return wg.UnloadEvidence(pid=0, process_exited=True, exit_code=0)
        evidence = await resident.host.stop()
        if not evidence.process_exited:
            raise GantryError(
                "RECLAIM_UNVERIFIED",
                f"model host {evidence.pid} did not exit",
                pid=str(evidence.pid),
            )
        return evidence

    async def _unload_untracked(self, deployment_id: str) -> None:
        with contextlib.suppress(GantryError):
            await self._unload(deployment_id)
        self._report_inventory()

    def _host_exited(self, host: ModelHost, returncode: int) -> None:
        """A model host died on its own: forget it and tell the control plane at once."""
        if self.residents.discard_host(host):
            log.error(
                "model host of %s (pid %d) exited with %d", host.deployment_id, host.pid, returncode
            )
            self._report_inventory()

    def _report_inventory(self) -> None:
        self._send(
            wg.WorkerMessage(
                inventory_report=wg.InventoryReport(
                    inventory=self.residents.inventory(self.generation)
                )
            )
        )

    # ---- invocations --------------------------------------------------------------------------

    async def _invoke(self, invoke: wg.Invoke, trace_context: Mapping[str, str]) -> None:
        result = wg.InvokeResult(request_id=invoke.request_id)
        with _tracer.start_as_current_span(
            "worker.invoke",
            context=extract_context(trace_context),
            attributes={"gantry.deployment_id": invoke.deployment_id},
        ):
            try:
                resident = self.residents.get(invoke.deployment_id)
                if resident is None:
                    raise GantryError(
                        "DEPLOYMENT_NOT_READY",
                        f"deployment {invoke.deployment_id} is not resident on this worker",
                    )
                if invoke.WhichOneof("payload") != "embed":
                    raise GantryError("INVALID_PAYLOAD", "this worker serves embed payloads only")
                child_context: dict[str, str] = {}
                inject_context(child_context)
                timeout = 30.0
                if invoke.HasField("deadline"):
                    remaining = invoke.deadline.ToDatetime().timestamp() - _now_seconds()
                    timeout = max(0.05, remaining)
                result.embed.CopyFrom(
                    await resident.host.embed(
                        list(invoke.embed.inputs), trace_context=child_context, timeout_s=timeout
                    )
                )
            except GantryError as error:
                result.failure.CopyFrom(error.to_failure())
            except Exception as exc:
                log.exception("invoke %s failed unexpectedly", invoke.request_id)
                result.failure.CopyFrom(
                    GantryError("INVOKE_FAILED", f"{type(exc).__name__}").to_failure()
                )
        self._send(wg.WorkerMessage(invoke_result=result))


def _now_seconds() -> float:
    return time.time()
