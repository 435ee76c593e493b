"""The evidence pipeline over real gRPC: every gate, its refusals, probes under lost leases and
restarts, cancellation, and capability bindings that never serve from an unbound deployment.

The control plane runs as operators run it (no unapproved deployments); workers are scripted
streams (real gRPC clients of WorkerGateway.Connect) answering INSPECT and PROBE jobs with
evidence a test chooses. Both stores run every scenario; the repository-level checks at the end
run the compare-and-set paths directly on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.observability import audit
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import running_gantry, wait_for
from tests.integration.pipeline_support import (
    LEASE_SECONDS,
    SETTINGS,
    Pipeline,
    make_model_dir,
    pipeline_of,
    refusal,
)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path)


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(database_url, tmp_path, model_dir, clock=None):
        yield pipeline


@pytest.fixture
async def timed(database_url: str, tmp_path: Path, model_dir: Path) -> AsyncIterator[Pipeline]:
    """Time is a ManualClock and the test runs the reconciler's passes itself."""
    async for pipeline in pipeline_of(database_url, tmp_path, model_dir, clock=ManualClock()):
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
        # Observed by the child: its weights read from the verified copy alone, no model code.
        assert list(evidence.offline.weight_files) == ["model.safetensors"]
        assert not evidence.offline.weight_files_outside_copy
        assert not evidence.offline.remote_code_modules
        assert evidence.memory.rss_peak.WhichOneof("value") == "bytes"
        profile = await harness.operator.GetRuntimeProfile(
            cp.GetRuntimeProfileRequest(profile_id=created.profile_id), metadata=harness.op_md
        )
        assert profile.ram_envelope_bytes >= evidence.memory.rss_peak.bytes > 0
