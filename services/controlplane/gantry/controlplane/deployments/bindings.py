"""Capability bindings: a capability names exactly one deployment; routing reads nothing else.

A binding's `deployment_id` is the deployment clients reach. A deployment bound while another one
serves waits as `pending_deployment_id` and takes over in the very transaction that makes it READY
(`follow_deployment_state`, called wherever a deployment's state is written), so there is no moment
at which the capability names a deployment that cannot serve while the old one still could.
Every change is conditional on the row as it was read: two writers cannot both win.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError, not_found
from gantry.controlplane.platform.events import BindingMoved, record
from gantry.controlplane.platform.models import CapabilityBinding
from gantry.controlplane.platform.state_machines import DeploymentState

# A pending deployment in one of these states will never serve: the binding stops waiting for it.
_NEVER_SERVES = frozenset(
    {DeploymentState.FAILED, DeploymentState.UNLOADING, DeploymentState.UNLOADED}
)


def _conflict(capability: str) -> GantryError:
    return GantryError(
        "INVALID_STATE_TRANSITION",
        f"the binding of capability {capability!r} changed concurrently",
        machine="capability_binding",
        conflict="true",
    )


async def get_binding(session: AsyncSession, capability: str) -> CapabilityBinding | None:
    return await session.get(CapabilityBinding, capability)


async def require_binding(session: AsyncSession, capability: str) -> CapabilityBinding:
    row = await get_binding(session, capability)
    if row is None:
        raise not_found("capability binding", capability)
    return row


async def list_bindings(
    session: AsyncSession, *, after: str, limit: int
) -> Sequence[CapabilityBinding]:
    query = (
        select(CapabilityBinding)
        .where(CapabilityBinding.capability > after)
        .order_by(CapabilityBinding.capability)
        .limit(limit)
    )
    return (await session.scalars(query)).all()


async def bound_deployment_ids(session: AsyncSession, deployment_ids: Collection[str]) -> set[str]:
    """Those of the deployments that a binding names as the one clients reach."""
    if not deployment_ids:
        return set()
    rows = await session.scalars(
        select(CapabilityBinding.deployment_id).where(
            CapabilityBinding.deployment_id.in_(list(deployment_ids))
        )
    )
    return {row for row in rows if row is not None}


async def bind(
    session: AsyncSession,
    *,
    capability: str,
    deployment_id: str,
    serves_now: bool,
    now: dt.datetime,
) -> CapabilityBinding:
    """Bind capability -> deployment.

    No binding yet (or one naming nothing): the deployment is bound at once; it serves once READY.
    A binding naming another deployment: `serves_now` (the deployment is READY) moves it at once,
    otherwise the deployment becomes pending and takes over when it becomes READY.
    """
    row = await get_binding(session, capability)
    if row is None:
        session.add(
            CapabilityBinding(
                capability=capability,
                deployment_id=deployment_id,
                pending_deployment_id=None,
                updated_at=now,
            )
        )
        try:
            await session.flush()
        except IntegrityError:
            raise _conflict(capability) from None  # another writer bound it first: retry
        record(session, BindingMoved())
        return await require_binding(session, capability)
    current = row.deployment_id
    if current == deployment_id:
        if row.pending_deployment_id is None:
            return row
        # Bound again to the one that serves: the operator no longer wants the pending one.
        values: dict[str, object] = {"pending_deployment_id": None}
    elif current is None or serves_now:
        values = {"deployment_id": deployment_id, "pending_deployment_id": None}
    else:
        values = {"pending_deployment_id": deployment_id}
    result = await session.execute(
        update(CapabilityBinding)
        .where(
            CapabilityBinding.capability == capability,
            CapabilityBinding.deployment_id.is_(None)
            if current is None
            else CapabilityBinding.deployment_id == current,
        )
        .values(updated_at=now, **values)
        .execution_options(synchronize_session="fetch")
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise _conflict(capability)
    record(session, BindingMoved())
    await session.refresh(row)
    return row


async def follow_deployment_state(
    session: AsyncSession, *, deployment_id: str, state: str, now: dt.datetime
) -> None:
    """Keep bindings in step with a deployment state just written (same transaction).

    READY: a binding waiting for it moves to it. FAILED/UNLOADING/UNLOADED: a binding waiting for
    it stops waiting (the bound deployment, if any, keeps the capability).
    """
    if state == DeploymentState.READY:
        values: dict[str, object] = {"deployment_id": deployment_id, "pending_deployment_id": None}
    elif state in _NEVER_SERVES:
        values = {"pending_deployment_id": None}
    else:
        return
    result = await session.execute(
        update(CapabilityBinding)
        .where(CapabilityBinding.pending_deployment_id == deployment_id)
        .values(updated_at=now, **values)
        .execution_options(synchronize_session="fetch")
    )
    if result.rowcount:  # type: ignore[attr-defined]
        record(session, BindingMoved())


async def unbind_deployment(
    session: AsyncSession, *, deployment_id: str, now: dt.datetime
) -> list[str]:
    """Forget a deployment in every binding (it is being deleted); the capabilities changed.

    A binding that names only it is removed; one with a pending deployment keeps waiting for
    that one (it takes over when READY, as ever); a binding waiting for it stops waiting.
    """
    rows = (
        await session.scalars(
            select(CapabilityBinding)
            .where(
                (CapabilityBinding.deployment_id == deployment_id)
                | (CapabilityBinding.pending_deployment_id == deployment_id)
            )
            .order_by(CapabilityBinding.capability)
        )
    ).all()
    for row in rows:
        if row.pending_deployment_id == deployment_id:
            row.pending_deployment_id = None
        if row.deployment_id == deployment_id:
            row.deployment_id = None
        if row.deployment_id is None and row.pending_deployment_id is None:
            await session.delete(row)
        else:
            row.updated_at = now
    if rows:
        await session.flush()
        record(session, BindingMoved())
    return [row.capability for row in rows]
