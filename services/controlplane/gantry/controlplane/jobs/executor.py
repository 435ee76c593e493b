"""The one executor of plans: applies a tuple of actions (jobs/actions.py) in the caller's
transaction, in order, through one table from action type to its store write.

It lives in `jobs` because both callers already stand on it: the job-result handlers (here and
in evidence/jobs.py) and the reconciler (deployments/reconciler.py, which imports jobs already),
while `platform` imports no resource's store. It never commits and never announces: it returns
what it changed, and the caller records that as domain events in the same transaction
(platform/events.py), which the unit of work publishes after the commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.placement import queue_load
from gantry.controlplane.deployments.residency_stop import create_unload_job
from gantry.controlplane.deployments.settle import settle_deployment, settle_node_deployments
from gantry.controlplane.evidence import assessments, candidates, probes, profiles
from gantry.controlplane.evidence.probe_transitions import ProbeState
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.models import Deployment, Node, Residency
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState


@dataclass
class Applied:
    """What the actions changed that the caller tells others about after its commit."""

    residencies: list[Residency] = field(default_factory=list)  # state written: ResidenciesChanged
    nodes: list[Node] = field(default_factory=list)  # disconnected: NodeChanged, stream closed


async def apply_actions(
    session: AsyncSession, actions: Sequence[act.Action], *, now: dt.datetime
) -> Applied:
    applied = Applied()
    for action in actions:
        await _APPLY[type(action)](session, action, now, applied)
    return applied


# ---- residencies ----------------------------------------------------------------------------


async def _mark_residency(
    session: AsyncSession, action: act.MarkResidency, now: dt.datetime, applied: Applied
) -> None:
    residency = await deployments.get_residency(session, action.residency_id)
    values: dict[str, Any] = {}
    if action.pid is not None:
        values["pid"] = action.pid
    if action.reason is not None:
        values.update(last_failure_reason=action.reason, last_failure_message=action.message)
    await deployments.set_residency_state(session, residency, action.state, now=now, **values)
    applied.residencies.append(residency)


async def _mark_resident(
    session: AsyncSession, action: act.MarkResident, now: dt.datetime, applied: Applied
) -> None:
    residency = await deployments.get_residency(session, action.residency_id)
    await deployments.set_residency_state(
        session,
        residency,
        ResidencyState.RESIDENT,
        now=now,
        pid=action.pid,
        generation=action.generation,
        restart_count=0,
        last_failure_reason="",
        last_failure_message="",
        artifact_digest=action.artifact_digest,
        adapter_digest=action.adapter_digest,
        environment_fingerprint=action.environment_fingerprint,
    )
    applied.residencies.append(residency)


async def _queue_load(
    session: AsyncSession, action: act.QueueLoad, now: dt.datetime, applied: Applied
) -> None:
    deployment = await deployments.get_deployment(session, action.deployment_id)
    residency = await deployments.get_residency(session, action.residency_id)
    await queue_load(session, deployment, residency, now=now)
    applied.residencies.append(residency)


async def _queue_unload(
    session: AsyncSession, action: act.QueueUnload, now: dt.datetime, applied: Applied
) -> None:
    residency = await deployments.get_residency(session, action.residency_id)
    await create_unload_job(session, residency, now=now)


# ---- deployments ----------------------------------------------------------------------------


async def _set_load_failures(
    session: AsyncSession, action: act.SetLoadFailures, now: dt.datetime, applied: Applied
) -> None:
    # A plain field (no machine governs it), flushed with the unit of work's next statement.
    deployment = await deployments.get_deployment(session, action.deployment_id)
    deployment.load_failure_count = action.count


async def _settle(
    session: AsyncSession, action: act.Settle, now: dt.datetime, applied: Applied
) -> None:
    await settle_deployment(session, action.deployment_id, now=now)


async def _guarded(
    session: AsyncSession, deployment_id: str, only_from: frozenset[DeploymentState] | None
) -> Deployment | None:
    """The deployment row, or None when its guard says to leave it (read again for the guard)."""
    deployment = await deployments.get_deployment(session, deployment_id)
    if only_from is None:
        return deployment
    await session.refresh(deployment)
    return deployment if deployment.state in only_from else None


async def _set_deployment_state(
    session: AsyncSession, action: act.SetDeploymentState, now: dt.datetime, applied: Applied
) -> None:
    deployment = await _guarded(session, action.deployment_id, action.only_from)
    if deployment is None:
        return
    await deployments.set_deployment_state(
        session,
        deployment,
        action.state or DeploymentState(deployment.state),
        now=now,
        failure_reason=action.reason,
        failure_message=action.message,
    )


async def _fail_deployment(
    session: AsyncSession, action: act.FailDeployment, now: dt.datetime, applied: Applied
) -> None:
    deployment = await _guarded(session, action.deployment_id, action.only_from)
    if deployment is None:
        return
    await deployments.move_deployment(
        session,
        deployment,
        DeploymentState.FAILED,
        now=now,
        failure=(action.reason, action.message),
    )


# ---- nodes and jobs -------------------------------------------------------------------------


async def _disconnect_node(
    session: AsyncSession, action: act.DisconnectNode, now: dt.datetime, applied: Applied
) -> None:
    node = await nodes.get_node(session, action.node_id)
    values = {} if action.last_seen_at is None else {"last_seen_at": action.last_seen_at}
    await nodes.set_node_state(session, node, NodeState.DISCONNECTED, now=now, **values)
    await settle_node_deployments(session, node.node_id, now=now)
    applied.nodes.append(node)


async def _cancel_job(
    session: AsyncSession, action: act.CancelJob, now: dt.datetime, applied: Applied
) -> None:
    await jobs.cancel_job(session, await jobs.get_job(session, action.job_id), now=now)


async def _abandon_pipeline_jobs(
    session: AsyncSession, action: act.AbandonPipelineJobs, now: dt.datetime, applied: Applied
) -> None:
    # Imported here: each job type's handler says what abandoning it ends, and the handlers
    # module applies its own plans through this one.
    from gantry.controlplane.jobs.handlers import abandon_pipeline_jobs

    await abandon_pipeline_jobs(
        session, action.node_id, reason=action.reason, message=action.message, now=now
    )


async def _audit(
    session: AsyncSession, action: act.Audit, now: dt.datetime, applied: Applied
) -> None:
    await audit.record_event(
        session,
        actor=action.actor,
        action=action.action,
        subject_kind=action.subject_kind,
        subject_id=action.subject_id,
        now=now,
        **dict(action.detail),
    )


# ---- the evidence pipeline ------------------------------------------------------------------


async def _complete_assessment(
    session: AsyncSession, action: act.CompleteAssessment, now: dt.datetime, applied: Applied
) -> None:
    await assessments.complete_assessment(
        session,
        await assessments.get_assessment(session, action.assessment_id),
        compatible=action.compatible,
        inspection=action.inspection,
        environment_fingerprint=action.environment_fingerprint,
        failure_reason=action.reason,
        failure_message=action.message,
        now=now,
    )


async def _fail_assessment(
    session: AsyncSession, action: act.FailAssessment, now: dt.datetime, applied: Applied
) -> None:
    await assessments.fail_assessment(
        session,
        await assessments.get_assessment(session, action.assessment_id),
        reason=action.reason,
        message=action.message,
        now=now,
    )


async def _fail_probe(
    session: AsyncSession, action: act.FailProbe, now: dt.datetime, applied: Applied
) -> None:
    await probes.end_probe(
        session,
        await probes.get_probe(session, action.probe_id),
        ProbeState.FAILED,
        reason=action.reason,
        message=action.message,
        now=now,
    )


async def _record_probe_evidence(
    session: AsyncSession, action: act.RecordProbeEvidence, now: dt.datetime, applied: Applied
) -> None:
    probe = await probes.get_probe(session, action.probe_id)
    candidate = await candidates.create_candidate(
        session,
        probe_id=action.probe_id,
        profile_id=action.profile_id,
        artifact_set_id=action.artifact_set_id,
        status=action.status,
        reasons=list(action.reasons),
        now=now,
    )
    await probes.complete_probe(
        session, probe, evidence=action.evidence, candidate_id=candidate.candidate_id, now=now
    )
    await profiles.raise_measured_peaks(
        session,
        await profiles.get_profile(session, action.profile_id),
        ram_peak_bytes=action.ram_peak_bytes,
        vram_peak_bytes=action.vram_peak_bytes,
    )
    candidate_created = act.Audit(
        actor=action.actor,
        action="candidate.create",
        subject_kind="candidate",
        subject_id=candidate.candidate_id,
        detail=(("probe_id", action.probe_id), ("status", str(action.status))),
    )
    await _audit(session, candidate_created, now, applied)


_Apply = Callable[[AsyncSession, Any, dt.datetime, Applied], Awaitable[None]]

# One entry per action type (tests/unit/test_job_result_plans.py checks none is missing).
_APPLY: Mapping[type, _Apply] = {
    act.MarkResidency: _mark_residency,
    act.MarkResident: _mark_resident,
    act.QueueLoad: _queue_load,
    act.QueueUnload: _queue_unload,
    act.SetLoadFailures: _set_load_failures,
    act.Settle: _settle,
    act.SetDeploymentState: _set_deployment_state,
    act.FailDeployment: _fail_deployment,
    act.DisconnectNode: _disconnect_node,
    act.CancelJob: _cancel_job,
    act.AbandonPipelineJobs: _abandon_pipeline_jobs,
    act.Audit: _audit,
    act.CompleteAssessment: _complete_assessment,
    act.FailAssessment: _fail_assessment,
    act.FailProbe: _fail_probe,
    act.RecordProbeEvidence: _record_probe_evidence,
}
