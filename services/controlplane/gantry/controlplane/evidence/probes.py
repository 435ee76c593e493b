"""Runtime probes: one PROBE job's life, moved through evidence/probe_transitions.py.

Every move is a compare-and-set from the state the caller read: a stage report, a lost lease, a
cancel and the final result racing each other cannot both win, and a probe that has ended
(COMPLETED, FAILED, CANCELLED) never moves again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.ids import new_id
from gantry.controlplane.evidence.probe_transitions import (
    TERMINAL_PROBE_STATES,
    ProbeState,
    forward_path,
)
from gantry.controlplane.platform.models import RuntimeProbe
from gantry.controlplane.platform.rows import get_row
from gantry.controlplane.platform.transitions import compare_and_set


async def create_probe(
    session: AsyncSession, *, profile_id: str, node_id: str, now: dt.datetime
) -> RuntimeProbe:
    row = RuntimeProbe(
        probe_id=new_id(),
        profile_id=profile_id,
        node_id=node_id,
        state=ProbeState.QUEUED,
        job_id=None,
        evidence={},
        failure_reason="",
        failure_message="",
        candidate_id=None,
        attempt_count=0,
        created_at=now,
        updated_at=now,
        completed_at=None,
    )
    session.add(row)
    await session.flush()
    return row


async def get_probe(session: AsyncSession, probe_id: str) -> RuntimeProbe:
    return await get_row(session, RuntimeProbe, probe_id, "probe")


async def list_probes(
    session: AsyncSession, *, after: str, limit: int, profile_id: str = ""
) -> Sequence[RuntimeProbe]:
    query = select(RuntimeProbe).where(RuntimeProbe.probe_id > after)
    if profile_id:
        query = query.where(RuntimeProbe.profile_id == profile_id)
    query = query.order_by(RuntimeProbe.probe_id).limit(limit)
    return (await session.scalars(query)).all()


def has_ended(probe: RuntimeProbe) -> bool:
    return probe.state in TERMINAL_PROBE_STATES


async def move_probe(
    session: AsyncSession,
    probe: RuntimeProbe,
    target: ProbeState,
    *,
    now: dt.datetime,
    **values: Any,
) -> None:
    """One checked step of the table (a stage report, a requeue, a failure, a cancel)."""
    await compare_and_set(
        session,
        RuntimeProbe,
        probe.probe_id,
        machine="probe",
        expected=probe.state,
        target=target,
        updated_at=now,
        **values,
    )
    await session.refresh(probe)


async def complete_probe(
    session: AsyncSession,
    probe: RuntimeProbe,
    *,
    evidence: dict[str, Any],
    candidate_id: str,
    now: dt.datetime,
) -> None:
    """Walk the remaining stages to COMPLETED (each checked) and record the evidence."""
    path = forward_path(probe.state, ProbeState.COMPLETED)
    for step in path[:-1]:
        await move_probe(session, probe, step, now=now)
    await move_probe(
        session,
        probe,
        ProbeState.COMPLETED,
        now=now,
        evidence=evidence,
        candidate_id=candidate_id,
        completed_at=now,
    )


async def end_probe(
    session: AsyncSession,
    probe: RuntimeProbe,
    target: ProbeState,
    *,
    reason: str,
    message: str,
    now: dt.datetime,
) -> None:
    """FAILED or CANCELLED, with why."""
    await move_probe(
        session,
        probe,
        target,
        now=now,
        failure_reason=reason,
        failure_message=message,
        completed_at=now,
    )


async def requeue_probe(session: AsyncSession, probe: RuntimeProbe, *, now: dt.datetime) -> bool:
    """Back to QUEUED after a lost lease or a worker restart; True when it moved.

    A probe still QUEUED (its job never started a stage) stays as it is; an ended one is not
    touched.
    """
    if has_ended(probe) or probe.state == ProbeState.QUEUED:
        return False
    await move_probe(session, probe, ProbeState.QUEUED, now=now)
    return True
