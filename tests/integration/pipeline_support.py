"""What the evidence-pipeline tests share: a control plane run as operators run it, scripted
workers (real gRPC clients of WorkerGateway.Connect) answering INSPECT and PROBE jobs with evidence
a test chooses, and the refusal helper."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.common.status import error_info_of
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker

LEASE_SECONDS = 30.0
SETTINGS = ReconcilerSettings(heartbeat_interval_s=5.0, absence_grace_s=60.0)


async def refusal(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason an RPC is refused with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return caught.value.code(), info.reason if info is not None else ""


async def refusal_with_metadata(
    call: Awaitable[Any],
) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    """The status code, ErrorInfo reason and its metadata an RPC is refused with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None, caught.value
    return caught.value.code(), info.reason, dict(info.metadata)


async def audited(gantry: Pipeline, action: str, subject_id: str) -> list[cp.AuditEvent]:
    """The audit events of one action on one subject."""
    listed = await gantry.op.ListAuditEvents(
        cp.ListAuditEventsRequest(filter=cp.AuditEventFilter(action=action, subject_id=subject_id)),
        metadata=gantry.md,
    )
    return list(listed.events)


@dataclass
class Pipeline:
    harness: Harness
    model_dir: Path
    clock: ManualClock | None = None
    workers: list[ScriptedWorker] = field(default_factory=list)

    @property
    def op(self) -> Any:
        return self.harness.operator

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return self.harness.op_md

    async def worker(self, name: str, *, generation: int = 1) -> ScriptedWorker:
        worker = ScriptedWorker(generation=generation)
        credential = self.harness.credentials.get(name) or await self.harness.register_node(name)
        await worker.start(self.harness.channel, credential)
        self.workers.append(worker)
        return worker

    async def artifact(self, name: str = "tiny") -> cp.ArtifactSet:
        return await self.harness.register_model(self.model_dir, name)

    async def assessment(self, assessment_id: str) -> cp.CompatibilityAssessment:
        return await self.op.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=assessment_id), metadata=self.md
        )

    async def assess(self, artifact_set_id: str, **fields: Any) -> cp.CompatibilityAssessment:
        """AssessCompatibility, then its outcome once the worker has answered."""
        pending = await self.op.AssessCompatibility(
            cp.AssessCompatibilityRequest(artifact_set_id=artifact_set_id, **fields),
            metadata=self.md,
        )
        assert pending.state == cp.ASSESSMENT_STATE_PENDING
        latest = [pending]

        async def ended() -> bool:
            latest[0] = await self.assessment(pending.assessment_id)
            return latest[0].state != cp.ASSESSMENT_STATE_PENDING

        await wait_for(ended, what="the assessment to end", last=latest)
        return latest[0]

    async def profile(
        self, assessment_id: str, *, adapter: str = "sentence_transformers", **fields: Any
    ) -> cp.RuntimeProfile:
        return await self.op.CreateRuntimeProfile(
            cp.CreateRuntimeProfileRequest(
                assessment_id=assessment_id,
                name=fields.pop("name", "tiny-cpu"),
                adapter=common_pb2.AdapterSettings(adapter=adapter, device="cpu", normalize=True),
                **fields,
            ),
            metadata=self.md,
        )

    async def probe(self, probe_id: str) -> cp.RuntimeProbe:
        return await self.op.GetProbe(cp.GetProbeRequest(probe_id=probe_id), metadata=self.md)

    async def wait_probe(self, probe_id: str, state: int) -> cp.RuntimeProbe:
        latest: list[cp.RuntimeProbe] = []

        async def reached() -> bool:
            latest[:] = [await self.probe(probe_id)]
            return latest[0].state == state

        await wait_for(reached, what=f"probe state {state}", last=latest)
        return latest[0]

    async def candidate(self, candidate_id: str) -> cp.DeploymentCandidate:
        return await self.op.GetDeploymentCandidate(
            cp.GetDeploymentCandidateRequest(candidate_id=candidate_id), metadata=self.md
        )

    async def approve(self, candidate_id: str, reason: str = "probed on CPU") -> Any:
        return await self.op.ApproveCandidate(
            cp.ApproveCandidateRequest(candidate_id=candidate_id, reason=reason),
            metadata=self.md,
        )

    async def profiled(self, name: str = "tiny") -> cp.RuntimeProfile:
        artifact = await self.artifact(name)
        assessment = await self.assess(artifact.artifact_set_id)
        assert assessment.compatible, assessment
        return await self.profile(assessment.assessment_id)

    async def lab_ready(self, name: str = "tiny") -> cp.DeploymentCandidate:
        """Every gate up to a LAB_READY candidate, with the scripted worker's healthy evidence."""
        profile = await self.profiled(name)
        started = await self.op.StartProbe(
            cp.StartProbeRequest(profile_id=profile.profile_id), metadata=self.md
        )
        done = await self.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
        candidate = await self.candidate(done.candidate_id)
        assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY, candidate
        return candidate

    async def approved(self, name: str = "tiny") -> cp.ProductionApproval:
        return await self.approve((await self.lab_ready(name)).candidate_id)

    async def deploy(self, approval_id: str, capability: str) -> cp.Deployment:
        return await self.op.CreateDeployment(
            cp.CreateDeploymentRequest(approval_id=approval_id, capability=capability),
            metadata=self.md,
        )

    async def binding(self, capability: str) -> cp.CapabilityBinding:
        return await self.op.GetCapabilityBinding(
            cp.GetCapabilityBindingRequest(capability=capability), metadata=self.md
        )

    async def embed(self, capability: str) -> inf.EmbedResponse:
        return await self.harness.inference.Embed(
            inf.EmbedRequest(capability=capability, inputs=["x"]),
            metadata=self.harness.client_md,
            timeout=10,
        )

    # -- time (the ManualClock fixture only) ---------------------------------------------------

    async def beat(self, worker: ScriptedWorker, name: str) -> None:
        """A heartbeat, waited for until the control plane recorded it at the current time."""
        assert self.clock is not None
        worker.heartbeat()
        now = self.clock.now()

        async def recorded() -> bool:
            # Heartbeats are kept in memory (liveness.py); `last_seen_at` is flushed in batches.
            heard = self.harness.control_plane.liveness.last_heard((await self.node(name)).node_id)
            return heard is not None and heard.heard_at >= now

        await wait_for(recorded, what=f"the heartbeat of {name} at {now}")

    async def live_for(self, seconds: float, beating: dict[str, ScriptedWorker]) -> None:
        """Time passes in heartbeat-sized steps (reconciler passes between), named workers beat."""
        assert self.clock is not None
        step = SETTINGS.heartbeat_interval_s
        while seconds > 0:
            for name, worker in beating.items():
                await self.beat(worker, name)
            self.clock.advance(min(step, seconds))
            await self.harness.control_plane.reconciler.reconcile_once()
            seconds -= step

    async def node(self, name: str) -> cp.Node:
        listed = await self.op.ListNodes(cp.ListNodesRequest(), metadata=self.md)
        return {n.name: n for n in listed.nodes}[name]

    async def assert_invariants_hold(self) -> None:
        report = await self.op.CheckInvariants(cp.CheckInvariantsRequest(), metadata=self.md)
        broken = {i.name: list(i.offending_ids) for i in report.invariants if not i.holds}
        assert report.all_hold, f"invariants broken: {broken}"


async def pipeline_of(
    database_url: str, tmp_path: Path, model_dir: Path, *, clock: ManualClock | None
) -> AsyncIterator[Pipeline]:
    root = tmp_path / "artifacts"
    root.mkdir()
    timed: dict[str, Any] = (
        {
            "clock": clock,
            "reconciler": SETTINGS,
            "lease_seconds": LEASE_SECONDS,
            "run_reconciler": False,
        }
        if clock is not None
        else {}
    )
    async with running_gantry(database_url, root, **timed) as harness:
        pipeline = Pipeline(harness=harness, model_dir=model_dir, clock=clock)
        try:
            yield pipeline
        finally:
            for worker in pipeline.workers:
                await worker.stop()


def make_model_dir(tmp_path: Path) -> Path:
    """A model directory as registration sees it: the control plane only reads the manifest."""
    directory = tmp_path / "source-model"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "bert", "hidden_size": 4}')
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return directory


async def two_replicas(gantry: Pipeline) -> tuple[cp.Deployment, dict[str, ScriptedWorker]]:
    """A deployment READY with one RESIDENT replica on each of two scripted workers (answering
    invokes), spread over both."""
    resident = common_pb2.RESIDENCY_STATE_RESIDENT
    workers = {name: await gantry.worker(name) for name in ("left", "right")}
    for worker in workers.values():
        worker.answer_invokes = True
    approval = await gantry.approved()
    created = await gantry.op.CreateDeployment(
        cp.CreateDeploymentRequest(
            approval_id=approval.approval_id,
            capability="minilm",
            replicas=2,
            placement_policy=common_pb2.PLACEMENT_POLICY_SPREAD,
        ),
        metadata=gantry.md,
    )
    latest: list[cp.Deployment] = []

    async def both_resident() -> bool:
        latest[:] = [await gantry.harness.deployment(created.deployment_id)]
        return [r.state for r in latest[0].residencies] == [resident, resident]

    await wait_for(both_resident, what="two RESIDENT replicas", last=latest)
    assert len({r.node_id for r in latest[0].residencies}) == 2
    return latest[0], workers
