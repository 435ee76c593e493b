"""Draining a deployment's surplus replicas: the autoscaler's scale down and an operator's.

A surplus replica that serves drains first (deployments/drain.py): DRAINING, routed no new call,
until the calls it runs have finished or the default drain deadline passes; then it goes through
the same UNLOAD job path an unload uses, so custody rules do not change. A load still under way
is stopped at once, as before. Which residencies leave is decided by
`autoscale_rules.surplus_replicas` (deterministic).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.autoscale_rules import ServingReplica, surplus_replicas
from gantry.controlplane.deployments.drain import begin_drain
from gantry.controlplane.deployments.drain_rules import DEFAULT_DRAIN_DEADLINE_S
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform.models import Deployment, Residency
from gantry.controlplane.platform.state_machines import NodeState, ResidencyState


async def drain_surplus(
    session: AsyncSession,
    deployment: Deployment,
    *,
    keep: int,
    hub: WorkerHub,
    now: dt.datetime,
) -> list[Residency]:
    """Each surplus residency draining (RESIDENT), or UNLOADING with an UNLOAD job (a load under
    way; COLD at once where its worker is away: nothing runs there). Residencies on disabled
    nodes are not replicas."""
    rows = {
        r.residency_id: r
        for r in await deployments.residencies_of(session, deployment.deployment_id)
        if r.state != ResidencyState.COLD
        and (await nodes.get_node(session, r.node_id)).state != NodeState.DISABLED
    }
    replicas = [
        ServingReplica(residency_id=r.residency_id, state=r.state, updated_at=r.updated_at)
        for r in rows.values()
    ]
    drained: list[Residency] = []
    deadline_at = now + dt.timedelta(seconds=DEFAULT_DRAIN_DEADLINE_S)
    for residency_id in surplus_replicas(replicas, keep=keep):
        residency = rows[residency_id]
        for job in await jobs.open_jobs_for_residency(session, residency_id):
            await jobs.cancel_job(session, job, now=now)  # a load under way, a health check
        await begin_drain(
            session,
            residency,
            deadline_at=deadline_at,
            worker_connected=hub.get(residency.node_id) is not None,
            now=now,
        )
        drained.append(residency)
    return drained
