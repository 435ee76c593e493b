"""The evidence pipeline over real gRPC: every gate, its refusals, probes under lost leases and
restarts, cancellation, and capability bindings that never serve from an unbound deployment.

The control plane runs as operators run it (no unapproved deployments); workers are scripted
streams (real gRPC clients of WorkerGateway.Connect) answering INSPECT and PROBE jobs with
evidence a test chooses. Both stores run every scenario; the repository-level checks at the end
run the compare-and-set paths directly on both.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.common.manifest import ManifestEntry
from gantry.common.status import error_info_of
from gantry.controlplane.domain.pipeline_states import CandidateStatus
from gantry.controlplane.domain.probe_transitions import ProbeState
from gantry.controlplane.domain.transitions import DeploymentState
from gantry.controlplane.persistence import (
    artifacts,
    assessments,
    audit,
    bindings,
    candidates,
    deployments,
    nodes,
    probes,
    profiles,
)
from gantry.controlplane.persistence.database import Database
from gantry.controlplane.persistence.transitions import lost_a_race
from gantry.controlplane.reconciler import ReconcilerSettings
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
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


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory as registration sees it: the control plane only reads the manifest."""
    directory = tmp_path / "source-model"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "bert", "hidden_size": 4}')
    (directory / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    return directory


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
            return (await self.node(name)).last_seen_at.ToDatetime(dt.UTC) >= now

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


async def _pipeline(
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


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in _pipeline(database_url, tmp_path, model_dir, clock=None):
        yield pipeline


@pytest.fixture
async def timed(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    """Time is a ManualClock and the test runs the reconciler's passes itself."""
    async for pipeline in _pipeline(database_url, tmp_path, model_dir, clock=ManualClock()):
        yield pipeline


# ---- every gate, walked ---------------------------------------------------------------------


async def test_every_gate_leaves_a_record_and_the_approved_deployment_serves(gantry: Pipeline):
    worker = await gantry.worker("lab")
    node_id = (await gantry.node("lab")).node_id
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id)  # no node named: any connected
    assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED and assessment.compatible
    assert assessment.node_id == node_id and assessment.job_id
    assert list(assessment.inspection.adapters) == ["sentence_transformers"]
    assert assessment.environment_fingerprint and not assessment.HasField("failure")

    profile = await gantry.profile(
        assessment.assessment_id, ram_estimate_bytes=100_000_000, vram_estimate_bytes=0
    )
    assert profile.artifact_set_id == artifact.artifact_set_id
    assert profile.ram_envelope_bytes == 100_000_000  # nothing measured yet: the estimate

    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    assert started.node_id == node_id  # no node named: the one that assessed it
    done = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    assert done.candidate_id and done.attempt_count == 1 and done.completed_at.seconds
    assert done.evidence.reclaim.reclaimed and list(done.evidence.output_shape) == [1, 4]
    assert done.evidence.memory.cuda_peak_allocated.unavailable == "CUDA is not available"
    probe_job = await gantry.op.GetServingJob(
        cp.GetServingJobRequest(job_id=done.job_id), metadata=gantry.md
    )
    assert probe_job.job_type == cp.SERVING_JOB_TYPE_PROBE
    assert probe_job.state == cp.SERVING_JOB_STATE_SUCCEEDED
    assert probe_job.probe_id == done.probe_id and not probe_job.residency_id
    refined = await gantry.op.GetRuntimeProfile(
        cp.GetRuntimeProfileRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    # The measured peak (VmHWM 300 MB) exceeds the estimate: placement charges the larger.
    assert refined.ram_envelope_bytes == 300_000_000
    assert refined.ram_estimate_bytes == 100_000_000 and refined.vram_envelope_bytes == 0

    candidate = await gantry.candidate(done.candidate_id)
    assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY and not candidate.production
    assert candidate.probe_id == done.probe_id and not candidate.reasons

    approval = await gantry.approve(candidate.candidate_id, reason="probed: healthy, offline")
    assert approval.reason == "probed: healthy, offline" and approval.approved_by
    assert approval.profile_id == profile.profile_id
    approved = await gantry.candidate(candidate.candidate_id)
    assert approved.production and approved.approval_id == approval.approval_id

    created = await gantry.deploy(approval.approval_id, "minilm")
    # Everything the deployment runs comes from the approved profile.
    assert created.artifact_set_id == artifact.artifact_set_id
    assert created.adapter == profile.adapter
    assert (created.approval_id, created.profile_id, created.candidate_id) == (
        approval.approval_id,
        profile.profile_id,
        candidate.candidate_id,
    )
    ready = await gantry.harness.wait_deployment(
        created.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=20
    )
    assert ready.bound
    assert (await gantry.binding("minilm")).deployment_id == created.deployment_id
    worker.answer_invokes = True
    assert (await gantry.embed("minilm")).deployment_id == created.deployment_id

    async with gantry.harness.control_plane.database.transaction() as session:
        actions = [event.action for event in await audit.list_events(session)]
    for action in (
        "assessment.create",
        "profile.create",
        "probe.start",
        "candidate.create",
        "candidate.approve",
        "deployment.create",
        "capability.bind",
    ):
        assert action in actions, action
    assert "profile.allow_pickle_weights" not in actions
    await gantry.assert_invariants_hold()


async def test_every_list_pages_and_filters(gantry: Pipeline):
    await gantry.worker("lister")
    first = await gantry.lab_ready("first")
    second = await gantry.lab_ready("second")
    await gantry.approve(first.candidate_id)
    await gantry.approve(second.candidate_id)
    for method, request, field_name in (
        ("ListAssessments", cp.ListAssessmentsRequest, "assessments"),
        ("ListRuntimeProfiles", cp.ListRuntimeProfilesRequest, "profiles"),
        ("ListProbes", cp.ListProbesRequest, "probes"),
        ("ListDeploymentCandidates", cp.ListDeploymentCandidatesRequest, "candidates"),
        ("ListApprovals", cp.ListApprovalsRequest, "approvals"),
    ):
        call = getattr(gantry.op, method)
        page = await call(request(page_size=1), metadata=gantry.md)
        assert len(getattr(page, field_name)) == 1 and page.next_page_token, method
        rest = await call(request(page_size=1, page_token=page.next_page_token), metadata=gantry.md)
        assert len(getattr(rest, field_name)) == 1 and not rest.next_page_token, method
        assert getattr(rest, field_name)[0] != getattr(page, field_name)[0]
    only = await gantry.op.ListDeploymentCandidates(
        cp.ListDeploymentCandidatesRequest(profile_id=first.profile_id), metadata=gantry.md
    )
    assert [c.candidate_id for c in only.candidates] == [first.candidate_id]
    assert await refusal(
        gantry.op.ListProbes(cp.ListProbesRequest(profile_id="nope"), metadata=gantry.md)
    ) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


# ---- the gates' refusals ---------------------------------------------------------------------


async def test_no_deployment_without_an_approval(gantry: Pipeline):
    await gantry.worker("gate")
    artifact = await gantry.artifact()
    # The skeleton's request named an artifact set (field 1) and an adapter directly. Those
    # fields are reserved now: sent by an old client, they deploy nothing.
    artifact_id = artifact.artifact_set_id.encode()
    skeleton_request = b"\x0a" + bytes([len(artifact_id)]) + artifact_id + b"\x12\x01c"
    create = gantry.harness.channel.unary_unary(
        "/gantry.v1.ControlPlane/CreateDeployment",
        request_serializer=lambda raw: raw,
        response_deserializer=cp.Deployment.FromString,
    )
    assert await refusal(create(skeleton_request, metadata=gantry.md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_APPROVED",
    )
    no_approval = cp.CreateDeploymentRequest(capability="c")
    assert await refusal(gantry.op.CreateDeployment(no_approval, metadata=gantry.md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_APPROVED",
    )
    unknown = cp.CreateDeploymentRequest(
        approval_id="00000000-0000-4000-8000-000000000000", capability="c"
    )
    assert await refusal(gantry.op.CreateDeployment(unknown, metadata=gantry.md)) == (
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    listed = await gantry.op.ListDeployments(cp.ListDeploymentsRequest(), metadata=gantry.md)
    assert not listed.deployments  # nothing was created by any refused call


async def test_a_profile_needs_a_completed_assessment(gantry: Pipeline):
    worker = await gantry.worker("slow")
    worker.hold_pipeline_jobs = True  # the INSPECT job never reports
    artifact = await gantry.artifact()
    pending = await gantry.op.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=artifact.artifact_set_id),
        metadata=gantry.md,
    )
    await wait_for(lambda: bool(worker.assignments), what="the INSPECT assignment")
    assignment = worker.assignments[0]
    assert assignment.job_type == wg.JOB_TYPE_INSPECT
    assert assignment.inspect.assessment_id == pending.assessment_id
    assert assignment.inspect.artifact.manifest_digest == artifact.manifest_digest
    assert len(assignment.inspect.artifact.manifest) == 2
    assert await refusal(gantry.profile(pending.assessment_id)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_STATE_TRANSITION",
    )
    worker.finish(assignment)
    await wait_for(
        lambda: _completed(gantry, pending.assessment_id), what="the assessment completed"
    )
    assert (await gantry.profile(pending.assessment_id)).profile_id


async def _completed(gantry: Pipeline, assessment_id: str) -> bool:
    return (await gantry.assessment(assessment_id)).state == cp.ASSESSMENT_STATE_COMPLETED


async def test_an_incompatible_inspection_is_recorded_and_refuses_a_profile(gantry: Pipeline):
    worker = await gantry.worker("strict")
    worker.inspection = wg.Inspection(
        inspector="transformers",
        model_type="custom",
        weight_format="safetensors",
        executable=False,
        findings=[
            wg.InspectionFinding(
                reason="RUNTIME_INCOMPATIBLE",
                message="config.json auto_map needs trust_remote_code",
                path="config.json",
            )
        ],
    )
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id)
    assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED
    assert not assessment.compatible
    assert assessment.failure.reason == "RUNTIME_INCOMPATIBLE"
    assert "auto_map" in assessment.failure.message
    assert assessment.failure.failure_class == common_pb2.FAILURE_CLASS_CONFIG
    assert assessment.inspection.findings[0].path == "config.json"
    assert await refusal(gantry.profile(assessment.assessment_id)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "RUNTIME_INCOMPATIBLE",
    )


async def test_a_profile_adapter_must_be_one_the_inspection_found(gantry: Pipeline):
    await gantry.worker("picky")
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id)
    for adapter in ("sentence_transformers_cross_encoder", "vllm"):
        assert await refusal(gantry.profile(assessment.assessment_id, adapter=adapter)) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "RUNTIME_INCOMPATIBLE",
        )
    # allow_pickle_weights is for pickle weights only (these are safetensors).
    pickled = gantry.op.CreateRuntimeProfile(
        cp.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name="p",
            adapter=common_pb2.AdapterSettings(
                adapter="sentence_transformers", allow_pickle_weights=True
            ),
        ),
        metadata=gantry.md,
    )
    assert await refusal(pickled) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")
    assert await refusal(gantry.profile(assessment.assessment_id, name="bad name!")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )


async def test_pickle_weights_need_an_audited_profile_that_allows_them(gantry: Pipeline):
    worker = await gantry.worker("pickles")
    worker.inspection.weight_format = "pickle"
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id)
    assert await refusal(gantry.profile(assessment.assessment_id)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "RUNTIME_INCOMPATIBLE",
    )
    allowed = await gantry.op.CreateRuntimeProfile(
        cp.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name="pickled",
            adapter=common_pb2.AdapterSettings(
                adapter="sentence_transformers", allow_pickle_weights=True
            ),
        ),
        metadata=gantry.md,
    )
    assert allowed.adapter.allow_pickle_weights
    async with gantry.harness.control_plane.database.transaction() as session:
        events = [e for e in await audit.list_events(session) if e.subject_id == allowed.profile_id]
    assert {e.action for e in events} == {"profile.create", "profile.allow_pickle_weights"}


async def test_an_unavailable_environment_fails_the_assessment_with_that_reason(
    gantry: Pipeline,
):
    worker = await gantry.worker("envless")
    worker.inspect_failure = common_pb2.Failure(
        reason="RUNTIME_ENVIRONMENT_UNAVAILABLE",
        message="no interpreter is mapped for environment 'py312'",
        failure_class=common_pb2.FAILURE_CLASS_CONFIG,
    )
    artifact = await gantry.artifact()
    assessment = await gantry.assess(artifact.artifact_set_id, environment_id="py312")
    assert assessment.state == cp.ASSESSMENT_STATE_FAILED
    assert assessment.environment_id == "py312" and not assessment.compatible
    assert assessment.failure.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert assessment.failure.failure_class == common_pb2.FAILURE_CLASS_CONFIG
    assert await refusal(gantry.profile(assessment.assessment_id)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_STATE_TRANSITION",
    )


async def test_assessment_needs_a_connected_enabled_node(gantry: Pipeline):
    artifact = await gantry.artifact()
    request = cp.AssessCompatibilityRequest(artifact_set_id=artifact.artifact_set_id)
    assert await refusal(gantry.op.AssessCompatibility(request, metadata=gantry.md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NO_ELIGIBLE_NODE",
    )
    await gantry.harness.register_node("away")
    away = await gantry.node("away")
    named = cp.AssessCompatibilityRequest(
        artifact_set_id=artifact.artifact_set_id, node_id=away.node_id
    )
    assert await refusal(gantry.op.AssessCompatibility(named, metadata=gantry.md)) == (
        grpc.StatusCode.UNAVAILABLE,
        "WORKER_UNAVAILABLE",
    )
    await gantry.op.DisableNode(cp.DisableNodeRequest(node_id=away.node_id), metadata=gantry.md)
    assert await refusal(gantry.op.AssessCompatibility(named, metadata=gantry.md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "NODE_DISABLED",
    )


async def test_a_rejected_candidate_cannot_be_approved(gantry: Pipeline):
    worker = await gantry.worker("leaky")

    def leaky(probe: wg.ProbeSpec) -> wg.ProbeEvidence:
        from tests.integration.scripted_worker import healthy_probe_evidence

        evidence = healthy_probe_evidence(probe)
        evidence.reclaim.reclaimed = False
        evidence.reclaim.detail = "nvml still lists pid 5150"
        return evidence

    worker.probe_evidence = leaky
    profile = await gantry.profiled()
    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    done = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    candidate = await gantry.candidate(done.candidate_id)
    assert candidate.status == cp.CANDIDATE_STATUS_REJECTED
    assert list(candidate.reasons) == ["reclaim was not verified: nvml still lists pid 5150"]
    assert await refusal(gantry.approve(candidate.candidate_id)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_STATE_TRANSITION",
    )
    assert not (await gantry.candidate(candidate.candidate_id)).production


async def test_an_approval_names_why_and_is_given_once(gantry: Pipeline):
    await gantry.worker("approver")
    candidate = await gantry.lab_ready()
    for reason in ("", "   "):
        assert await refusal(gantry.approve(candidate.candidate_id, reason=reason)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
        )
    approval = await gantry.approve(candidate.candidate_id)
    assert await refusal(gantry.approve(candidate.candidate_id)) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "ALREADY_EXISTS",
    )
    fetched = await gantry.op.GetApproval(
        cp.GetApprovalRequest(approval_id=approval.approval_id), metadata=gantry.md
    )
    assert fetched == approval


# ---- probes ----------------------------------------------------------------------------------


async def test_probe_stages_reported_by_job_updates_end_in_a_candidate(gantry: Pipeline):
    worker = await gantry.worker("stager")
    profile = await gantry.profiled()
    worker.hold_pipeline_jobs = True
    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    assert started.state == common_pb2.PROBE_STATE_QUEUED
    await wait_for(lambda: len(worker.assignments) == 2, what="the PROBE assignment")
    job = worker.assignments[-1]
    assert job.job_type == wg.JOB_TYPE_PROBE and job.probe.probe_id == started.probe_id
    assert job.probe.adapter == profile.adapter and job.probe.profile_id == profile.profile_id
    for stage in (
        common_pb2.PROBE_STATE_PREPARING,
        common_pb2.PROBE_STATE_LOADING,
        common_pb2.PROBE_STATE_HEALTHCHECKING,
    ):
        worker.report_stage(job, stage)
        await gantry.wait_probe(started.probe_id, stage)
    serving_job = await gantry.op.GetServingJob(
        cp.GetServingJobRequest(job_id=job.job_id), metadata=gantry.md
    )
    assert serving_job.state == cp.SERVING_JOB_STATE_RUNNING
    assert serving_job.probe_id == started.probe_id and not serving_job.deployment_id
    # A move the table does not allow (backwards) is refused and not recorded; the candidate
    # does not exist while the probe is active.
    worker.report_stage(job, common_pb2.PROBE_STATE_PREPARING)
    worker.report_stage(job, common_pb2.PROBE_STATE_READY)
    await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_READY)
    listed = await gantry.op.ListDeploymentCandidates(
        cp.ListDeploymentCandidatesRequest(), metadata=gantry.md
    )
    assert not listed.candidates
    worker.report_stage(job, common_pb2.PROBE_STATE_UNLOADING)
    worker.finish(job)
    done = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    assert (await gantry.candidate(done.candidate_id)).status == cp.CANDIDATE_STATUS_LAB_READY
    await wait_for(lambda: job.job_id in worker.acks, what="the result acknowledged")
    await gantry.assert_invariants_hold()


async def test_a_failed_probe_makes_no_candidate(gantry: Pipeline):
    worker = await gantry.worker("crashy")
    worker.probe_failure = common_pb2.Failure(
        reason="LOAD_FAILED",
        message="the child exited 1",
        failure_class=common_pb2.FAILURE_CLASS_INFRA,
    )
    profile = await gantry.profiled()
    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    failed = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_FAILED)
    assert failed.failure.reason == "LOAD_FAILED" and not failed.candidate_id


async def test_a_lost_lease_mid_probe_requeues_it_and_the_new_lease_finishes_it(timed: Pipeline):
    worker = await timed.worker("lossy")
    profile = await timed.profiled()
    worker.hold_pipeline_jobs = True
    started = await timed.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=timed.md
    )
    await wait_for(lambda: len(worker.assignments) == 2, what="the PROBE assignment")
    lost = worker.assignments[-1]
    worker.report_stage(lost, common_pb2.PROBE_STATE_PREPARING)
    worker.report_stage(lost, common_pb2.PROBE_STATE_LOADING)
    await timed.wait_probe(started.probe_id, common_pb2.PROBE_STATE_LOADING)
    # The worker stays connected but never renews the probe's lease.
    await timed.live_for(LEASE_SECONDS + 1, {"lossy": worker})
    await wait_for(lambda: len(worker.assignments) == 3, what="the re-leased PROBE job")
    again = worker.assignments[-1]
    assert again.job_id == lost.job_id and again.lease_token != lost.lease_token
    assert again.attempt_count == lost.attempt_count + 1 == 2
    requeued = await timed.probe(started.probe_id)
    assert requeued.state == common_pb2.PROBE_STATE_QUEUED and requeued.attempt_count == 2
    # What the old lease says is not heard.
    worker.report_stage(lost, common_pb2.PROBE_STATE_HEALTHCHECKING)
    await timed.beat(worker, "lossy")  # handled after the stale update, in order
    assert (await timed.probe(started.probe_id)).state == common_pb2.PROBE_STATE_QUEUED
    worker.report_stage(again, common_pb2.PROBE_STATE_PREPARING)
    await timed.wait_probe(started.probe_id, common_pb2.PROBE_STATE_PREPARING)
    worker.finish(again)
    done = await timed.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    assert done.candidate_id and done.attempt_count == 2
    await timed.assert_invariants_hold()


async def test_a_worker_restart_mid_probe_requeues_it_to_the_new_generation(gantry: Pipeline):
    old = await gantry.worker("restarting", generation=1)
    profile = await gantry.profiled()
    old.hold_pipeline_jobs = True
    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    await wait_for(lambda: len(old.assignments) == 2, what="the PROBE assignment")
    first = old.assignments[-1]
    old.report_stage(first, common_pb2.PROBE_STATE_PREPARING)
    old.report_stage(first, common_pb2.PROBE_STATE_LOADING)
    await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_LOADING)
    # A new worker process (its child died with the old one) says Hello with a new generation.
    new = await gantry.worker("restarting", generation=2)
    await asyncio.wait_for(old.ended.wait(), 5)  # the old generation's stream is fenced
    done = await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    again = new.assignments[-1]
    assert again.job_id == first.job_id and again.attempt_count == 2
    assert again.lease_token != first.lease_token
    assert done.attempt_count == 2 and done.candidate_id
    await gantry.assert_invariants_hold()


async def test_cancel_probe_stops_its_job_on_the_worker(gantry: Pipeline):
    worker = await gantry.worker("canceller")
    profile = await gantry.profiled()
    worker.hold_pipeline_jobs = True
    started = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    await wait_for(lambda: len(worker.assignments) == 2, what="the PROBE assignment")
    job = worker.assignments[-1]
    worker.report_stage(job, common_pb2.PROBE_STATE_PREPARING)
    await gantry.wait_probe(started.probe_id, common_pb2.PROBE_STATE_PREPARING)
    cancel = cp.CancelProbeRequest(probe_id=started.probe_id)
    cancelled = await gantry.op.CancelProbe(cancel, metadata=gantry.md)
    assert cancelled.state == common_pb2.PROBE_STATE_CANCELLED and not cancelled.candidate_id
    await wait_for(lambda: job.job_id in worker.cancelled_jobs, what="CancelJob on the worker")
    serving_job = await gantry.op.GetServingJob(
        cp.GetServingJobRequest(job_id=job.job_id), metadata=gantry.md
    )
    assert serving_job.state == cp.SERVING_JOB_STATE_CANCELLED
    # A late result from the cancelled job is refused; cancelling again changes nothing.
    worker.finish(job)
    await wait_for(lambda: bool(worker.rejects), what="the late result refused")
    assert worker.rejects[0].failure.reason == "LEASE_TOKEN_INVALID"
    again = await gantry.op.CancelProbe(cancel, metadata=gantry.md)
    assert again.state == common_pb2.PROBE_STATE_CANCELLED and not again.candidate_id
    # A probe that completed cannot be cancelled.
    worker.hold_pipeline_jobs = False
    finished = await gantry.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=gantry.md
    )
    await gantry.wait_probe(finished.probe_id, common_pb2.PROBE_STATE_COMPLETED)
    assert await refusal(
        gantry.op.CancelProbe(cp.CancelProbeRequest(probe_id=finished.probe_id), metadata=gantry.md)
    ) == (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_STATE_TRANSITION")
    await gantry.assert_invariants_hold()


async def test_a_node_gone_past_its_grace_fails_its_probe_and_assessment(timed: Pipeline):
    worker = await timed.worker("vanishing")
    profile = await timed.profiled()
    worker.hold_pipeline_jobs = True
    probe = await timed.op.StartProbe(
        cp.StartProbeRequest(profile_id=profile.profile_id), metadata=timed.md
    )
    assessment = await timed.op.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=profile.artifact_set_id), metadata=timed.md
    )
    await wait_for(lambda: len(worker.assignments) == 3, what="the held PROBE and INSPECT")
    worker.report_stage(worker.assignments[1], common_pb2.PROBE_STATE_PREPARING)
    await timed.wait_probe(probe.probe_id, common_pb2.PROBE_STATE_PREPARING)
    # The worker falls silent: stale, then disconnected, then absent past the grace.
    await timed.live_for(SETTINGS.absence_grace_s + SETTINGS.stale_after_s + 10, {})
    failed = await timed.probe(probe.probe_id)
    assert failed.state == common_pb2.PROBE_STATE_FAILED
    assert failed.failure.reason == "WORKER_UNAVAILABLE" and not failed.candidate_id
    lost = await timed.assessment(assessment.assessment_id)
    assert lost.state == cp.ASSESSMENT_STATE_FAILED
    assert lost.failure.reason == "WORKER_UNAVAILABLE"
    for job_id in (failed.job_id, lost.job_id):
        job = await timed.op.GetServingJob(
            cp.GetServingJobRequest(job_id=job_id), metadata=timed.md
        )
        assert job.state == cp.SERVING_JOB_STATE_CANCELLED
    await timed.assert_invariants_hold()


# ---- capability bindings ---------------------------------------------------------------------


async def test_rebinding_never_serves_a_request_from_an_unbound_deployment(gantry: Pipeline):
    worker = await gantry.worker("binder")
    worker.answer_invokes = True
    approval = await gantry.approved()
    first = await gantry.deploy(approval.approval_id, "minilm")
    await gantry.harness.wait_deployment(first.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await gantry.embed("minilm")).deployment_id == first.deployment_id
    held: list[wg.JobAssignment] = []

    def hold_new_loads(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") == "load" and job.load.deployment_id != first.deployment_id:
            held.append(job)
            return None
        return worker.default_answer(job)

    worker.answer = hold_new_loads
    second = await gantry.deploy(approval.approval_id, "minilm")
    assert not second.bound
    binding = await gantry.binding("minilm")
    assert (binding.deployment_id, binding.pending_deployment_id) == (
        first.deployment_id,
        second.deployment_id,
    )
    await wait_for(lambda: bool(held), what="the second deployment's held LOAD")
    for _ in range(5):  # the old one keeps serving while the new one loads
        assert (await gantry.embed("minilm")).deployment_id == first.deployment_id
    worker.send(wg.WorkerMessage(job_result=worker.default_answer(held[0])))
    ready = await gantry.harness.wait_deployment(second.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert ready.bound
    # From the moment the new one is READY, only it is reached.
    for _ in range(5):
        assert (await gantry.embed("minilm")).deployment_id == second.deployment_id
    moved = await gantry.binding("minilm")
    assert (moved.deployment_id, moved.pending_deployment_id) == (second.deployment_id, "")
    old = await gantry.harness.deployment(first.deployment_id)
    assert old.state == cp.DEPLOYMENT_STATE_READY and not old.bound
    served = {invoke.deployment_id for invoke in worker.answered_invokes}
    assert served == {first.deployment_id, second.deployment_id}


async def test_embed_reaches_only_the_bound_deployment_or_gets_a_typed_error(gantry: Pipeline):
    worker = await gantry.worker("router")
    worker.answer_invokes = True
    held: list[wg.JobAssignment] = []

    def hold_loads(job: wg.JobAssignment) -> wg.JobResult | None:
        if job.WhichOneof("spec") == "load":
            held.append(job)
            return None
        return worker.default_answer(job)

    approval = await gantry.approved()
    worker.answer = hold_loads
    loading = await gantry.deploy(approval.approval_id, "pending-cap")
    assert loading.bound  # nothing held the capability: bound at once, serving once READY
    assert await refusal(gantry.embed("pending-cap")) == (
        grpc.StatusCode.UNAVAILABLE,
        "DEPLOYMENT_NOT_READY",
    )
    # No binding at all is NOT_FOUND: a capability nobody bound.
    assert await refusal(gantry.embed("never-bound")) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    assert await refusal(gantry.binding("never-bound")) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    await wait_for(lambda: bool(held), what="the held LOAD")
    worker.send(wg.WorkerMessage(job_result=worker.default_answer(held[0])))
    await gantry.harness.wait_deployment(loading.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await gantry.embed("pending-cap")).deployment_id == loading.deployment_id
    # Unloaded, the bound deployment is not replaced by anything: DEPLOYMENT_NOT_READY.
    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=loading.deployment_id), metadata=gantry.md
    )
    await gantry.harness.wait_deployment(loading.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    assert await refusal(gantry.embed("pending-cap")) == (
        grpc.StatusCode.UNAVAILABLE,
        "DEPLOYMENT_NOT_READY",
    )


async def test_bind_capability_moves_at_once_to_a_ready_deployment_and_checks_it(
    gantry: Pipeline,
):
    worker = await gantry.worker("rebinder")
    worker.answer_invokes = True
    approval = await gantry.approved()
    first = await gantry.deploy(approval.approval_id, "rollback")
    await gantry.harness.wait_deployment(first.deployment_id, cp.DEPLOYMENT_STATE_READY)
    second = await gantry.deploy(approval.approval_id, "rollback")
    await gantry.harness.wait_deployment(second.deployment_id, cp.DEPLOYMENT_STATE_READY)
    assert (await gantry.binding("rollback")).deployment_id == second.deployment_id
    # Roll back: the first one is READY, so the binding moves at once.
    rebound = await gantry.op.BindCapability(
        cp.BindCapabilityRequest(capability="rollback", deployment_id=first.deployment_id),
        metadata=gantry.md,
    )
    assert (rebound.deployment_id, rebound.pending_deployment_id) == (first.deployment_id, "")
    assert (await gantry.embed("rollback")).deployment_id == first.deployment_id
    other = await gantry.deploy(approval.approval_id, "elsewhere")
    wrong = cp.BindCapabilityRequest(capability="rollback", deployment_id=other.deployment_id)
    assert await refusal(gantry.op.BindCapability(wrong, metadata=gantry.md)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
    )
    await gantry.op.UnloadDeployment(
        cp.UnloadDeploymentRequest(deployment_id=second.deployment_id), metadata=gantry.md
    )
    await gantry.harness.wait_deployment(second.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED)
    gone = cp.BindCapabilityRequest(capability="rollback", deployment_id=second.deployment_id)
    assert await refusal(gantry.op.BindCapability(gone, metadata=gantry.md)) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "INVALID_STATE_TRANSITION",
    )
    listed = await gantry.op.ListCapabilityBindings(
        cp.ListCapabilityBindingsRequest(page_size=1), metadata=gantry.md
    )
    assert len(listed.bindings) == 1 and listed.next_page_token


# ---- the repository level, on both stores ----------------------------------------------------

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database.connect(database_url)
    await db.migrate()
    yield db
    await db.close()


@dataclass
class Seeded:
    node_id: str
    artifact_set_id: str
    assessment_id: str
    profile_id: str


async def _seed(database: Database) -> Seeded:
    async with database.transaction() as session:
        node, _ = await nodes.register_node(session, name="n", labels={}, now=NOW)
        artifact = await artifacts.create_artifact_set(
            session,
            name="a",
            location="a",
            manifest=[ManifestEntry(path="model.safetensors", size_bytes=1, sha256="a" * 64)],
            now=NOW,
        )
        assessment = await assessments.create_assessment(
            session,
            artifact_set_id=artifact.artifact_set_id,
            node_id=node.node_id,
            environment_id="",
            now=NOW,
        )
        profile = await profiles.create_profile(
            session,
            name="p",
            assessment_id=assessment.assessment_id,
            artifact_set_id=artifact.artifact_set_id,
            environment_id="",
            adapter={"adapter": "sentence_transformers"},
            ram_estimate_bytes=100,
            vram_estimate_bytes=0,
            created_by="op",
            now=NOW,
        )
        return Seeded(
            node.node_id, artifact.artifact_set_id, assessment.assessment_id, profile.profile_id
        )


async def test_two_writers_moving_one_probe_cannot_both_win(database: Database):
    seeded = await _seed(database)
    async with database.transaction() as session:
        probe = await probes.create_probe(
            session, profile_id=seeded.profile_id, node_id=seeded.node_id, now=NOW
        )
    async with database.transaction() as session:
        first = await probes.get_probe(session, probe.probe_id)
    async with database.transaction() as session:
        second = await probes.get_probe(session, probe.probe_id)
    async with database.transaction() as session:
        session.add(first)
        await probes.move_probe(session, first, ProbeState.PREPARING, now=NOW)
    # The second writer read QUEUED too; its cancel must not overwrite the move it did not see.
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            session.add(second)
            await probes.end_probe(
                session, second, ProbeState.CANCELLED, reason="", message="", now=NOW
            )
    assert lost_a_race(caught.value)
    async with database.transaction() as session:
        current = await probes.get_probe(session, probe.probe_id)
        assert current.state == ProbeState.PREPARING
        # An illegal move is refused by the table before any UPDATE.
        with pytest.raises(GantryError) as illegal:
            await probes.move_probe(session, current, ProbeState.READY, now=NOW)
        assert illegal.value.reason == "INVALID_STATE_TRANSITION"
        assert not lost_a_race(illegal.value)


async def test_measured_peaks_only_ever_rise(database: Database):
    seeded = await _seed(database)
    for ram, vram in ((300, None), (200, 50), (None, 40), (400, 60)):
        async with database.transaction() as session:
            profile = await profiles.get_profile(session, seeded.profile_id)
            await profiles.raise_measured_peaks(
                session, profile, ram_peak_bytes=ram, vram_peak_bytes=vram
            )
    async with database.transaction() as session:
        profile = await profiles.get_profile(session, seeded.profile_id)
    assert (profile.ram_measured_peak_bytes, profile.vram_measured_peak_bytes) == (400, 60)
    assert (profile.ram_estimate_bytes, profile.vram_estimate_bytes) == (100, 0)


async def test_a_candidate_is_made_production_once(database: Database):
    seeded = await _seed(database)
    async with database.transaction() as session:
        probe = await probes.create_probe(
            session, profile_id=seeded.profile_id, node_id=seeded.node_id, now=NOW
        )
        candidate = await candidates.create_candidate(
            session,
            probe_id=probe.probe_id,
            profile_id=seeded.profile_id,
            artifact_set_id=seeded.artifact_set_id,
            status=CandidateStatus.LAB_READY,
            reasons=[],
            now=NOW,
        )
    async with database.transaction() as session:
        stale = await candidates.get_candidate(session, candidate.candidate_id)
    async with database.transaction() as session:
        await candidates.mark_production(
            session, await candidates.get_candidate(session, candidate.candidate_id)
        )
    with pytest.raises(GantryError) as caught:
        async with database.transaction() as session:
            session.add(stale)
            await candidates.mark_production(session, stale)
    assert lost_a_race(caught.value)


async def test_a_pending_binding_moves_in_the_transaction_that_makes_it_ready(
    database: Database,
):
    seeded = await _seed(database)
    async with database.transaction() as session:
        made = []
        for _ in range(2):
            made.append(
                await deployments.create_deployment(
                    session,
                    capability="cap",
                    artifact_set_id=seeded.artifact_set_id,
                    adapter={},
                    environment_id="",
                    replicas=1,
                    now=NOW,
                )
            )
        old, new = made
        await bindings.bind(
            session, capability="cap", deployment_id=old.deployment_id, serves_now=False, now=NOW
        )
        pending = await bindings.bind(
            session, capability="cap", deployment_id=new.deployment_id, serves_now=False, now=NOW
        )
        assert (pending.deployment_id, pending.pending_deployment_id) == (
            old.deployment_id,
            new.deployment_id,
        )
    # The new one loads: the binding waits. It becomes READY: the binding moves with it.
    async with database.transaction() as session:
        row = await deployments.get_deployment(session, new.deployment_id)
        await deployments.set_deployment_state(session, row, DeploymentState.LOADING, now=NOW)
        assert (await bindings.require_binding(session, "cap")).deployment_id == old.deployment_id
        await deployments.set_deployment_state(session, row, DeploymentState.READY, now=NOW)
        moved = await bindings.require_binding(session, "cap")
        assert (moved.deployment_id, moved.pending_deployment_id) == (new.deployment_id, None)
    # A pending deployment that fails stops being waited for; the bound one keeps the capability.
    async with database.transaction() as session:
        third = await deployments.create_deployment(
            session,
            capability="cap",
            artifact_set_id=seeded.artifact_set_id,
            adapter={},
            environment_id="",
            replicas=1,
            now=NOW,
        )
        await bindings.bind(
            session, capability="cap", deployment_id=third.deployment_id, serves_now=False, now=NOW
        )
        await deployments.set_deployment_state(session, third, DeploymentState.FAILED, now=NOW)
        kept = await bindings.require_binding(session, "cap")
        assert (kept.deployment_id, kept.pending_deployment_id) == (new.deployment_id, None)
        assert await bindings.bound_deployment_ids(
            session, [old.deployment_id, new.deployment_id, third.deployment_id]
        ) == {new.deployment_id}


# ---- with a real worker and a tiny real model -------------------------------------------------


async def test_a_real_worker_walks_every_gate_and_the_approved_model_serves(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
):
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        await harness.start_worker(await harness.register_node("real"))
        artifact = await harness.register_model(tiny_model_dir, "tiny")
        created = await harness.deploy(artifact.artifact_set_id, "tiny", device="cpu")
        ready = await harness.wait_deployment(created.deployment_id, cp.DEPLOYMENT_STATE_READY)
        assert ready.bound and ready.approval_id
        response = await harness.inference.Embed(
            inf.EmbedRequest(capability="tiny", inputs=["gated"]), metadata=harness.client_md
        )
        assert response.deployment_id == created.deployment_id and response.dim > 0
        probes_listed = await harness.operator.ListProbes(
            cp.ListProbesRequest(profile_id=created.profile_id), metadata=harness.op_md
        )
        (probe,) = probes_listed.probes
        evidence = probe.evidence
        assert evidence.reclaim.reclaimed and evidence.output_finite
        assert evidence.offline.local_files_only and not evidence.offline.trust_remote_code
        assert evidence.memory.rss_peak.WhichOneof("value") == "bytes"
        profile = await harness.operator.GetRuntimeProfile(
            cp.GetRuntimeProfileRequest(profile_id=created.profile_id), metadata=harness.op_md
        )
        assert profile.ram_envelope_bytes >= evidence.memory.rss_peak.bytes > 0
