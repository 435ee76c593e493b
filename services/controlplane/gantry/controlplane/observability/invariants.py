"""The invariants of ARCHITECTURE.md, checked on demand against the database (CheckInvariants)."""

from __future__ import annotations

import collections
import datetime as dt
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.evidence import candidates, probes
from gantry.controlplane.evidence.pipeline_states import AssessmentState
from gantry.controlplane.evidence.probe_transitions import TERMINAL_PROBE_STATES, ProbeState
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform.models import (
    CompatibilityAssessment,
    RuntimeProbe,
    ServingJob,
)
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    NodeState,
    ResidencyState,
)


@dataclass(frozen=True, slots=True)
class InvariantResult:
    name: str
    description: str
    offending_ids: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return not self.offending_ids


async def check_invariants(session: AsyncSession, *, now: dt.datetime) -> list[InvariantResult]:
    # Deleted nodes too: their rows still hold residencies and jobs to judge.
    every_node = await nodes.list_nodes(session, after="", limit=1_000_000, include_deleted=True)
    node_rows = {n.node_id: n for n in every_node}
    residencies = await deployments.all_residencies(session)
    open_jobs = await jobs.open_jobs(session)
    residency_by_id = {r.residency_id: r for r in residencies}

    orphans: list[str] = []
    for job in open_jobs:
        if job.state in (JobState.LEASED, JobState.RUNNING):
            if job.lease_expires_at is not None and job.lease_expires_at < now:
                orphans.append(f"job:{job.job_id}")
        elif job.state == JobState.QUEUED:
            node = node_rows.get(job.node_id)
            if job.job_type in jobs.PIPELINE_JOB_TYPES:
                # An inspection or probe job waits only for work still wanted, on a usable node.
                if not await _pipeline_work_open(session, job) or (
                    node is not None and node.state == NodeState.DISABLED
                ):
                    orphans.append(f"job:{job.job_id}")
                continue
            residency = residency_by_id.get(job.residency_id or "")
            if residency is None or residency.state == ResidencyState.COLD:
                orphans.append(f"job:{job.job_id}")
            elif node is not None and node.state == NodeState.DISABLED:
                if job.job_type != JobType.UNLOAD:
                    orphans.append(f"job:{job.job_id}")
    for residency in residencies:
        node = node_rows.get(residency.node_id)
        if (
            node is not None
            and node.state == NodeState.DISABLED
            and residency.state in (ResidencyState.LOADING, ResidencyState.RESIDENT)
        ):
            orphans.append(f"residency:{residency.residency_id}")

    per_slot = collections.Counter(
        (r.deployment_id, r.node_id, r.generation)
        for r in residencies
        if r.state == ResidencyState.RESIDENT
    )
    duplicates = [
        f"deployment:{d}/node:{n}/generation:{g}"
        for (d, n, g), count in per_slot.items()
        if count > 1
    ]

    ready_without_resident: list[str] = []
    for deployment in await deployments.deployments_in_states(session, [DeploymentState.READY]):
        serving = any(
            r.deployment_id == deployment.deployment_id
            and r.state == ResidencyState.RESIDENT
            and (node := node_rows.get(r.node_id)) is not None
            and node.state == NodeState.CONNECTED
            for r in residencies
        )
        if not serving:
            ready_without_resident.append(f"deployment:{deployment.deployment_id}")

    fenced = [
        f"job:{job.job_id}"
        for job in open_jobs
        if job.state in (JobState.LEASED, JobState.RUNNING)
        and (node := node_rows.get(job.node_id)) is not None
        and job.generation != node.generation
    ]
    early_candidates = []
    for candidate in await candidates.all_candidates(session):
        probe = await probes.get_probe(session, candidate.probe_id)
        if probe.state != ProbeState.COMPLETED or probe.candidate_id != candidate.candidate_id:
            early_candidates.append(f"candidate:{candidate.candidate_id}")
    return [
        InvariantResult(
            "no_orphan_serving_work",
            "no queued or leased job outlives its lease or its residency; no residency "
            "allocation on a disabled node",
            tuple(sorted(orphans)),
        ),
        InvariantResult(
            "one_resident_per_deployment_node_generation",
            "at most one RESIDENT residency per (deployment, node, generation)",
            tuple(sorted(duplicates)),
        ),
        InvariantResult(
            "ready_deployment_has_connected_resident",
            "no READY deployment without a RESIDENT residency on a connected node",
            tuple(sorted(ready_without_resident)),
        ),
        InvariantResult(
            "no_lease_held_by_fenced_generation",
            "no leased job belongs to a generation other than its node's current one",
            tuple(sorted(fenced)),
        ),
        InvariantResult(
            "candidate_only_from_completed_probe",
            "every deployment candidate comes from a COMPLETED probe that names it: no active "
            "probe is ever shown as a candidate",
            tuple(sorted(early_candidates)),
        ),
    ]


async def _pipeline_work_open(session: AsyncSession, job: ServingJob) -> bool:
    """Whether the assessment or probe a pipeline job serves still waits for it."""
    if job.probe_id:
        probe = await session.get(RuntimeProbe, job.probe_id)
        return probe is not None and probe.state not in TERMINAL_PROBE_STATES
    if job.assessment_id:
        assessment = await session.get(CompatibilityAssessment, job.assessment_id)
        return assessment is not None and assessment.state == AssessmentState.PENDING
    return False
