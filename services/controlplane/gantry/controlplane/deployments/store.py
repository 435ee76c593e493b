"""Deployments (a capability served from an artifact set) and their residencies on nodes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError, not_found
from gantry.common.ids import new_id
from gantry.controlplane.deployments import bindings
from gantry.controlplane.observability import state_history
from gantry.controlplane.platform.models import Deployment, Residency
from gantry.controlplane.platform.rows import get_row
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    ResidencyState,
    shortest_path,
)
from gantry.controlplane.platform.transitions import compare_and_set


async def create_deployment(
    session: AsyncSession,
    *,
    capability: str,
    artifact_set_id: str | None,
    adapter: dict[str, Any],
    environment_id: str,
    replicas: int,
    now: dt.datetime,
    approval_id: str | None = None,
    profile_id: str | None = None,
    candidate_id: str | None = None,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    placement_policy: str = "BIN_PACK",
    placement_constraints: dict[str, Any] | None = None,
    origin: str = "pipeline",
) -> Deployment:
    """A PENDING deployment; the gate it passed (approval, profile, candidate) when it has one.

    Autoscale bounds not given are `replicas` (no autoscale); they are stored explicit.
    """
    row = Deployment(
        deployment_id=new_id(),
        capability=capability,
        artifact_set_id=artifact_set_id,
        adapter=adapter,
        environment_id=environment_id,
        state=DeploymentState.PENDING,
        replicas=replicas,
        min_replicas=replicas if min_replicas is None else min_replicas,
        max_replicas=replicas if max_replicas is None else max_replicas,
        placement_policy=placement_policy,
        placement_constraints=placement_constraints or {},
        last_failure_reason="",
        last_failure_message="",
        created_at=now,
        updated_at=now,
        approval_id=approval_id,
        profile_id=profile_id,
        candidate_id=candidate_id,
        origin=origin,
    )
    await state_history.add_created(
        session,
        row,
        subject_kind="deployment",
        subject_id=row.deployment_id,
        state=row.state,
        at=now,
    )
    return row


async def get_deployment(session: AsyncSession, deployment_id: str) -> Deployment:
    return await get_row(session, Deployment, deployment_id, "deployment")


async def get_live_deployment(session: AsyncSession, deployment_id: str) -> Deployment:
    """The deployment for an operation that acts on it (bind, unload, restart, scale, a health
    check, an embed by id): DEPLOYMENT_DELETED once deleted. Reads (GetDeployment) still see it."""
    return check_live(await get_deployment(session, deployment_id))


def check_live(row: Deployment) -> Deployment:
    """The row, unless it was deleted (DEPLOYMENT_DELETED: no new work may name it)."""
    if row.deleted_at is not None:
        raise GantryError(
            "DEPLOYMENT_DELETED",
            f"deployment {row.deployment_id} was deleted; deploy its approval again for a new one",
            deployment_id=row.deployment_id,
        )
    return row


async def lock_deployment(session: AsyncSession, deployment_id: str) -> Deployment:
    """The row read fresh under an exclusive lock (PostgreSQL; SQLite writers are serialised):
    a delete and a restart or scale of the same deployment cannot both commit on stale reads."""
    row = await session.scalar(
        select(Deployment)
        .where(Deployment.deployment_id == deployment_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if row is None:
        raise not_found("deployment", deployment_id)
    return row


async def list_deployments(
    session: AsyncSession, *, after: str, limit: int, include_deleted: bool = False
) -> Sequence[Deployment]:
    query = select(Deployment).where(Deployment.deployment_id > after)
    if not include_deleted:
        query = query.where(Deployment.deleted_at.is_(None))
    return (await session.scalars(query.order_by(Deployment.deployment_id).limit(limit))).all()


async def mark_deployment_deleted(
    session: AsyncSession, deployment: Deployment, *, now: dt.datetime
) -> None:
    """Only marks the row: its residencies, jobs, history and audit trail stay."""
    await _write_fields(session, deployment, now=now, deleted_at=now)


async def set_scale(
    session: AsyncSession,
    deployment: Deployment,
    *,
    replicas: int,
    min_replicas: int,
    max_replicas: int,
    now: dt.datetime,
) -> None:
    """An operator's scale: replicas and bounds together, compare-and-set on (state, replicas)
    as read, like `set_replicas` (a concurrent autoscale or unload loses, never overwrites)."""
    await set_replicas(session, deployment, replicas=replicas, now=now)
    deployment.min_replicas = min_replicas
    deployment.max_replicas = max_replicas
    await session.flush()


async def clear_load_failures(
    session: AsyncSession, deployment: Deployment, *, now: dt.datetime
) -> None:
    """A fresh start (RestartDeployment): no failed loads counted, no last failure shown."""
    await _write_fields(
        session,
        deployment,
        now=now,
        load_failure_count=0,
        last_failure_reason="",
        last_failure_message="",
    )


async def _write_fields(
    session: AsyncSession, deployment: Deployment, *, now: dt.datetime, **fields: object
) -> None:
    """Fields that are not its state (no compare-and-set: no table governs them), stamped."""
    for name, value in fields.items():
        setattr(deployment, name, value)
    deployment.updated_at = now
    await session.flush()


async def set_deployment_state(
    session: AsyncSession,
    deployment: Deployment,
    target: DeploymentState,
    *,
    now: dt.datetime,
    failure_reason: str = "",
    failure_message: str = "",
) -> None:
    values: dict[str, Any] = {"updated_at": now}
    if failure_reason:
        values.update(last_failure_reason=failure_reason, last_failure_message=failure_message)
    await compare_and_set(
        session,
        Deployment,
        deployment.deployment_id,
        machine="deployment",
        expected=deployment.state,
        target=target,
        **values,
    )
    await session.refresh(deployment)
    # Every state a deployment takes is written here, so the capability binding follows it in
    # the same transaction: a pending deployment takes over exactly when it becomes READY.
    await bindings.follow_deployment_state(
        session, deployment_id=deployment.deployment_id, state=target, now=now
    )


async def set_replicas(
    session: AsyncSession, deployment: Deployment, *, replicas: int, now: dt.datetime
) -> None:
    """Compare-and-set on (state, replicas) as read: a concurrent unload or scale loses this
    (a typed conflict `retry_on_conflict` retries on fresh rows), never overwrites."""
    result = await session.execute(
        update(Deployment)
        .where(
            Deployment.deployment_id == deployment.deployment_id,
            Deployment.state == deployment.state,
            Deployment.replicas == deployment.replicas,
        )
        .values(replicas=replicas, updated_at=now)
        .execution_options(synchronize_session="fetch")
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"deployment {deployment.deployment_id} changed while its replicas were set",
            machine="deployment",
            expected=deployment.state,
            target=deployment.state,
            conflict="true",
        )
    await session.refresh(deployment)


async def create_residency(
    session: AsyncSession, *, deployment_id: str, node_id: str, now: dt.datetime
) -> Residency:
    row = Residency(
        residency_id=new_id(),
        deployment_id=deployment_id,
        node_id=node_id,
        state=ResidencyState.COLD,
        generation=0,
        pid=0,
        updated_at=now,
    )
    await state_history.add_created(
        session,
        row,
        subject_kind="residency",
        subject_id=row.residency_id,
        state=row.state,
        at=now,
        deployment_id=deployment_id,
    )
    return row


async def get_residency(session: AsyncSession, residency_id: str) -> Residency:
    return await get_row(session, Residency, residency_id, "residency")


async def residencies_of(session: AsyncSession, deployment_id: str) -> Sequence[Residency]:
    query = (
        select(Residency)
        .where(Residency.deployment_id == deployment_id)
        .order_by(Residency.residency_id)
    )
    return (await session.scalars(query)).all()


async def residencies_on_node(session: AsyncSession, node_id: str) -> Sequence[Residency]:
    query = select(Residency).where(Residency.node_id == node_id).order_by(Residency.residency_id)
    return (await session.scalars(query)).all()


async def deployments_on_nodes(session: AsyncSession, node_ids: Collection[str]) -> list[str]:
    """The deployments with a residency (in any state) on any of the nodes, in id order."""
    query = (
        select(Residency.deployment_id)
        .where(Residency.node_id.in_(sorted(set(node_ids))))
        .distinct()
        .order_by(Residency.deployment_id)
    )
    return list((await session.scalars(query)).all())


async def all_live_residencies(session: AsyncSession) -> Sequence[Residency]:
    query = select(Residency).where(Residency.state != ResidencyState.COLD)
    return (await session.scalars(query)).all()


async def set_residency_state(
    session: AsyncSession,
    residency: Residency,
    target: ResidencyState,
    *,
    now: dt.datetime,
    **values: Any,
) -> None:
    await compare_and_set(
        session,
        Residency,
        residency.residency_id,
        machine="residency",
        expected=residency.state,
        target=target,
        updated_at=now,
        **values,
    )
    await session.refresh(residency)


async def move_deployment(
    session: AsyncSession,
    deployment: Deployment,
    target: DeploymentState,
    *,
    now: dt.datetime,
    failure: tuple[str, str] | None = None,
) -> bool:
    """Walk the table's shortest path to `target`, one compare-and-set per step; True if moved.
    `failure` is the (reason, message) the walk ends with, if it ends in one."""
    if deployment.state == target:
        return False
    path = shortest_path("deployment", deployment.state, target)
    for index, step in enumerate(path):
        # The failure belongs to the step that ends the walk: the history shows it once, where
        # the deployment arrived, not on each state it passed through.
        reason, message = failure if failure and index == len(path) - 1 else ("", "")
        await set_deployment_state(
            session,
            deployment,
            DeploymentState(step),
            now=now,
            failure_reason=reason,
            failure_message=message,
        )
    return True


async def deployments_in_states(
    session: AsyncSession, states: Iterable[DeploymentState]
) -> Sequence[Deployment]:
    # A deleted deployment is UNLOADED or FAILED and stays so; the filter keeps every loop
    # (reconciler, autoscaler, scheduler snapshots) off it whatever the states asked for.
    query = select(Deployment).where(
        Deployment.state.in_(list(states)), Deployment.deleted_at.is_(None)
    )
    return (await session.scalars(query.order_by(Deployment.created_at))).all()


async def all_residencies(session: AsyncSession) -> Sequence[Residency]:
    return (await session.scalars(select(Residency))).all()
