"""An in-process Gantry: scheduler, control plane and a worker on port 0, talking real gRPC."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gantry.common import tokens
from gantry.common.artifact_walk import build_manifest
from gantry.common.auth import auth_metadata
from gantry.common.clock import Clock, ManualClock
from gantry.common.grpc_server import SERVER_KEEPALIVE, Keepalive, RunningServer, insecure_channel
from gantry.common.ids import new_id
from gantry.controlplane.app import ControlPlane, ControlPlaneSettings, start_control_plane
from gantry.controlplane.deployments.lifecycle import DEFAULT_LEASE_SECONDS
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.scheduler.server import start_scheduler
from gantry.scheduler.service import SchedulerService
from gantry.v1 import (
    common_pb2,
    control_plane_pb2,
    control_plane_pb2_grpc,
    inference_pb2_grpc,
)
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.model_host.warm_pool import WarmPool
from tests.fixtures.migrated_copy import migrate_fresh
from tests.integration.polling import wait_until

_shared_warm_pool: WarmPool | None = None


def shared_warm_pool() -> WarmPool:
    """One warm pool for every harness worker in this pytest process: its fork server imports
    torch once, and each test's hosts are forked from it (the servers also die with pytest)."""
    global _shared_warm_pool
    if _shared_warm_pool is None:
        _shared_warm_pool = WarmPool()
        atexit.register(_shared_warm_pool.close)
    return _shared_warm_pool


async def forked_host(spec: HostLaunchSpec, **kwargs: Any) -> ModelHost:
    """A model host forked from this process's warm pool, as a worker starts one by default:
    its model's load, without ~6 s of CPU importing the ML stack in a fresh interpreter. For a
    test whose subject is how a host serves; one about the start itself uses ModelHost.start."""
    return await ModelHost.start(spec, warm_pool=shared_warm_pool(), **kwargs)


# Before the argv of a CLI child a test sends SIGINT (Ctrl-C): a test run started in the
# background of a shell without job control (`make test &` in a script) inherits SIGINT as
# ignored, and Python then never turns it into KeyboardInterrupt, as a terminal's Ctrl-C would.
# coreutils' env resets it and execs the command (same pid). Not a preexec_fn: forking this
# process, whose gRPC threads are running, can leave the child stuck or dead.
CTRL_C_REACHES_IT = ("env", "--default-signal=INT")


@dataclass
class Harness:
    scheduler_server: RunningServer
    control_plane: ControlPlane
    channel: grpc.aio.Channel
    operator_token: str
    artifact_root: Path
    scheduler_token: str = ""
    credentials: dict[str, str] = field(default_factory=dict)  # node name -> credential
    workers: list[tuple[WorkerAgent, asyncio.Task[None]]] = field(default_factory=list)
    api_key: str = ""
    # Schedulers after the first in the control plane's --scheduler list (running_gantry's
    # `standby_schedulers`), each with its service.
    standby_schedulers: list[tuple[RunningServer, SchedulerService]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.control_plane.port}"

    @property
    def operator(self) -> control_plane_pb2_grpc.ControlPlaneStub:
        return control_plane_pb2_grpc.ControlPlaneStub(self.channel)

    @property
    def inference(self) -> inference_pb2_grpc.InferenceStub:
        return inference_pb2_grpc.InferenceStub(self.channel)

    @property
    def op_md(self) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.operator_token)

    @property
    def client_md(self) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.api_key)

    async def register_node(self, name: str) -> str:
        response = await self.operator.RegisterNode(
            control_plane_pb2.RegisterNodeRequest(name=name), metadata=self.op_md
        )
        self.credentials[name] = response.credential
        return response.credential

    async def start_worker(self, credential: str, **overrides: object) -> WorkerAgent:
        # No CPU wait-policy measurement (its own test is test_model_host_cpu_calibration): it
        # would take seconds of this CPU-bound suite's CPU in every process on a fresh clone,
        # whose interpreter path is new to the cache; hosts wait PASSIVE, as before it.
        overrides.setdefault("host_cpu_cache", None)
        settings = WorkerSettings(
            control_plane=self.address,
            credential=credential,
            artifact_root=self.artifact_root,
            **overrides,  # type: ignore[arg-type]
        )
        # A test that turns the warm pool off gets spawned hosts; every other shares the pool.
        agent = WorkerAgent(settings, warm_pool=shared_warm_pool() if settings.warm_pool else None)
        task = asyncio.create_task(agent.run())
        self.workers.append((agent, task))
        await wait_for(lambda: agent.connected.is_set(), what="worker connected")
        return agent

    async def stop_worker(self, agent: WorkerAgent) -> None:
        for entry in list(self.workers):
            if entry[0] is agent:
                self.workers.remove(entry)
                entry[1].cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await entry[1]
                await agent.shutdown()

    async def register_model(self, source: Path, location: str) -> control_plane_pb2.ArtifactSet:
        target = self.artifact_root / location
        if not target.exists():
            shutil.copytree(source, target)
        manifest = build_manifest(target)
        return await self.operator.RegisterArtifactSet(
            control_plane_pb2.RegisterArtifactSetRequest(
                name=location,
                location=location,
                manifest=[
                    common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
                    for e in manifest
                ],
            ),
            metadata=self.op_md,
        )

    async def deploy(
        self, artifact_set_id: str, capability: str, **adapter: object
    ) -> control_plane_pb2.Deployment:
        """A deployment through every gate of the evidence pipeline (see `walk_the_gates`):
        there is no other way to make one."""
        adapter.setdefault("adapter", "sentence_transformers")
        return await walk_the_gates(
            self.operator,
            self.op_md,
            artifact_set_id=artifact_set_id,
            capability=capability,
            adapter=common_pb2.AdapterSettings(**adapter),  # type: ignore[arg-type]
        )

    async def approve(
        self, artifact_set_id: str, capability: str, **adapter: object
    ) -> control_plane_pb2.ProductionApproval:
        """Every gate but the last: a test can then arrange what happens to the deployment's
        own jobs (lose an assignment, ...) before creating it."""
        adapter.setdefault("adapter", "sentence_transformers")
        return await approve_artifact(
            self.operator,
            self.op_md,
            artifact_set_id=artifact_set_id,
            capability=capability,
            adapter=common_pb2.AdapterSettings(**adapter),  # type: ignore[arg-type]
        )

    async def create_deployment(
        self, approval: control_plane_pb2.ProductionApproval, capability: str
    ) -> control_plane_pb2.Deployment:
        return await self.operator.CreateDeployment(
            control_plane_pb2.CreateDeploymentRequest(
                approval_id=approval.approval_id, capability=capability
            ),
            metadata=self.op_md,
        )

    async def deployment(self, deployment_id: str) -> control_plane_pb2.Deployment:
        return await self.operator.GetDeployment(
            control_plane_pb2.GetDeploymentRequest(deployment_id=deployment_id),
            metadata=self.op_md,
        )

    async def wait_deployment(
        self, deployment_id: str, state: int, *, timeout: float = 60.0
    ) -> control_plane_pb2.Deployment:
        latest: list[control_plane_pb2.Deployment] = []

        async def reached() -> bool:
            latest[:] = [await self.deployment(deployment_id)]
            return latest[0].state == state

        await wait_for(reached, timeout=timeout, what=f"deployment state {state}", last=latest)
        return latest[0]

    async def wait_queued(self, tenant_id: str, depth: int) -> None:
        """Until the tenant has `depth` calls waiting in the scheduler (its snapshot says so): a
        flood sent after this meets a full queue, whichever of its calls the server reads first."""

        async def reached() -> bool:
            snapshot = await self.control_plane.scheduler.queue_snapshot(timeout=5)
            return any(t.tenant_id == tenant_id and t.queued >= depth for t in snapshot.tenants)

        await wait_for(reached, timeout=10, what=f"{depth} call(s) of {tenant_id} queued")


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 30.0,
    what: str = "condition",
    last: object = None,
) -> None:
    """Poll a condition (state owned by another process or stream) until it holds: the shared
    `polling.wait_until`, every 50 ms as this helper always polled; `last` (a list the condition
    refills, say) is shown as it stands when the wait fails."""
    await wait_until(
        condition,
        timeout,
        what,
        interval_s=0.05,
        last=None if last is None else lambda: last,
    )


async def walk_the_gates(
    operator: control_plane_pb2_grpc.ControlPlaneStub,
    metadata: tuple[tuple[str, str], ...],
    *,
    artifact_set_id: str,
    capability: str,
    adapter: common_pb2.AdapterSettings | None = None,
    timeout: float = 180.0,
    environment_id: str = "",
) -> control_plane_pb2.Deployment:
    """Every gate of the evidence pipeline for one artifact set, as an operator walks them:
    assess (in `environment_id`, "" the worker's default), profile, probe, approve, deploy.
    Fails loudly at the first gate that refuses."""
    approval = await approve_artifact(
        operator,
        metadata,
        artifact_set_id=artifact_set_id,
        capability=capability,
        adapter=adapter,
        timeout=timeout,
        environment_id=environment_id,
    )
    return await operator.CreateDeployment(
        control_plane_pb2.CreateDeploymentRequest(
            approval_id=approval.approval_id, capability=capability
        ),
        metadata=metadata,
    )


async def approve_artifact(
    operator: control_plane_pb2_grpc.ControlPlaneStub,
    metadata: tuple[tuple[str, str], ...],
    *,
    artifact_set_id: str,
    capability: str,
    adapter: common_pb2.AdapterSettings | None = None,
    timeout: float = 180.0,
    environment_id: str = "",
) -> control_plane_pb2.ProductionApproval:
    """Every gate up to the approval: assess, profile, probe, approve."""
    cp = control_plane_pb2
    assessment = await operator.AssessCompatibility(
        cp.AssessCompatibilityRequest(
            artifact_set_id=artifact_set_id, environment_id=environment_id
        ),
        metadata=metadata,
    )
    latest: list[object] = [assessment]

    async def assessed() -> bool:
        latest[0] = await operator.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=assessment.assessment_id), metadata=metadata
        )
        return latest[0].state != cp.ASSESSMENT_STATE_PENDING  # type: ignore[attr-defined]

    await wait_for(assessed, timeout=timeout, what="the assessment", last=latest)
    assessment = latest[0]  # type: ignore[assignment]
    assert assessment.compatible, f"not compatible: {assessment}"
    profile = await operator.CreateRuntimeProfile(
        cp.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name=f"{capability}-profile"[:128],
            adapter=adapter or common_pb2.AdapterSettings(adapter="sentence_transformers"),
        ),
        metadata=metadata,
    )
    probe = await operator.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=metadata
    )
    ended = (
        common_pb2.PROBE_STATE_COMPLETED,
        common_pb2.PROBE_STATE_FAILED,
        common_pb2.PROBE_STATE_CANCELLED,
    )
    latest[0] = probe

    async def probed() -> bool:
        latest[0] = await operator.GetProbe(
            cp.GetProbeRequest(probe_id=probe.probe_id), metadata=metadata
        )
        return latest[0].state in ended  # type: ignore[attr-defined]

    await wait_for(probed, timeout=timeout, what="the probe", last=latest)
    probe = latest[0]  # type: ignore[assignment]
    assert probe.state == common_pb2.PROBE_STATE_COMPLETED, f"probe did not complete: {probe}"
    candidate = await operator.GetDeploymentCandidate(
        cp.GetDeploymentCandidateRequest(candidate_id=probe.candidate_id), metadata=metadata
    )
    assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY, f"rejected: {candidate}"
    return await operator.ApproveCandidate(
        cp.ApproveCandidateRequest(
            candidate_id=candidate.candidate_id, reason="every gate walked by the test harness"
        ),
        metadata=metadata,
    )


@contextlib.asynccontextmanager
async def running_gantry(
    database_url: str,
    artifact_root: Path,
    *,
    clock: Clock | None = None,
    reconciler: ReconcilerSettings | None = None,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    run_reconciler: bool = True,
    inference: InferenceSettings | None = None,
    endpoint_key_file: Path | None = None,
    http_listen: str | None = None,
    standby_schedulers: int = 0,
    keepalive: Keepalive = SERVER_KEEPALIVE,
) -> AsyncIterator[Harness]:
    """Scheduler and control plane in this process (and `standby_schedulers` more schedulers,
    after the first in the control plane's --scheduler list)."""
    service_token = tokens.mint_token(tokens.SERVICE_TOKEN, "scheduler")
    operator_token = tokens.mint_token(tokens.OPERATOR_TOKEN, new_id())
    scheduler_server, _ = await start_scheduler(listen="127.0.0.1:0", service_token=service_token)
    standbys = [
        await start_scheduler(listen="127.0.0.1:0", service_token=service_token)
        for _ in range(standby_schedulers)
    ]
    addresses = [f"127.0.0.1:{s.port}" for s in (scheduler_server, *(s for s, _ in standbys))]
    # What `gantry migrate` leaves (tests/fixtures/migrated_copy.py); the start only checks.
    await migrate_fresh(database_url)
    control_plane = await start_control_plane(
        ControlPlaneSettings(
            listen="127.0.0.1:0",
            database_url=database_url,
            scheduler_address=",".join(addresses),
            scheduler_token=service_token,
            bootstrap_operator_token=operator_token,
            reconciler=reconciler or ReconcilerSettings(interval_s=0.2),
            lease_seconds=lease_seconds,
            run_reconciler=run_reconciler,
            inference=inference or InferenceSettings(),
            endpoint_key_file=endpoint_key_file,
            http_listen=http_listen,
            keepalive=keepalive,
        ),
        clock=clock,
    )
    await control_plane.scheduler.wait_connected(10)
    channel = insecure_channel(f"127.0.0.1:{control_plane.port}")
    harness = Harness(
        scheduler_server=scheduler_server,
        control_plane=control_plane,
        channel=channel,
        operator_token=operator_token,
        artifact_root=artifact_root,
        scheduler_token=service_token,
        standby_schedulers=standbys,
    )
    key = await harness.operator.CreateApiKey(
        control_plane_pb2.CreateApiKeyRequest(tenant_id="tenant-a", name="tests"),
        metadata=harness.op_md,
    )
    harness.api_key = key.api_key
    try:
        yield harness
    finally:
        for agent, task in list(harness.workers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await agent.shutdown()
        await channel.close()
        await control_plane.stop()
        for server in (scheduler_server, *(s for s, _ in standbys)):
            await server.stop(grace=0.5)


@contextlib.asynccontextmanager
async def restarted_control_plane(
    harness: Harness,
    database_url: str,
    *,
    same_port: bool = True,
    clock: Clock | None = None,
    while_down: Callable[[], object] | None = None,
    **settings: Any,
) -> AsyncIterator[None]:
    """Stop the control plane and start a new one on the same database and scheduler (and port,
    where `same_port`: a worker redials it by itself), `while_down` called in between;
    `settings`: the new one's ControlPlaneSettings beyond those. The new one is stopped on the
    way out (the harness stops only the one it started)."""
    port = harness.control_plane.port if same_port else 0
    await harness.channel.close()
    await harness.control_plane.stop()
    if while_down is not None:
        while_down()
    harness.control_plane = await start_control_plane(
        ControlPlaneSettings(
            listen=f"127.0.0.1:{port}",
            database_url=database_url,
            scheduler_address=f"127.0.0.1:{harness.scheduler_server.port}",
            scheduler_token=harness.scheduler_token,
            **settings,
        ),
        clock=clock,
    )
    await harness.control_plane.scheduler.wait_connected(10)
    harness.channel = insecure_channel(harness.address)
    try:
        yield
    finally:
        await harness.channel.close()
        await harness.control_plane.stop()


@contextlib.asynccontextmanager
async def gantry_on_a_manual_clock(
    database_url: str, tmp_path: Path, reconciler: ReconcilerSettings
) -> AsyncIterator[tuple[Harness, ManualClock]]:
    """`running_gantry` with its artifacts under `tmp_path`, time a ManualClock and no reconciler
    loop: the test advances the clock and runs the passes itself."""
    root = tmp_path / "artifacts"
    root.mkdir()
    clock = ManualClock()
    async with running_gantry(
        database_url, root, clock=clock, reconciler=reconciler, run_reconciler=False
    ) as harness:
        yield harness, clock
