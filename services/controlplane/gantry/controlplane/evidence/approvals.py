"""Production approvals: who let which LAB_READY candidate serve, and why. Append-only."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.ids import new_id
from gantry.controlplane.platform.models import ProductionApproval
from gantry.controlplane.platform.rows import get_row


async def create_approval(
    session: AsyncSession,
    *,
    candidate_id: str,
    profile_id: str,
    approved_by: str,
    reason: str,
    now: dt.datetime,
) -> ProductionApproval:
    row = ProductionApproval(
        approval_id=new_id(),
        candidate_id=candidate_id,
        profile_id=profile_id,
        approved_by=approved_by,
        reason=reason,
        created_at=now,
    )
    session.add(row)
    await session.flush()
    return row


async def get_approval(session: AsyncSession, approval_id: str) -> ProductionApproval:
    return await get_row(session, ProductionApproval, approval_id, "approval")


async def approval_for_candidate(
    session: AsyncSession, candidate_id: str
) -> ProductionApproval | None:
    query = select(ProductionApproval).where(ProductionApproval.candidate_id == candidate_id)
    return (await session.scalars(query)).first()


async def list_approvals(
    session: AsyncSession, *, after: str, limit: int
) -> Sequence[ProductionApproval]:
    query = (
        select(ProductionApproval)
        .where(ProductionApproval.approval_id > after)
        .order_by(ProductionApproval.approval_id)
        .limit(limit)
    )
    return (await session.scalars(query)).all()
