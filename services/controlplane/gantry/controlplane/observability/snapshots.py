"""Read-only projections for operators: the registry, the debug view and a node's inventory.

Every function here only reads (a snapshot can never edit state); the caller gives the session,
so one snapshot is one transaction. On PostgreSQL `consistent_read` raises that transaction to
REPEATABLE READ, so all its statements see one moment; SQLite's transactions already do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import bindings
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.health_rules import LIVE_STATES
from gantry.controlplane.deployments.placement import missing_replicas
from gantry.controlplane.deployments.residency_charges import read_charges
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.capabilities import domains_from_json
from gantry.controlplane.nodes.gpu_rules import stored_reading
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import Deployment, Residency, ServingJob
from gantry.controlplane.platform.state_machines import JobState, JobType, NodeState, ResidencyState
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg

# A snapshot is one read of the whole registry; past this many rows of one kind it is cut (and
# a List RPC pages through the rest). Hundreds of nodes fit many times over.
SNAPSHOT_ROW_LIMIT = 100_000
DEFAULT_RECENT_FAILURES = 20
MAX_RECENT_FAILURES = 200


async def consistent_read(session: AsyncSession) -> None:
    """Call first in the transaction: every later statement reads the same snapshot."""
    if session.get_bind().dialect.name == "postgresql":
        await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})


async def registry_snapshot(
    session: AsyncSession,
    *,
    now: dt.datetime,
    capabilities: Iterable[cp.CapabilityHealth] = (),
) -> cp.RegistrySnapshot:
    node_rows = await nodes.list_nodes(session, after="", limit=SNAPSHOT_ROW_LIMIT)
    deployment_rows = await deployments.list_deployments(
        session, after="", limit=SNAPSHOT_ROW_LIMIT
    )
    binding_rows = await bindings.list_bindings(session, after="", limit=SNAPSHOT_ROW_LIMIT)
    residency_rows = sorted(
        await deployments.all_residencies(session), key=lambda r: r.residency_id
    )
    bound = {b.deployment_id for b in binding_rows if b.deployment_id}
    by_deployment: dict[str, list[Residency]] = {}
    for residency in residency_rows:
        by_deployment.setdefault(residency.deployment_id, []).append(residency)
    charges = await read_charges(session, [d.deployment_id for d in deployment_rows])
    evidence_jobs = await _last_jobs(session)
    gates = {d.deployment_id: d for d in deployment_rows}
    records = []
    for residency in residency_rows:
        charge = charges.get(residency.deployment_id)
        gate = gates.get(residency.deployment_id)
        last = evidence_jobs.get(residency.residency_id, {})
        records.append(
            cp.ResidencyRecord(
                residency=convert.residency(residency),
                envelope=charge.claims() if charge is not None else [],
                slots=charge.slots if charge is not None else 0,
                approval_id=(gate.approval_id or "") if gate else "",
                profile_id=(gate.profile_id or "") if gate else "",
                candidate_id=(gate.candidate_id or "") if gate else "",
                last_load_job_id=last.get(JobType.LOAD, ""),
                last_unload_job_id=last.get(JobType.UNLOAD, ""),
            )
        )
    # Health is kept in memory until its window empties: a capability that no deployment
    # serves and no binding names any more (deleted) is not shown as if it still existed.
    existing = {d.capability for d in deployment_rows} | {b.capability for b in binding_rows}
    return cp.RegistrySnapshot(
        taken_at=convert.timestamp(now),
        nodes=[convert.node(n) for n in node_rows],
        deployments=[
            convert.deployment(
                d, by_deployment.get(d.deployment_id, []), bound=d.deployment_id in bound
            )
            for d in deployment_rows
        ],
        bindings=[convert.binding(b) for b in binding_rows],
        residencies=records,
        capabilities=[health for health in capabilities if health.capability in existing],
        last_event_id=await audit.last_event_id(session),
        # Each node's GPUs as its heartbeat last read them, external processes marked.
        node_gpus=[stored_reading(n.node_id, n.inventory) for n in node_rows],
    )


async def _last_jobs(session: AsyncSession) -> dict[str, dict[JobType, str]]:
    """The newest LOAD and UNLOAD job of each residency: the records of its evidence."""
    query = (
        select(ServingJob.residency_id, ServingJob.job_type, ServingJob.job_id)
        .where(
            ServingJob.residency_id.is_not(None),
            ServingJob.job_type.in_([JobType.LOAD, JobType.UNLOAD]),
        )
        .order_by(ServingJob.created_at, ServingJob.job_id)
    )
    last: dict[str, dict[JobType, str]] = {}
    for residency_id, job_type, job_id in (await session.execute(query)).all():
        last.setdefault(residency_id or "", {})[JobType(job_type)] = job_id
    return last


async def debug_parts(session: AsyncSession, *, recent_failures: int) -> cp.DebugSnapshot:
    """Everything of the debug snapshot the database holds (the registry is set by the caller,
    from the same transaction; the queue comes from the scheduler)."""
    limit = min(recent_failures or DEFAULT_RECENT_FAILURES, MAX_RECENT_FAILURES)
    failed = (
        await session.scalars(
            select(ServingJob)
            .where(ServingJob.state == JobState.FAILED)
            .order_by(ServingJob.updated_at.desc(), ServingJob.job_id.desc())
            .limit(limit)
        )
    ).all()
    deployment_failures = [
        cp.DeploymentFailure(
            deployment_id=d.deployment_id,
            capability=d.capability,
            failure=common_pb2.Failure(
                reason=d.last_failure_reason, message=d.last_failure_message
            ),
        )
        for d in (
            await session.scalars(
                select(Deployment)
                .where(Deployment.last_failure_reason != "")
                .order_by(Deployment.updated_at.desc())
                .limit(limit)
            )
        ).all()
    ]
    return cp.DebugSnapshot(
        health_checks=[convert.serving_job(j) for j in await _latest_health_checks(session)],
        recovery=await _recovery_state(session),
        recent_failed_jobs=[convert.serving_job(j) for j in failed],
        deployment_failures=deployment_failures,
    )


async def _latest_health_checks(session: AsyncSession) -> list[ServingJob]:
    query = (
        select(ServingJob)
        .where(ServingJob.job_type == JobType.HEALTH, ServingJob.residency_id.is_not(None))
        .order_by(ServingJob.created_at, ServingJob.job_id)
    )
    latest: dict[str, ServingJob] = {}
    for job in (await session.scalars(query)).all():
        latest[job.residency_id or ""] = job
    return sorted(latest.values(), key=lambda j: j.residency_id or "")


async def _recovery_state(session: AsyncSession) -> cp.RecoveryState:
    stale = [
        n.node_id
        for n in await nodes.list_nodes(session, after="", limit=SNAPSHOT_ROW_LIMIT)
        if n.state == NodeState.DISCONNECTED
    ]
    uncertain = sorted(
        r.residency_id
        for r in await deployments.all_live_residencies(session)
        if r.state == ResidencyState.UNCERTAIN
    )
    pending = sorted(await jobs.open_jobs(session), key=lambda j: (j.created_at, j.job_id))
    missing = [
        d.deployment_id
        for d in await deployments.deployments_in_states(session, LIVE_STATES)
        if await missing_replicas(session, d)
    ]
    return cp.RecoveryState(
        stale_node_ids=stale,
        uncertain_residency_ids=uncertain,
        pending_jobs=[convert.serving_job(j) for j in pending],
        pending_deployment_ids=sorted(missing),
    )


async def node_inventory(session: AsyncSession, node_id: str) -> cp.NodeInventory:
    """The inventory of the node's last Hello or InventoryReport, split by whether a residency
    here accounts for each model host (NOT_FOUND for an unknown node)."""
    node = await nodes.get_node(session, node_id)
    stored: dict[str, Any] = node.inventory or {}
    inventory = json_format.ParseDict(
        stored.get("inventory", {}), wg.Inventory(), ignore_unknown_fields=True
    )
    accounted = {
        r.deployment_id
        for r in await deployments.residencies_on_node(session, node_id)
        if r.state != ResidencyState.COLD
    }
    managed: Sequence[wg.ResidentModel] = [
        m for m in inventory.residents if m.deployment_id in accounted
    ]
    unmanaged = [m for m in inventory.residents if m.deployment_id not in accounted]
    gpus = stored_reading(node.node_id, stored)
    return cp.NodeInventory(
        node_id=node.node_id,
        generation=inventory.generation or node.generation,
        last_seen_at=convert.timestamp(node.last_seen_at),
        managed=managed,
        unmanaged=unmanaged,
        unmanaged_gpu_processes_unavailable=gpus.unavailable,
        environments=[
            json_format.ParseDict(e, wg.RuntimeEnvironment(), ignore_unknown_fields=True)
            for e in stored.get("environments", [])
        ],
        resource_domains=domains_from_json(stored.get("domains", [])),
        adapters=list(stored.get("adapters", [])),
        gpus=gpus,
    )
