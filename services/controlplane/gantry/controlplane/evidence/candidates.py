"""Deployment candidates: what a completed probe's evidence made (LAB_READY or REJECTED).

A candidate is created once per probe (probe_id is unique) and only its `production` flag ever
changes: false -> true, once, by an approval, as a compare-and-set.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.common.ids import new_id
from gantry.controlplane.evidence.pipeline_states import CandidateStatus
from gantry.controlplane.platform.models import DeploymentCandidate
from gantry.controlplane.platform.rows import get_row


async def create_candidate(
    session: AsyncSession,
    *,
    probe_id: str,
    profile_id: str,
    artifact_set_id: str,
    status: CandidateStatus,
    reasons: list[str],
    now: dt.datetime,
) -> DeploymentCandidate:
    row = DeploymentCandidate(
        candidate_id=new_id(),
        probe_id=probe_id,
        profile_id=profile_id,
        artifact_set_id=artifact_set_id,
        status=status,
        production=False,
        reasons=reasons,
        created_at=now,
    )
    session.add(row)
    await session.flush()
    return row


async def get_candidate(session: AsyncSession, candidate_id: str) -> DeploymentCandidate:
    return await get_row(session, DeploymentCandidate, candidate_id, "deployment candidate")


async def list_candidates(
    session: AsyncSession, *, after: str, limit: int, profile_id: str = ""
) -> Sequence[DeploymentCandidate]:
    query = select(DeploymentCandidate).where(DeploymentCandidate.candidate_id > after)
    if profile_id:
        query = query.where(DeploymentCandidate.profile_id == profile_id)
    query = query.order_by(DeploymentCandidate.candidate_id).limit(limit)
    return (await session.scalars(query)).all()


async def all_candidates(session: AsyncSession) -> Sequence[DeploymentCandidate]:
    return (await session.scalars(select(DeploymentCandidate))).all()


async def mark_production(session: AsyncSession, candidate: DeploymentCandidate) -> None:
    """production false -> true for a LAB_READY candidate; losing the race is a typed conflict."""
    result = await session.execute(
        update(DeploymentCandidate)
        .where(
            DeploymentCandidate.candidate_id == candidate.candidate_id,
            DeploymentCandidate.status == CandidateStatus.LAB_READY,
            DeploymentCandidate.production.is_(False),
        )
        .values(production=True)
        .execution_options(synchronize_session="fetch")
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"candidate {candidate.candidate_id} was approved concurrently",
            machine="candidate",
            conflict="true",
        )
    await session.refresh(candidate)
