"""Compatibility assessments: one INSPECT of an artifact set in one environment on one node.

PENDING until its job reports, then COMPLETED (inspected: compatible or not) or FAILED (could not
inspect). It ends exactly once: the move is a compare-and-set from PENDING.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.ids import new_id
from gantry.controlplane.evidence.pipeline_states import AssessmentState
from gantry.controlplane.platform.models import CompatibilityAssessment
from gantry.controlplane.platform.rows import get_row
from gantry.controlplane.platform.transitions import compare_and_set


async def create_assessment(
    session: AsyncSession,
    *,
    artifact_set_id: str,
    node_id: str,
    environment_id: str,
    now: dt.datetime,
) -> CompatibilityAssessment:
    row = CompatibilityAssessment(
        assessment_id=new_id(),
        artifact_set_id=artifact_set_id,
        node_id=node_id,
        environment_id=environment_id,
        state=AssessmentState.PENDING,
        compatible=False,
        inspection={},
        environment_fingerprint="",
        failure_reason="",
        failure_message="",
        job_id=None,
        created_at=now,
        completed_at=None,
    )
    session.add(row)
    await session.flush()
    return row


async def get_assessment(session: AsyncSession, assessment_id: str) -> CompatibilityAssessment:
    return await get_row(session, CompatibilityAssessment, assessment_id, "assessment")


async def list_assessments(
    session: AsyncSession, *, after: str, limit: int, artifact_set_id: str = ""
) -> Sequence[CompatibilityAssessment]:
    query = select(CompatibilityAssessment).where(CompatibilityAssessment.assessment_id > after)
    if artifact_set_id:
        query = query.where(CompatibilityAssessment.artifact_set_id == artifact_set_id)
    query = query.order_by(CompatibilityAssessment.assessment_id).limit(limit)
    return (await session.scalars(query)).all()


async def complete_assessment(
    session: AsyncSession,
    row: CompatibilityAssessment,
    *,
    compatible: bool,
    inspection: dict[str, Any],
    environment_fingerprint: str,
    failure_reason: str,
    failure_message: str,
    now: dt.datetime,
) -> None:
    """PENDING -> COMPLETED with what the inspection found (and why it is incompatible, if so)."""
    await _move_assessment(
        session,
        row,
        AssessmentState.COMPLETED,
        compatible=compatible,
        inspection=inspection,
        environment_fingerprint=environment_fingerprint,
        failure_reason=failure_reason,
        failure_message=failure_message,
        completed_at=now,
    )


async def fail_assessment(
    session: AsyncSession,
    row: CompatibilityAssessment,
    *,
    reason: str,
    message: str,
    now: dt.datetime,
) -> None:
    """PENDING -> FAILED: it could not be inspected (bytes, environment, lost worker)."""
    await _move_assessment(
        session,
        row,
        AssessmentState.FAILED,
        compatible=False,
        failure_reason=reason,
        failure_message=message,
        completed_at=now,
    )


async def _move_assessment(
    session: AsyncSession, row: CompatibilityAssessment, target: AssessmentState, **values: Any
) -> None:
    """One checked step of the assessment's machine (a lost race is an error), read back."""
    await compare_and_set(
        session,
        CompatibilityAssessment,
        row.assessment_id,
        machine="assessment",
        expected=row.state,
        target=target,
        **values,
    )
    await session.refresh(row)
