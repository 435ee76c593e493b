"""Tenants and their scheduling policies. A tenant's row exists once anything names the tenant;
its policy columns hold the defaults until an operator stores a policy, which sets updated_at."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.platform.models import Tenant
from gantry.controlplane.platform.rows import get_row
from gantry.controlplane.tenants.policy_rules import TenantPolicySettings


async def find_tenant(session: AsyncSession, tenant_id: str) -> Tenant | None:
    return await session.get(Tenant, tenant_id)


async def get_tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    return await get_row(session, Tenant, tenant_id, "tenant")


async def upsert_tenant_policy(
    session: AsyncSession, settings: TenantPolicySettings, *, updated_by: str, now: dt.datetime
) -> Tenant:
    """Store the whole policy, creating the tenant if nothing named it before."""
    await insert_tenant_if_absent(session, settings.tenant_id, now=now)
    row = await get_tenant(session, settings.tenant_id)
    row.weight = settings.weight
    row.max_queue_depth = settings.max_queue_depth
    row.max_concurrency = settings.max_concurrency
    row.budget_units = settings.budget_units
    row.budget_window_seconds = settings.budget_window_seconds
    row.allowed_priorities = list(settings.allowed_priorities)
    row.updated_at = now
    row.updated_by = updated_by
    await session.flush()
    return row


async def list_tenants(session: AsyncSession, *, after: str, limit: int) -> Sequence[Tenant]:
    query = select(Tenant).where(Tenant.tenant_id > after).order_by(Tenant.tenant_id).limit(limit)
    return (await session.scalars(query)).all()


async def stored_policies(session: AsyncSession) -> list[TenantPolicySettings]:
    """Every policy an operator stored (what the scheduler is sent on each (re)connect)."""
    query = select(Tenant).where(Tenant.updated_at.is_not(None)).order_by(Tenant.tenant_id)
    return [policy_of(row) for row in (await session.scalars(query)).all()]


def policy_of(row: Tenant) -> TenantPolicySettings:
    """The tenant's policy: the stored one, or the defaults its columns were created with."""
    return TenantPolicySettings(
        tenant_id=row.tenant_id,
        weight=row.weight,
        max_queue_depth=row.max_queue_depth,
        max_concurrency=row.max_concurrency,
        budget_units=row.budget_units,
        budget_window_seconds=row.budget_window_seconds,
        allowed_priorities=tuple(sorted(row.allowed_priorities)),
    )


async def insert_tenant_if_absent(
    session: AsyncSession, tenant_id: str, *, now: dt.datetime
) -> None:
    # ON CONFLICT DO NOTHING: two operators (or an operator and CreateApiKey) naming a new tenant
    # at once both succeed instead of one failing on the primary key.
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(Tenant).values(tenant_id=tenant_id, created_at=now)
    await session.execute(statement.on_conflict_do_nothing(index_elements=[Tenant.tenant_id]))
