"""The ControlPlane RPCs of the evidence pipeline and capability bindings.

One gate per record (ARCHITECTURE.md): AssessCompatibility -> CreateRuntimeProfile -> StartProbe
-> (the probe's evidence makes a candidate) -> ApproveCandidate -> CreateDeployment(approval_id);
BindCapability names the one deployment a capability reaches. Each RPC checks its input here and
leaves the gate's rules to evidence_pipeline.py; ControlPlaneService mixes these in.
"""

from __future__ import annotations

import grpc

from gantry.common.auth import current_principal
from gantry.common.errors import invalid_argument
from gantry.common.ids import parse_id
from gantry.controlplane.deployments import bindings
from gantry.controlplane.evidence import approvals, assessments, candidates, probes, profiles
from gantry.controlplane.evidence.pipeline import EvidencePipeline
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.paging import page_of
from gantry.controlplane.platform.validation import (
    MAX_ENVIRONMENT_ID_CHARS,
    MAX_REASON_CHARS,
    _check_length,
    _check_name,
    check_adapter_settings,
    check_bytes,
)
from gantry.v1 import control_plane_pb2 as cp


def _optional_id(value: str, *, field: str) -> str:
    return parse_id(value, field=field) if value else ""


class EvidencePipelineRpcs:
    """Mixed into ControlPlaneService, which sets these."""

    _database: Database
    _pipeline: EvidencePipeline

    # ---- assessments --------------------------------------------------------------------------

    async def AssessCompatibility(
        self, request: cp.AssessCompatibilityRequest, context: grpc.aio.ServicerContext
    ) -> cp.CompatibilityAssessment:
        artifact_set_id = parse_id(request.artifact_set_id, field="artifact_set_id")
        node_id = _optional_id(request.node_id, field="node_id")
        _check_length(
            request.environment_id, field="environment_id", limit=MAX_ENVIRONMENT_ID_CHARS
        )
        row = await self._pipeline.assess(
            artifact_set_id=artifact_set_id,
            node_id=node_id,
            environment_id=request.environment_id,
            actor=current_principal().subject,
        )
        # The assessment as this call created it. A read-back could already see the worker's
        # answer (or not), depending on which transaction got the database first.
        return convert.assessment(row)

    async def GetAssessment(
        self, request: cp.GetAssessmentRequest, context: grpc.aio.ServicerContext
    ) -> cp.CompatibilityAssessment:
        return await self._assessment(parse_id(request.assessment_id, field="assessment_id"))

    async def ListAssessments(
        self, request: cp.ListAssessmentsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListAssessmentsResponse:
        page = page_of(request.page_size, request.page_token)
        artifact_set_id = _optional_id(request.artifact_set_id, field="artifact_set_id")
        async with self._database.transaction() as session:
            rows = await assessments.list_assessments(
                session, after=page.after, limit=page.fetch, artifact_set_id=artifact_set_id
            )
        items, next_token = page.split(rows, key=lambda row: row.assessment_id)
        return cp.ListAssessmentsResponse(
            assessments=[convert.assessment(r) for r in items], next_page_token=next_token
        )

    async def _assessment(self, assessment_id: str) -> cp.CompatibilityAssessment:
        async with self._database.transaction() as session:
            return convert.assessment(await assessments.get_assessment(session, assessment_id))

    # ---- runtime profiles ---------------------------------------------------------------------

    async def CreateRuntimeProfile(
        self, request: cp.CreateRuntimeProfileRequest, context: grpc.aio.ServicerContext
    ) -> cp.RuntimeProfile:
        assessment_id = parse_id(request.assessment_id, field="assessment_id")
        _check_name(request.name, field="name")
        check_adapter_settings(request.adapter)
        check_bytes(request.ram_estimate_bytes, field="ram_estimate_bytes")
        check_bytes(request.vram_estimate_bytes, field="vram_estimate_bytes")
        row = await self._pipeline.create_profile(
            assessment_id=assessment_id,
            name=request.name,
            settings=request.adapter,
            ram_estimate_bytes=request.ram_estimate_bytes,
            vram_estimate_bytes=request.vram_estimate_bytes,
            actor=current_principal().subject,
        )
        return convert.runtime_profile(row)

    async def GetRuntimeProfile(
        self, request: cp.GetRuntimeProfileRequest, context: grpc.aio.ServicerContext
    ) -> cp.RuntimeProfile:
        profile_id = parse_id(request.profile_id, field="profile_id")
        async with self._database.transaction() as session:
            return convert.runtime_profile(await profiles.get_profile(session, profile_id))

    async def ListRuntimeProfiles(
        self, request: cp.ListRuntimeProfilesRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListRuntimeProfilesResponse:
        page = page_of(request.page_size, request.page_token)
        artifact_set_id = _optional_id(request.artifact_set_id, field="artifact_set_id")
        async with self._database.transaction() as session:
            rows = await profiles.list_profiles(
                session, after=page.after, limit=page.fetch, artifact_set_id=artifact_set_id
            )
        items, next_token = page.split(rows, key=lambda row: row.profile_id)
        return cp.ListRuntimeProfilesResponse(
            profiles=[convert.runtime_profile(r) for r in items], next_page_token=next_token
        )

    # ---- probes -------------------------------------------------------------------------------

    async def StartProbe(
        self, request: cp.StartProbeRequest, context: grpc.aio.ServicerContext
    ) -> cp.RuntimeProbe:
        profile_id = parse_id(request.profile_id, field="profile_id")
        node_id = _optional_id(request.node_id, field="node_id")
        row = await self._pipeline.start_probe(
            profile_id=profile_id, node_id=node_id, actor=current_principal().subject
        )
        return await self._probe(row.probe_id)

    async def GetProbe(
        self, request: cp.GetProbeRequest, context: grpc.aio.ServicerContext
    ) -> cp.RuntimeProbe:
        return await self._probe(parse_id(request.probe_id, field="probe_id"))

    async def ListProbes(
        self, request: cp.ListProbesRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListProbesResponse:
        page = page_of(request.page_size, request.page_token)
        profile_id = _optional_id(request.profile_id, field="profile_id")
        async with self._database.transaction() as session:
            rows = await probes.list_probes(
                session, after=page.after, limit=page.fetch, profile_id=profile_id
            )
        items, next_token = page.split(rows, key=lambda row: row.probe_id)
        return cp.ListProbesResponse(
            probes=[convert.probe(r) for r in items], next_page_token=next_token
        )

    async def CancelProbe(
        self, request: cp.CancelProbeRequest, context: grpc.aio.ServicerContext
    ) -> cp.RuntimeProbe:
        probe_id = parse_id(request.probe_id, field="probe_id")
        await self._pipeline.cancel_probe(probe_id=probe_id, actor=current_principal().subject)
        return await self._probe(probe_id)

    async def _probe(self, probe_id: str) -> cp.RuntimeProbe:
        async with self._database.transaction() as session:
            return convert.probe(await probes.get_probe(session, probe_id))

    # ---- candidates and approvals -------------------------------------------------------------

    async def GetDeploymentCandidate(
        self, request: cp.GetDeploymentCandidateRequest, context: grpc.aio.ServicerContext
    ) -> cp.DeploymentCandidate:
        candidate_id = parse_id(request.candidate_id, field="candidate_id")
        async with self._database.transaction() as session:
            row = await candidates.get_candidate(session, candidate_id)
            approval = await approvals.approval_for_candidate(session, candidate_id)
        return convert.candidate(row, approval.approval_id if approval else "")

    async def ListDeploymentCandidates(
        self, request: cp.ListDeploymentCandidatesRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListDeploymentCandidatesResponse:
        page = page_of(request.page_size, request.page_token)
        profile_id = _optional_id(request.profile_id, field="profile_id")
        async with self._database.transaction() as session:
            rows = await candidates.list_candidates(
                session, after=page.after, limit=page.fetch, profile_id=profile_id
            )
            items, next_token = page.split(rows, key=lambda row: row.candidate_id)
            messages = []
            for row in items:
                approval = await approvals.approval_for_candidate(session, row.candidate_id)
                messages.append(convert.candidate(row, approval.approval_id if approval else ""))
        return cp.ListDeploymentCandidatesResponse(candidates=messages, next_page_token=next_token)

    async def ApproveCandidate(
        self, request: cp.ApproveCandidateRequest, context: grpc.aio.ServicerContext
    ) -> cp.ProductionApproval:
        candidate_id = parse_id(request.candidate_id, field="candidate_id")
        reason = request.reason.strip()
        if not reason:
            raise invalid_argument("reason is required: say why this may serve", field="reason")
        _check_length(reason, field="reason", limit=MAX_REASON_CHARS)
        row = await self._pipeline.approve(
            candidate_id=candidate_id, reason=reason, actor=current_principal().subject
        )
        return convert.approval(row)

    async def GetApproval(
        self, request: cp.GetApprovalRequest, context: grpc.aio.ServicerContext
    ) -> cp.ProductionApproval:
        approval_id = parse_id(request.approval_id, field="approval_id")
        async with self._database.transaction() as session:
            return convert.approval(await approvals.get_approval(session, approval_id))

    async def ListApprovals(
        self, request: cp.ListApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListApprovalsResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await approvals.list_approvals(session, after=page.after, limit=page.fetch)
        items, next_token = page.split(rows, key=lambda row: row.approval_id)
        return cp.ListApprovalsResponse(
            approvals=[convert.approval(r) for r in items], next_page_token=next_token
        )

    # ---- capability bindings ------------------------------------------------------------------

    async def BindCapability(
        self, request: cp.BindCapabilityRequest, context: grpc.aio.ServicerContext
    ) -> cp.CapabilityBinding:
        capability = _check_name(request.capability, field="capability")
        deployment_id = parse_id(request.deployment_id, field="deployment_id")
        row = await self._pipeline.bind_capability(
            capability=capability,
            deployment_id=deployment_id,
            actor=current_principal().subject,
        )
        return convert.binding(row)

    async def GetCapabilityBinding(
        self, request: cp.GetCapabilityBindingRequest, context: grpc.aio.ServicerContext
    ) -> cp.CapabilityBinding:
        capability = _check_name(request.capability, field="capability")
        async with self._database.transaction() as session:
            return convert.binding(await bindings.require_binding(session, capability))

    async def ListCapabilityBindings(
        self, request: cp.ListCapabilityBindingsRequest, context: grpc.aio.ServicerContext
    ) -> cp.ListCapabilityBindingsResponse:
        page = page_of(request.page_size, request.page_token)
        async with self._database.transaction() as session:
            rows = await bindings.list_bindings(session, after=page.after, limit=page.fetch)
        items, next_token = page.split(rows, key=lambda row: row.capability)
        return cp.ListCapabilityBindingsResponse(
            bindings=[convert.binding(r) for r in items], next_page_token=next_token
        )
