"""The invariants of ARCHITECTURE.md, checked on demand against the database (CheckInvariants)."""

from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.evidence import candidates, probes
from gantry.controlplane.evidence.pipeline_states import AssessmentState
from gantry.controlplane.evidence.probe_transitions import TERMINAL_PROBE_STATES, ProbeState
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import inventory_rules
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform.models import (
    CompatibilityAssessment,
    Node,
    Residency,
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
from gantry.v1 import common_pb2

# How a node's inventory JSON (json_format.MessageToDict) names a host the worker is unloading.
_WORKER_UNLOADING = common_pb2.ResidencyState.Name(common_pb2.RESIDENCY_STATE_UNLOADING)


@dataclass(frozen=True, slots=True)
class InvariantResult:
    name: str
    description: str
    offending_ids: tuple[str, ...]

    @property
    def holds(self) -> bool:
        return not self.offending_ids


@dataclass(frozen=True, slots=True)
class _Rows:
    """What most invariants judge, read once: every node, residency and open job."""

    node_rows: Mapping[str, Node]
    residencies: Sequence[Residency]
    open_jobs: Sequence[ServingJob]


async def check_invariants(session: AsyncSession, *, now: dt.datetime) -> list[InvariantResult]:
    # Deleted nodes too: their rows still hold residencies and jobs to judge.
    every_node = await nodes.list_nodes(session, after="", limit=1_000_000, include_deleted=True)
    rows = _Rows(
        node_rows={n.node_id: n for n in every_node},
        residencies=await deployments.all_residencies(session),
        open_jobs=await jobs.open_jobs(session),
    )
    return [
        await _no_orphan_serving_work(session, rows, now=now),
        _one_resident_per_deployment_node_generation(rows),
        await _ready_deployment_has_connected_resident(session, rows),
        _no_lease_held_by_fenced_generation(rows),
        _no_model_host_without_live_residency(rows),
        await _candidate_only_from_completed_probe(session),
    ]


def _orphan_job(
    job: ServingJob,
    *,
    node: Node | None,
    residency: Residency | None,
    pipeline_work_open: bool,
    now: dt.datetime,
) -> bool:
    """Whether an open job outlives its lease, its residency, or the work it was queued for."""
    if job.state in (JobState.LEASED, JobState.RUNNING):
        return job.lease_expires_at is not None and job.lease_expires_at < now
    if job.state != JobState.QUEUED:
        return False
    if job.job_type in jobs.PIPELINE_JOB_TYPES:
        # An inspection or probe job waits only for work still wanted, on a usable node.
        return not pipeline_work_open or (node is not None and node.state == NodeState.DISABLED)
    if residency is None or residency.state == ResidencyState.COLD:
        return True
    if node is not None and node.state == NodeState.DISABLED:
        return job.job_type != JobType.UNLOAD
    return False


def _allocated_on_disabled_node(residency: Residency, node: Node | None) -> bool:
    return (
        node is not None
        and node.state == NodeState.DISABLED
        and residency.state in (ResidencyState.LOADING, ResidencyState.RESIDENT)
    )


async def _no_orphan_serving_work(
    session: AsyncSession, rows: _Rows, *, now: dt.datetime
) -> InvariantResult:
    residency_by_id = {r.residency_id: r for r in rows.residencies}
    orphans: list[str] = []
    for job in rows.open_jobs:
        queued_pipeline_job = (
            job.state == JobState.QUEUED and job.job_type in jobs.PIPELINE_JOB_TYPES
        )
        orphan = _orphan_job(
            job,
            node=rows.node_rows.get(job.node_id),
            residency=residency_by_id.get(job.residency_id or ""),
            pipeline_work_open=queued_pipeline_job and await _pipeline_work_open(session, job),
            now=now,
        )
        if orphan:
            orphans.append(f"job:{job.job_id}")
    orphans.extend(
        f"residency:{residency.residency_id}"
        for residency in rows.residencies
        if _allocated_on_disabled_node(residency, rows.node_rows.get(residency.node_id))
    )
    return InvariantResult(
        "no_orphan_serving_work",
        "no queued or leased job outlives its lease or its residency; no residency "
        "allocation on a disabled node",
        tuple(sorted(orphans)),
    )


def _one_resident_per_deployment_node_generation(rows: _Rows) -> InvariantResult:
    per_slot = collections.Counter(
        (r.deployment_id, r.node_id, r.generation)
        for r in rows.residencies
        if r.state == ResidencyState.RESIDENT
    )
    duplicates = [
        f"deployment:{d}/node:{n}/generation:{g}"
        for (d, n, g), count in per_slot.items()
        if count > 1
    ]
    return InvariantResult(
        "one_resident_per_deployment_node_generation",
        "at most one RESIDENT residency per (deployment, node, generation)",
        tuple(sorted(duplicates)),
    )


async def _ready_deployment_has_connected_resident(
    session: AsyncSession, rows: _Rows
) -> InvariantResult:
    ready_without_resident: list[str] = []
    for deployment in await deployments.deployments_in_states(session, [DeploymentState.READY]):
        serving = any(
            r.deployment_id == deployment.deployment_id
            and r.state == ResidencyState.RESIDENT
            and (node := rows.node_rows.get(r.node_id)) is not None
            and node.state == NodeState.CONNECTED
            for r in rows.residencies
        )
        if not serving:
            ready_without_resident.append(f"deployment:{deployment.deployment_id}")
    return InvariantResult(
        "ready_deployment_has_connected_resident",
        "no READY deployment without a RESIDENT residency on a connected node",
        tuple(sorted(ready_without_resident)),
    )


def _no_lease_held_by_fenced_generation(rows: _Rows) -> InvariantResult:
    fenced = [
        f"job:{job.job_id}"
        for job in rows.open_jobs
        if job.state in (JobState.LEASED, JobState.RUNNING)
        and (node := rows.node_rows.get(job.node_id)) is not None
        and job.generation != node.generation
    ]
    return InvariantResult(
        "no_lease_held_by_fenced_generation",
        "no leased job belongs to a generation other than its node's current one",
        tuple(sorted(fenced)),
    )


def _no_model_host_without_live_residency(rows: _Rows) -> InvariantResult:
    """What a connected node's last applied inventory shows running must have a live record: a
    host whose residency is COLD (or which has none on that node) is custody nobody holds (a late
    inventory that marked its residency gone and loaded it again, say). A record a newer worker
    message changed than that inventory is not judged by it (a host the next report drops), and
    a host the worker is unloading is on its way out."""
    records = collections.defaultdict(list)
    for residency in rows.residencies:
        records[(residency.node_id, residency.deployment_id)].append(residency)
    unheld = [
        f"node:{node.node_id}/deployment:{deployment_id}"
        for node in rows.node_rows.values()
        if node.state == NodeState.CONNECTED and node.deleted_at is None
        for deployment_id in _hosts_shown(node.inventory, records, node_id=node.node_id)
    ]
    return InvariantResult(
        "no_model_host_without_live_residency",
        "no host a connected node's inventory shows runs for a COLD or absent residency",
        tuple(sorted(unheld)),
    )


def _hosts_shown(
    node_inventory: Mapping[str, Any] | None,
    records: Mapping[tuple[str, str], Sequence[Residency]],
    *,
    node_id: str,
) -> list[str]:
    """The deployments the node's inventory shows running without a live record there."""
    shown = inventory_rules.shown_stamp(node_inventory)
    last = (node_inventory or {}).get("inventory") or {}
    held = [
        resident.get("deploymentId", "")
        for resident in last.get("residents", [])
        if resident.get("state") != _WORKER_UNLOADING
    ]
    return [
        deployment_id
        for deployment_id in held
        if not any(
            r.state != ResidencyState.COLD
            or inventory_rules.older(shown, inventory_rules.stamp_of(r))
            for r in records.get((node_id, deployment_id), ())
        )
    ]


async def _candidate_only_from_completed_probe(session: AsyncSession) -> InvariantResult:
    early_candidates = []
    for candidate in await candidates.all_candidates(session):
        probe = await probes.get_probe(session, candidate.probe_id)
        if probe.state != ProbeState.COMPLETED or probe.candidate_id != candidate.candidate_id:
            early_candidates.append(f"candidate:{candidate.candidate_id}")
    return InvariantResult(
        "candidate_only_from_completed_probe",
        "every deployment candidate comes from a COMPLETED probe that names it: no active "
        "probe is ever shown as a candidate",
        tuple(sorted(early_candidates)),
    )


async def _pipeline_work_open(session: AsyncSession, job: ServingJob) -> bool:
    """Whether the assessment or probe a pipeline job serves still waits for it."""
    if job.probe_id:
        probe = await session.get(RuntimeProbe, job.probe_id)
        return probe is not None and probe.state not in TERMINAL_PROBE_STATES
    if job.assessment_id:
        assessment = await session.get(CompatibilityAssessment, job.assessment_id)
        return assessment is not None and assessment.state == AssessmentState.PENDING
    return False
