"""The state history: one append-only row per state a deployment, residency, node or job takes.

Rows are written by the function that makes the change (`compare_and_set`, the `create_*`
functions, a node's generation claim), in the same transaction, so history and state commit or
roll back together. Nothing here runs per inference request: only recorded machine changes write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.platform.models import StateTransition

# The machines whose changes are kept; the evidence pipeline's have their own records.
RECORDED_KINDS = ("deployment", "residency", "node", "job")

# Where a change carries its failure (reason column, message column), per machine.
_FAILURE_COLUMNS: Mapping[str, tuple[str, str]] = {
    "deployment": ("last_failure_reason", "last_failure_message"),
    "residency": ("last_failure_reason", "last_failure_message"),
    "job": ("failure_reason", "failure_message"),
    "node": ("", "disabled_reason"),
}

# Residencies and jobs name their deployment, so its history can include theirs.
_NAMES_DEPLOYMENT = frozenset({"residency", "job"})


async def add_created(
    session: AsyncSession,
    row: object,
    *,
    subject_kind: str,
    subject_id: str,
    state: str,
    at: dt.datetime,
    deployment_id: str | None = None,
) -> None:
    """A new row, the state it was created in, both flushed: every store creates its records so,
    so no record exists without the first line of its history."""
    session.add(row)
    session.add(
        StateTransition(
            at=at,
            subject_kind=subject_kind,
            subject_id=subject_id,
            deployment_id=deployment_id,
            from_state="",  # the state it was created in: nothing before it
            to_state=str(state),
            reason="",
            message="",
        )
    )
    await session.flush()


async def record_changes(
    session: AsyncSession,
    model: Any,
    keys: Sequence[str],
    *,
    machine: str,
    from_state: str,
    to_state: str,
    values: Mapping[str, Any],
    at: dt.datetime | None,
) -> None:
    """Compare-and-sets that won, one per key, all the same move; a no-op for machines that are
    not recorded.

    One INSERT: the deployment a residency or job names is read by a subquery, not a round trip.
    """
    if machine not in RECORDED_KINDS or not keys:
        return
    reason_column, message_column = _FAILURE_COLUMNS[machine]
    primary_key = next(iter(model.__table__.primary_key.columns))
    when = at or _time_of(values)
    reason = str(values.get(reason_column, "") or "") if reason_column else ""
    message = str(values.get(message_column, "") or "")
    await session.execute(
        insert(StateTransition).values(
            [
                {
                    "at": when,
                    "subject_kind": machine,
                    "subject_id": key,
                    "deployment_id": select(model.deployment_id)
                    .where(primary_key == key)
                    .scalar_subquery()
                    if machine in _NAMES_DEPLOYMENT
                    else None,
                    "from_state": str(from_state),
                    "to_state": str(to_state),
                    "reason": reason,
                    "message": message,
                }
                for key in keys
            ]
        )
    )


def _time_of(values: Mapping[str, Any]) -> dt.datetime:
    """The change's own time when it writes one; a caller without a clock still leaves history
    (order comes from transition_id, the time is for reading)."""
    for column in ("updated_at", "last_seen_at"):
        value = values.get(column)
        if isinstance(value, dt.datetime):
            return value
    return dt.datetime.now(dt.UTC)


async def list_transitions(
    session: AsyncSession, *, subject_kind: str, subject_id: str, after: int, limit: int
) -> Sequence[StateTransition]:
    """Oldest first; a deployment's history holds its residencies' and jobs' changes too."""
    subject: ColumnElement[bool] = (StateTransition.subject_kind == subject_kind) & (
        StateTransition.subject_id == subject_id
    )
    if subject_kind == "deployment":
        subject = or_(subject, StateTransition.deployment_id == subject_id)
    query = (
        select(StateTransition)
        .where(subject, StateTransition.transition_id > after)
        .order_by(StateTransition.transition_id)
        .limit(limit)
    )
    return (await session.scalars(query)).all()
