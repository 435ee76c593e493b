"""The append-only audit trail, numbered in commit order.

An event's `event_id` is the cursor audit watchers resume from, so ids must grow in the order
their transactions commit: a watcher that has read id 10 must never later meet a 9. Events are
therefore held in the session until the unit of work is about to commit (`write_pending`, called
by `Database.transaction`) and inserted then, on PostgreSQL under a transaction-scoped advisory
lock: ids are drawn and committed one transaction at a time. The lock is the transaction's last
one, so it cannot take part in a deadlock. SQLite already commits one writer at a time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.platform.models import AuditEvent

# session.info key: the events a unit of work recorded, written just before it commits.
PENDING_EVENTS = "gantry.audit_pending"
# pg_advisory_xact_lock key that orders audit inserts (the ASCII of "gantry.a" as an int64).
AUDIT_ORDER_LOCK = 0x67616E7472792E61


@dataclasses.dataclass(frozen=True, kw_only=True)
class EventFilter:
    """Optional filters of a listing or a watch; set ones must all match."""

    action: str = ""
    subject_kind: str = ""
    subject_id: str = ""
    since: dt.datetime | None = None


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
    """Record an event with this unit of work: it is written when (and only if) it commits."""
    pending: list[AuditEvent] = session.info.setdefault(PENDING_EVENTS, [])
    pending.append(
        AuditEvent(
            at=now,
            actor=actor,
            action=action,
            subject_kind=subject_kind,
            subject_id=subject_id,
            detail=detail,
        )
    )


async def write_pending(session: AsyncSession) -> int:
    """Insert the events this unit of work recorded, in commit order; returns how many."""
    pending: list[AuditEvent] = session.info.pop(PENDING_EVENTS, [])
    if not pending:
        return 0
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_ORDER_LOCK})
    session.add_all(pending)
    await session.flush()
    return len(pending)


def _filtered(query: Select[Any], where: EventFilter) -> Select[Any]:
    if where.action:
        query = query.where(AuditEvent.action == where.action)
    if where.subject_kind:
        query = query.where(AuditEvent.subject_kind == where.subject_kind)
    if where.subject_id:
        query = query.where(AuditEvent.subject_id == where.subject_id)
    if where.since is not None:
        query = query.where(AuditEvent.at >= where.since)
    return query


async def list_events(
    session: AsyncSession,
    *,
    after: int = 0,
    limit: int = 1000,
    where: EventFilter | None = None,
) -> Sequence[AuditEvent]:
    """Events after the cursor `after`, oldest first, matching `where`."""
    query = select(AuditEvent).where(AuditEvent.event_id > after)
    if where is not None:
        query = _filtered(query, where)
    return (await session.scalars(query.order_by(AuditEvent.event_id).limit(limit))).all()


async def last_event_id(session: AsyncSession) -> int:
    """The newest committed event's id (0 when there is none): a cursor for 'from now on'."""
    query = select(AuditEvent.event_id).order_by(AuditEvent.event_id.desc()).limit(1)
    return (await session.scalar(query)) or 0
