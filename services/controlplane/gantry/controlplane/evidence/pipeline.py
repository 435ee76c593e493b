"""The evidence pipeline's operator actions: assess, profile, probe, cancel, approve, bind.

Each gate is checked against the record it builds on, inside the transaction that creates the
next record, and leaves an audit event. Jobs (INSPECT, PROBE) are committed first and dispatched
after, as the deployment lifecycle does; what their results mean is in pipeline_jobs.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.controlplane.artifacts import store as artifacts
from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.deployments.lifecycle_parts import LifecycleService
from gantry.controlplane.evidence import approvals, assessments, candidates, probes, profiles
from gantry.controlplane.evidence.pipeline_states import AssessmentState, CandidateStatus
from gantry.controlplane.evidence.probe_transitions import ProbeState
from gantry.controlplane.evidence.profile_preprocessing import bind_preprocessing
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.events import CapabilityBound, record
from gantry.controlplane.platform.models import (
    CapabilityBinding,
    CompatibilityAssessment,
    DeploymentCandidate,
    Node,
    ProductionApproval,
    RuntimeProbe,
    RuntimeProfile,
    ServingJob,
)
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    NodeState,
)
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.controlplane.platform.validation import check_supported_adapter
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

DEFAULT_ENVIRONMENT_ID = "default"


@dataclass(frozen=True, slots=True)
class NodeChoice:
    node_id: str
    environment_listed: bool  # its Hello named the environment
    environment_available: bool  # ... and said it is usable there


def choose_node(options: Sequence[NodeChoice]) -> str | None:
    """The node to inspect on when the operator named none. Pure.

    A node whose worker reported the environment as available first, then one that at least
    named it, then any; ties go to the lowest node id so the choice is repeatable.
    """
    if not options:
        return None
    ranked = sorted(
        options,
        key=lambda o: (not o.environment_available, not o.environment_listed, o.node_id),
    )
    return ranked[0].node_id


def _environment_facts(node: Node, environment_id: str) -> tuple[bool, bool, str]:
    """(listed, available, why not) for one environment id in the node's last Hello. A worker
    that finds an environment unusable always says why; one that says nothing is not read as a
    refusal (the job goes, and the worker answers for itself)."""
    wanted = environment_id or DEFAULT_ENVIRONMENT_ID
    for environment in (node.inventory or {}).get("environments", []):
        # MessageToDict leaves out empty fields; workers name their default environment "default".
        if (environment.get("environmentId") or DEFAULT_ENVIRONMENT_ID) == wanted:
            available = bool(environment.get("available", False))
            return True, available, str(environment.get("unavailableReason", ""))
    return False, False, ""


def refuse_unavailable(environment_id: str, reasons: Mapping[str, str]) -> None:
    """RUNTIME_ENVIRONMENT_UNAVAILABLE at once when every node asked (node id -> the reason its
    worker gave) said the environment cannot run there: a job sent anyway could only fail the
    same way, later. Pure. Nodes that did not name the environment are not in `reasons`."""
    if not reasons:
        return
    wanted = environment_id or DEFAULT_ENVIRONMENT_ID
    said = "; ".join(f"node {node_id}: {why}" for node_id, why in sorted(reasons.items()))
    raise GantryError(
        "RUNTIME_ENVIRONMENT_UNAVAILABLE",
        f"runtime environment {wanted!r} is unavailable on every node that could run this: {said}",
        environment_id=wanted,
    )


@dataclass(frozen=True, slots=True)
class ApprovedSource:
    """What an approval lets a deployment be made from."""

    approval: ProductionApproval
    candidate: DeploymentCandidate
    profile: RuntimeProfile


async def approved_source(session: AsyncSession, approval_id: str) -> ApprovedSource:
    """The approval's candidate and profile, refused as NOT_APPROVED unless they still hold."""
    approval = await approvals.get_approval(session, approval_id)
    candidate = await candidates.get_candidate(session, approval.candidate_id)
    if candidate.status != CandidateStatus.LAB_READY or not candidate.production:
        raise GantryError(
            "NOT_APPROVED",
            f"approval {approval_id} names candidate {candidate.candidate_id}, which is "
            f"{candidate.status} and not approved for production",
            approval_id=approval_id,
        )
    profile = await profiles.get_profile(session, approval.profile_id)
    return ApprovedSource(approval=approval, candidate=candidate, profile=profile)


async def _queue_linked_job(
    session: AsyncSession,
    row: CompatibilityAssessment | RuntimeProbe,
    job_type: JobType,
    *,
    node_id: str,
    now: dt.datetime,
    assessment_id: str | None = None,
    probe_id: str | None = None,
) -> None:
    """The inspection or probe job that does `row`'s work, queued and named on it (job_id)."""
    job = await jobs.create_job(
        session,
        job_type=job_type,
        node_id=node_id,
        assessment_id=assessment_id,
        probe_id=probe_id,
        now=now,
    )
    row.job_id = job.job_id
    await session.flush()


class EvidencePipeline(LifecycleService):
    # ---- nodes --------------------------------------------------------------------------------

    async def _connected_node(self, session: AsyncSession, node_id: str) -> Node:
        node = await nodes.get_node(session, node_id)
        if node.state == NodeState.DISABLED:
            raise GantryError("NODE_DISABLED", f"node {node_id} is disabled", node_id=node_id)
        if node.state != NodeState.CONNECTED or self._hub.get(node_id) is None:
            raise GantryError(
                "WORKER_UNAVAILABLE",
                f"node {node_id} is not connected: its worker must hold the bytes and run the job",
                node_id=node_id,
            )
        return node

    async def _any_connected_node(self, session: AsyncSession, environment_id: str) -> Node:
        options: list[NodeChoice] = []
        rows: dict[str, Node] = {}
        unavailable: dict[str, str] = {}  # node id -> why its worker cannot run the environment
        for node_id in self._hub.connected_node_ids():
            node = await session.get(Node, node_id)
            if node is None or node.state != NodeState.CONNECTED:
                continue
            listed, available, why_not = _environment_facts(node, environment_id)
            options.append(NodeChoice(node_id, listed, available))
            rows[node_id] = node
            if listed and not available and why_not:
                unavailable[node_id] = why_not
        chosen = choose_node(options)
        if chosen is None:
            raise GantryError(
                "NO_ELIGIBLE_NODE", "no enabled node is connected to run the inspection"
            )
        if len(unavailable) == len(options):
            refuse_unavailable(environment_id, unavailable)
        return rows[chosen]

    # ---- assessment ---------------------------------------------------------------------------

    async def assess(
        self, *, artifact_set_id: str, node_id: str, environment_id: str, actor: str
    ) -> CompatibilityAssessment:
        now = self._clock.now()
        async with self._database.transaction() as session:
            await artifacts.get_live_artifact_set(session, artifact_set_id)
            if node_id:
                node = await self._connected_node(session, node_id)
                listed, available, why_not = _environment_facts(node, environment_id)
                if listed and not available and why_not:
                    refuse_unavailable(environment_id, {node_id: why_not})
            else:
                node = await self._any_connected_node(session, environment_id)
            row = await assessments.create_assessment(
                session,
                artifact_set_id=artifact_set_id,
                node_id=node.node_id,
                environment_id=environment_id,
                now=now,
            )
            await _queue_linked_job(
                session,
                row,
                JobType.INSPECT,
                node_id=node.node_id,
                assessment_id=row.assessment_id,
                now=now,
            )
            await audit.record_event(
                session,
                actor=actor,
                action="assessment.create",
                subject_kind="assessment",
                subject_id=row.assessment_id,
                now=now,
                artifact_set_id=artifact_set_id,
                node_id=node.node_id,
                environment_id=environment_id,
            )
        await self._lifecycle.dispatch_queued(row.node_id)
        return row

    # ---- profile ------------------------------------------------------------------------------

    async def create_profile(
        self,
        *,
        assessment_id: str,
        name: str,
        settings: common_pb2.AdapterSettings,
        ram_estimate_bytes: int,
        vram_estimate_bytes: int,
        actor: str,
    ) -> RuntimeProfile:
        now = self._clock.now()
        adapter = settings
        async with self._database.transaction() as session:
            assessment = await assessments.get_assessment(session, assessment_id)
            await artifacts.get_live_artifact_set(session, assessment.artifact_set_id)
            inspection = convert.assessment(assessment).inspection
            if not adapter.adapter and inspection.adapters:
                # No adapter named: the first the inspection found able to run it.
                adapter = common_pb2.AdapterSettings()
                adapter.CopyFrom(settings)
                adapter.adapter = inspection.adapters[0]
            _check_profile_gate(assessment, inspection, adapter)
            # The preprocessing inspection read (image size and normalisation, sampling rate),
            # bound where the operator left it unset; a disagreeing value is refused.
            adapter = bind_preprocessing(adapter, inspection.details)
            row = await profiles.create_profile(
                session,
                name=name,
                assessment_id=assessment_id,
                artifact_set_id=assessment.artifact_set_id,
                environment_id=assessment.environment_id,
                adapter=convert.adapter_to_json(adapter),
                ram_estimate_bytes=ram_estimate_bytes,
                vram_estimate_bytes=vram_estimate_bytes,
                created_by=actor,
                now=now,
            )
            await audit.record_event(
                session,
                actor=actor,
                action="profile.create",
                subject_kind="profile",
                subject_id=row.profile_id,
                now=now,
                assessment_id=assessment_id,
                adapter=adapter.adapter,
            )
            if adapter.allow_pickle_weights:
                # Loading pickle can execute code: who allowed it, for which bytes, is kept.
                await audit.record_event(
                    session,
                    actor=actor,
                    action="profile.allow_pickle_weights",
                    subject_kind="profile",
                    subject_id=row.profile_id,
                    now=now,
                    artifact_set_id=assessment.artifact_set_id,
                    weight_format=inspection.weight_format,
                )
        return row

    # ---- probe --------------------------------------------------------------------------------

    async def start_probe(self, *, profile_id: str, node_id: str, actor: str) -> RuntimeProbe:
        now = self._clock.now()
        async with self._database.transaction() as session:
            profile = await profiles.get_profile(session, profile_id)
            await artifacts.get_live_artifact_set(session, profile.artifact_set_id)
            if not node_id:
                node_id = (await assessments.get_assessment(session, profile.assessment_id)).node_id
            node = await self._connected_node(session, node_id)
            row = await probes.create_probe(
                session, profile_id=profile_id, node_id=node.node_id, now=now
            )
            await _queue_linked_job(
                session, row, JobType.PROBE, node_id=node.node_id, probe_id=row.probe_id, now=now
            )
            await audit.record_event(
                session,
                actor=actor,
                action="probe.start",
                subject_kind="probe",
                subject_id=row.probe_id,
                now=now,
                profile_id=profile_id,
                node_id=node.node_id,
            )
        await self._lifecycle.dispatch_queued(row.node_id)
        return row

    async def cancel_probe(self, *, probe_id: str, actor: str) -> RuntimeProbe:
        """CANCELLED, its job cancelled, and its worker told to stop (CancelJob) if it holds it.

        Cancelling a cancelled probe changes nothing; a COMPLETED or FAILED one cannot be.
        """

        async def attempt() -> tuple[RuntimeProbe, ServingJob | None]:
            now = self._clock.now()
            async with self._database.transaction() as session:
                probe = await probes.get_probe(session, probe_id)
                if probe.state == ProbeState.CANCELLED:
                    return probe, None
                await probes.end_probe(
                    session, probe, ProbeState.CANCELLED, reason="", message="", now=now
                )
                stop: ServingJob | None = None
                if probe.job_id:
                    job = await jobs.get_job(session, probe.job_id)
                    if job.state in jobs.OPEN_JOB_STATES:
                        held = job.state != JobState.QUEUED
                        await jobs.cancel_job(session, job, now=now)
                        stop = job if held else None
                await audit.record_event(
                    session,
                    actor=actor,
                    action="probe.cancel",
                    subject_kind="probe",
                    subject_id=probe_id,
                    now=now,
                )
                return probe, stop

        probe, stop = await retry_on_conflict(attempt)
        if stop is not None:
            self._lifecycle.cancel_on_worker(stop)
        return probe

    # ---- approval -----------------------------------------------------------------------------

    async def approve(self, *, candidate_id: str, reason: str, actor: str) -> ProductionApproval:
        """Only a LAB_READY candidate, once: a second approval (even a concurrent one, which
        loses the compare-and-set and is retried on fresh rows) is ALREADY_EXISTS."""

        async def attempt() -> ProductionApproval:
            now = self._clock.now()
            async with self._database.transaction() as session:
                candidate = await candidates.get_candidate(session, candidate_id)
                if candidate.status != CandidateStatus.LAB_READY:
                    raise GantryError(
                        "INVALID_STATE_TRANSITION",
                        f"candidate {candidate_id} is {candidate.status}: only a LAB_READY "
                        "candidate can be approved",
                        machine="candidate",
                        current=str(candidate.status),
                    )
                existing = await approvals.approval_for_candidate(session, candidate_id)
                if existing is not None or candidate.production:
                    raise GantryError(
                        "ALREADY_EXISTS",
                        f"candidate {candidate_id} is already approved",
                        approval_id=existing.approval_id if existing else "",
                    )
                await candidates.mark_production(session, candidate)
                row = await approvals.create_approval(
                    session,
                    candidate_id=candidate_id,
                    profile_id=candidate.profile_id,
                    approved_by=actor,
                    reason=reason,
                    now=now,
                )
                await audit.record_event(
                    session,
                    actor=actor,
                    action="candidate.approve",
                    subject_kind="candidate",
                    subject_id=candidate_id,
                    now=now,
                    approval_id=row.approval_id,
                    reason=reason,
                )
                return row

        return await retry_on_conflict(attempt)

    # ---- capability bindings ------------------------------------------------------------------

    async def bind_capability(
        self, *, capability: str, deployment_id: str, actor: str
    ) -> CapabilityBinding:
        async def attempt() -> CapabilityBinding:
            now = self._clock.now()
            async with self._database.transaction() as session:
                deployment = await deployments.get_live_deployment(session, deployment_id)
                if deployment.capability != capability:
                    raise GantryError(
                        "INVALID_ARGUMENT",
                        f"deployment {deployment_id} serves capability "
                        f"{deployment.capability!r}, not {capability!r}",
                        field="capability",
                    )
                # An adopted endpoint's gate is the operator's audited AdoptEndpoint.
                if deployment.approval_id is None and deployment.origin != "adopted":
                    raise GantryError(
                        "NOT_APPROVED",
                        f"deployment {deployment_id} was made without an approval",
                        deployment_id=deployment_id,
                    )
                if deployment.state not in LIVE_STATES:
                    raise GantryError(
                        "INVALID_STATE_TRANSITION",
                        f"deployment {deployment_id} is {deployment.state} and will not serve",
                        machine="capability_binding",
                        current=str(deployment.state),
                    )
                row = await bindings.bind(
                    session,
                    capability=capability,
                    deployment_id=deployment_id,
                    serves_now=deployment.state == DeploymentState.READY,
                    now=now,
                )
                await audit.record_event(
                    session,
                    actor=actor,
                    action="capability.bind",
                    subject_kind="capability",
                    subject_id=capability,
                    now=now,
                    deployment_id=deployment_id,
                    bound_now=str(row.deployment_id == deployment_id),
                )
                record(session, CapabilityBound(capability))  # a cached route may name the old one
                return row

        return await retry_on_conflict(attempt)


def _check_profile_gate(
    assessment: CompatibilityAssessment,
    inspection: wg.Inspection,
    adapter: common_pb2.AdapterSettings,
) -> None:
    """A profile only from a COMPLETED, compatible assessment whose adapters include its own."""
    if assessment.state != AssessmentState.COMPLETED:
        detail: dict[str, Any] = {}
        if assessment.failure_reason:
            detail["failure_reason"] = assessment.failure_reason
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"assessment {assessment.assessment_id} is {assessment.state}: a profile needs a "
            "COMPLETED, compatible assessment",
            machine="assessment",
            current=str(assessment.state),
            **detail,
        )
    if not assessment.compatible:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            f"assessment {assessment.assessment_id} found the artifact incompatible: "
            f"{assessment.failure_message or assessment.failure_reason}",
            assessment_id=assessment.assessment_id,
        )
    check_supported_adapter(adapter.adapter)
    if adapter.adapter not in inspection.adapters:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            f"adapter {adapter.adapter!r} is not among those the assessment found able to run "
            f"it: {', '.join(inspection.adapters) or 'none'}",
            adapter=adapter.adapter,
        )
    pickle = inspection.weight_format == "pickle"
    if adapter.allow_pickle_weights and not pickle:
        raise GantryError(
            "INVALID_ARGUMENT",
            f"allow_pickle_weights is only for pickle weights; these are "
            f"{inspection.weight_format or 'unknown'}",
            field="adapter.allow_pickle_weights",
        )
    if pickle and not adapter.allow_pickle_weights:
        raise GantryError(
            "RUNTIME_INCOMPATIBLE",
            "the weights are pickle-based: a profile must allow them explicitly "
            "(adapter.allow_pickle_weights, audited)",
            weight_format=inspection.weight_format,
        )
