"""Brings a deployment's recorded state in line with its residencies (deployments/health_rules)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.health_rules import ResidencyHealth, settled_state
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.inventory_rules import CRASH_LOOP
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState


async def settle_deployment(session: AsyncSession, deployment_id: str, *, now: dt.datetime) -> bool:
    """Move the deployment to the state its residencies say; True when it changed."""
    deployment = await deployments.get_deployment(session, deployment_id)
    health: list[ResidencyHealth] = []
    reason, message = "", ""
    for residency in await deployments.residencies_of(session, deployment_id):
        node = await nodes.get_node(session, residency.node_id)
        # LOADING after losing its host (a crash is recorded), not a first load.
        restarting = residency.state == ResidencyState.LOADING and bool(
            residency.restart_count or residency.last_failure_reason
        )
        health.append(
            ResidencyHealth(
                state=ResidencyState(residency.state),
                restarting=restarting,
                usable_node=node.state != NodeState.DISABLED,
                node_connected=node.state == NodeState.CONNECTED,
            )
        )
        if residency.last_failure_reason and residency.state != ResidencyState.COLD:
            # The worst reason wins what the deployment shows: a crash loop over a single crash.
            if not reason or residency.last_failure_reason == CRASH_LOOP:
                reason, message = residency.last_failure_reason, residency.last_failure_message
    target = settled_state(DeploymentState(deployment.state), health)
    if (
        target == deployment.state == DeploymentState.DEGRADED
        and reason
        and (reason != deployment.last_failure_reason)
    ):
        # Still degraded, for a worse (or another) reason: say which.
        await deployments.set_deployment_state(
            session, deployment, target, now=now, failure_reason=reason, failure_message=message
        )
        return True
    if target == deployment.state:
        return False
    if target == DeploymentState.DEGRADED and not reason:
        reason, message = "RUNTIME_CRASHED", "a model host is being restarted"
    return await deployments.move_deployment(
        session,
        deployment,
        target,
        now=now,
        failure=(reason, message) if target == DeploymentState.DEGRADED else None,
    )


async def settle_node_deployments(session: AsyncSession, node_id: str, *, now: dt.datetime) -> None:
    """After a node's connection changed: every deployment with a residency there."""
    for deployment_id in sorted(
        {r.deployment_id for r in await deployments.residencies_on_node(session, node_id)}
    ):
        await settle_deployment(session, deployment_id, now=now)
