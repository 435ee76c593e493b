"""Brings a deployment's recorded state in line with its residencies: reads them, asks
`health_rules.plan_settle`, and makes its one write. Not through jobs/executor.py: settling is
itself one of the executor's actions (`Settle`), so it applies its own single write."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.health_rules import ResidencyHealth, plan_settle
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState


async def settle_deployment(session: AsyncSession, deployment_id: str, *, now: dt.datetime) -> bool:
    """Move the deployment to the state its residencies say; True when it changed."""
    deployment = await deployments.get_deployment(session, deployment_id)
    settlement = plan_settle(
        DeploymentState(deployment.state),
        deployment.last_failure_reason,
        await read_residency_health(session, deployment_id),
    )
    if settlement is None:
        return False
    if not settlement.walk:
        reason, message = settlement.failure or ("", "")
        await deployments.set_deployment_state(
            session,
            deployment,
            settlement.target,
            now=now,
            failure_reason=reason,
            failure_message=message,
        )
        return True
    return await deployments.move_deployment(
        session, deployment, settlement.target, now=now, failure=settlement.failure
    )


async def read_residency_health(session: AsyncSession, deployment_id: str) -> list[ResidencyHealth]:
    """What `plan_settle` decides on: each residency of the deployment, and its node's state."""
    health: list[ResidencyHealth] = []
    for residency in await deployments.residencies_of(session, deployment_id):
        node = await nodes.get_node(session, residency.node_id)
        health.append(
            ResidencyHealth(
                state=ResidencyState(residency.state),
                # LOADING after losing its host (a crash is recorded), not a first load.
                restarting=residency.state == ResidencyState.LOADING
                and bool(residency.restart_count or residency.last_failure_reason),
                usable_node=node.state != NodeState.DISABLED,
                node_connected=node.state == NodeState.CONNECTED,
                failure_reason=residency.last_failure_reason,
                failure_message=residency.last_failure_message,
            )
        )
    return health


async def settle_node_deployments(session: AsyncSession, node_id: str, *, now: dt.datetime) -> None:
    """After a node's connection changed: every deployment with a residency there."""
    await settle_nodes_deployments(session, [node_id], now=now)


async def settle_nodes_deployments(
    session: AsyncSession, node_ids: Collection[str], *, now: dt.datetime
) -> None:
    """After the connections of several nodes changed (streams that ended together): every
    deployment with a residency on any of them, each once, in id order."""
    if not node_ids:
        return
    for deployment_id in await deployments.deployments_on_nodes(session, node_ids):
        await settle_deployment(session, deployment_id, now=now)
