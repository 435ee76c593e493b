"""Serving jobs: typed work for one node, run under a lease.

A deployment job (LOAD, UNLOAD, HEALTH) names its deployment and residency; an evidence-pipeline
job (INSPECT, PROBE) names its assessment or probe and neither of those.

Results are idempotent by job id: the same result sent twice is acknowledged twice and committed
once; a different result for a settled job is a conflict, never an overwrite.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common import tokens
from gantry.common.errors import GantryError
from gantry.common.ids import new_id
from gantry.controlplane.observability import state_history
from gantry.controlplane.platform.models import Residency, ServingJob
from gantry.controlplane.platform.rows import get_row
from gantry.controlplane.platform.state_machines import TERMINAL_JOB_STATES, JobState, JobType
from gantry.controlplane.platform.transitions import compare_and_set


class ResultCommit(enum.Enum):
    COMMITTED = "committed"
    DUPLICATE = "duplicate"  # the same result arrived again: acknowledge, change nothing


async def create_job(
    session: AsyncSession,
    *,
    job_type: JobType,
    node_id: str,
    now: dt.datetime,
    deployment_id: str | None = None,
    residency_id: str | None = None,
    probe_id: str | None = None,
    assessment_id: str | None = None,
) -> ServingJob:
    row = ServingJob(
        job_id=new_id(),
        job_type=job_type,
        deployment_id=deployment_id,
        node_id=node_id,
        residency_id=residency_id,
        probe_id=probe_id,
        assessment_id=assessment_id,
        state=JobState.QUEUED,
        lease_token_hash="",
        lease_expires_at=None,
        attempt_count=0,
        generation=0,
        result_digest="",
        result={},
        failure_reason="",
        failure_message="",
        created_at=now,
        updated_at=now,
    )
    await state_history.add_created(
        session,
        row,
        subject_kind="job",
        subject_id=row.job_id,
        state=row.state,
        at=now,
        deployment_id=deployment_id,
    )
    return row


async def get_job(session: AsyncSession, job_id: str) -> ServingJob:
    return await get_row(session, ServingJob, job_id, "serving job")


async def deployment_of_job(session: AsyncSession, job_id: str) -> str | None:
    """The job's deployment id (None for an evidence job or an unknown job), read without
    loading the row, so a later `get_job` in the same session reads it fresh."""
    return await session.scalar(select(ServingJob.deployment_id).where(ServingJob.job_id == job_id))


async def queued_jobs_for_node(session: AsyncSession, node_id: str) -> Sequence[ServingJob]:
    query = (
        select(ServingJob)
        .where(ServingJob.node_id == node_id, ServingJob.state == JobState.QUEUED)
        .order_by(ServingJob.created_at)
    )
    return (await session.scalars(query)).all()


async def lease_job(
    session: AsyncSession,
    job: ServingJob,
    *,
    generation: int,
    lease_seconds: float,
    now: dt.datetime,
) -> str:
    """QUEUED -> LEASED for one worker generation; returns the lease token (its hash is kept)."""
    token = tokens.mint_token(tokens.LEASE_TOKEN, job.job_id)
    await compare_and_set(
        session,
        ServingJob,
        job.job_id,
        machine="job",
        expected=JobState.QUEUED,
        target=JobState.LEASED,
        lease_token_hash=tokens.hash_token(token),
        lease_expires_at=now + dt.timedelta(seconds=lease_seconds),
        attempt_count=job.attempt_count + 1,
        generation=generation,
        updated_at=now,
    )
    await session.refresh(job)
    return token


async def renew_leases(
    session: AsyncSession,
    *,
    node_id: str,
    generation: int,
    job_ids: Sequence[str],
    lease_seconds: float,
    now: dt.datetime,
) -> None:
    if not job_ids:
        return
    rows = await session.scalars(
        select(ServingJob).where(
            ServingJob.job_id.in_(list(job_ids)),
            ServingJob.node_id == node_id,
            ServingJob.generation == generation,
            ServingJob.state.in_([JobState.LEASED, JobState.RUNNING]),
        )
    )
    for row in rows:
        row.lease_expires_at = now + dt.timedelta(seconds=lease_seconds)
    await session.flush()


async def record_result(
    session: AsyncSession,
    *,
    job_id: str,
    node_id: str,
    generation: int,
    lease_token: str,
    succeeded: bool,
    result: dict[str, Any],
    result_digest: str,
    failure_reason: str,
    failure_message: str,
    now: dt.datetime,
) -> tuple[ServingJob, ResultCommit]:
    job = await get_job(session, job_id)
    if job.node_id != node_id:
        raise GantryError("LEASE_TOKEN_INVALID", f"job {job_id} is not leased to this node")
    if not tokens.token_matches(lease_token, job.lease_token_hash or "-"):
        raise GantryError("LEASE_TOKEN_INVALID", f"lease token for job {job_id} is not current")
    if job.state in TERMINAL_JOB_STATES:
        if job.result_digest == result_digest:
            return job, ResultCommit.DUPLICATE
        raise GantryError(
            "RESULT_CONFLICT", f"job {job_id} is settled with a different result", job_id=job_id
        )
    if job.generation != generation:
        raise GantryError("STALE_GENERATION", f"job {job_id} is leased to another generation")
    target = JobState.SUCCEEDED if succeeded else JobState.FAILED
    await compare_and_set(
        session,
        ServingJob,
        job_id,
        machine="job",
        expected=job.state,
        target=target,
        result=result,
        result_digest=result_digest,
        failure_reason=failure_reason,
        failure_message=failure_message,
        updated_at=now,
    )
    await session.refresh(job)
    return job, ResultCommit.COMMITTED


async def release_generation_jobs(
    session: AsyncSession, *, node_id: str, generation: int, now: dt.datetime
) -> Sequence[ServingJob]:
    """A worker generation ended: its unfinished jobs go back to QUEUED; their old tokens die."""
    rows = (
        await session.scalars(
            select(ServingJob).where(
                ServingJob.node_id == node_id,
                ServingJob.generation == generation,
                ServingJob.state.in_([JobState.LEASED, JobState.RUNNING]),
            )
        )
    ).all()
    for row in rows:
        await requeue_job(session, row, now=now)
    return rows


async def cancel_open_jobs(
    session: AsyncSession, *, deployment_id: str, now: dt.datetime
) -> Sequence[ServingJob]:
    rows = (
        await session.scalars(
            select(ServingJob).where(
                ServingJob.deployment_id == deployment_id, ServingJob.state == JobState.QUEUED
            )
        )
    ).all()
    for row in rows:
        await compare_and_set(
            session,
            ServingJob,
            row.job_id,
            machine="job",
            expected=row.state,
            target=JobState.CANCELLED,
            updated_at=now,
        )
    return rows


OPEN_JOB_STATES = (JobState.QUEUED, JobState.LEASED, JobState.RUNNING)
LEASED_JOB_STATES = (JobState.LEASED, JobState.RUNNING)


async def expired_leases(session: AsyncSession, *, now: dt.datetime) -> Sequence[ServingJob]:
    query = select(ServingJob).where(
        ServingJob.state.in_(LEASED_JOB_STATES), ServingJob.lease_expires_at < now
    )
    return (await session.scalars(query)).all()


async def requeue_job(session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
    """LEASED/RUNNING -> QUEUED: its lease expired or its generation ended; the token dies.

    The next lease draws a new token and counts one more attempt.
    """
    await _move_job(
        session,
        job,
        JobState.QUEUED,
        lease_token_hash="",
        lease_expires_at=None,
        updated_at=now,
    )


async def open_jobs_for_residency(
    session: AsyncSession, residency_id: str, *, job_type: JobType | None = None
) -> Sequence[ServingJob]:
    query = select(ServingJob).where(
        ServingJob.residency_id == residency_id, ServingJob.state.in_(OPEN_JOB_STATES)
    )
    if job_type is not None:
        query = query.where(ServingJob.job_type == job_type)
    return (await session.scalars(query)).all()


async def open_jobs_by_residency_on_node(
    session: AsyncSession, node_id: str
) -> dict[str, list[ServingJob]]:
    """`open_jobs_for_residency` of every residency on the node, in one query: a node keeps the
    rows of every residency it ever had (COLD ones too), and one query each made an inventory of a
    node with a long history cost a query per past load (issue 29: 100 load/unload cycles took
    each cycle from 0.72 to 1.06 s)."""
    on_node = select(Residency.residency_id).where(Residency.node_id == node_id)
    query = select(ServingJob).where(
        ServingJob.residency_id.in_(on_node), ServingJob.state.in_(OPEN_JOB_STATES)
    )
    found: dict[str, list[ServingJob]] = {}
    for job in (await session.scalars(query)).all():
        found.setdefault(job.residency_id or "", []).append(job)
    return found


async def cancel_job(session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
    await _move_job(
        session,
        job,
        JobState.CANCELLED,
        lease_token_hash="",
        updated_at=now,
    )


PIPELINE_JOB_TYPES = (JobType.INSPECT, JobType.PROBE)


async def open_pipeline_jobs_on_node(session: AsyncSession, node_id: str) -> Sequence[ServingJob]:
    """The node's unfinished INSPECT and PROBE jobs (they hold no residency)."""
    query = select(ServingJob).where(
        ServingJob.node_id == node_id,
        ServingJob.job_type.in_(PIPELINE_JOB_TYPES),
        ServingJob.state.in_(OPEN_JOB_STATES),
    )
    return (await session.scalars(query.order_by(ServingJob.created_at))).all()


async def open_jobs(session: AsyncSession) -> Sequence[ServingJob]:
    query = select(ServingJob).where(ServingJob.state.in_(OPEN_JOB_STATES))
    return (await session.scalars(query)).all()


async def list_jobs(
    session: AsyncSession, *, after: str, limit: int, deployment_id: str = "", node_id: str = ""
) -> Sequence[ServingJob]:
    query = select(ServingJob).where(ServingJob.job_id > after)
    if deployment_id:
        query = query.where(ServingJob.deployment_id == deployment_id)
    if node_id:
        query = query.where(ServingJob.node_id == node_id)
    return (await session.scalars(query.order_by(ServingJob.job_id).limit(limit))).all()


async def check_current_lease(
    session: AsyncSession, *, job_id: str, node_id: str, generation: int, lease_token: str
) -> ServingJob:
    """The job, if this node generation holds its current lease and it has not ended.

    What a worker says about a job it no longer holds (an expired lease, a dead generation, a
    cancelled job) is refused, never committed.
    """
    job = await get_job(session, job_id)
    if job.node_id != node_id or not tokens.token_matches(lease_token, job.lease_token_hash or "-"):
        raise GantryError("LEASE_TOKEN_INVALID", f"lease token for job {job_id} is not current")
    if job.generation != generation:
        raise GantryError("STALE_GENERATION", f"job {job_id} is leased to another generation")
    if job.state not in LEASED_JOB_STATES:
        raise GantryError("INVALID_STATE_TRANSITION", f"job {job_id} is {job.state}", job_id=job_id)
    return job


async def mark_running(session: AsyncSession, job: ServingJob, *, now: dt.datetime) -> None:
    """LEASED -> RUNNING: the worker reported the work started."""
    if job.state != JobState.LEASED:
        return
    await compare_and_set(
        session,
        ServingJob,
        job.job_id,
        machine="job",
        expected=JobState.LEASED,
        target=JobState.RUNNING,
        updated_at=now,
    )
    await session.refresh(job)


async def _move_job(
    session: AsyncSession, job: ServingJob, target: JobState, **values: Any
) -> None:
    """One checked step of the job's machine from the state it was read in, read back."""
    await compare_and_set(
        session,
        ServingJob,
        job.job_id,
        machine="job",
        expected=job.state,
        target=target,
        **values,
    )
    await session.refresh(job)
