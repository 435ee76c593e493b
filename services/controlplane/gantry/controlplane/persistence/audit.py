"""The append-only audit trail."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.persistence.models import AuditEvent


async def record_event(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    subject_kind: str,
    subject_id: str,
    now: dt.datetime,
    **detail: Any,
) -> None:
    session.add(
        AuditEvent(
            at=now,
            actor=actor,
            action=action,
            subject_kind=subject_kind,
            subject_id=subject_id,
            detail=detail,
        )
    )
    await session.flush()


async def list_events(
    session: AsyncSession, *, after: int = 0, limit: int = 1000
) -> Sequence[AuditEvent]:
    query = (
        select(AuditEvent)
        .where(AuditEvent.event_id > after)
        .order_by(AuditEvent.event_id)
        .limit(limit)
    )
    return (await session.scalars(query)).all()
