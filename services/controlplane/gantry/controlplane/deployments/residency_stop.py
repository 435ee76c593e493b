"""Stopping one residency the way every operator action and the autoscaler stop one.

UNLOADING with an UNLOAD job until its worker confirms the process exited (custody ends only when
it is reaped), or COLD at once for a load whose worker is away: its queued load was cancelled and
nothing runs there. Unload, restart, scale down and the autoscaler share it, so none of them can
drift from the custody rule.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.platform.models import Residency, ServingJob
from gantry.controlplane.platform.state_machines import JobType, ResidencyState


async def stop_residency(
    session: AsyncSession, residency: Residency, *, worker_connected: bool, now: dt.datetime
) -> None:
    if residency.state == ResidencyState.LOADING and not worker_connected:
        await deployments.set_residency_state(
            session, residency, ResidencyState.COLD, now=now, pid=0
        )
        return
    await deployments.set_residency_state(session, residency, ResidencyState.UNLOADING, now=now)
    await queue_unload(session, residency, now=now)


async def queue_unload(session: AsyncSession, residency: Residency, *, now: dt.datetime) -> None:
    """An UNLOAD job for the residency, unless one is open already."""
    if await jobs.open_jobs_for_residency(session, residency.residency_id, job_type=JobType.UNLOAD):
        return
    await create_unload_job(session, residency, now=now)


async def create_unload_job(
    session: AsyncSession, residency: Residency, *, now: dt.datetime
) -> ServingJob:
    """An UNLOAD job for the residency, on its node."""
    return await jobs.create_job(
        session,
        job_type=JobType.UNLOAD,
        deployment_id=residency.deployment_id,
        node_id=residency.node_id,
        residency_id=residency.residency_id,
        now=now,
    )


async def mark_cold(
    session: AsyncSession, residency: Residency, *, reason: str, message: str, now: dt.datetime
) -> None:
    """COLD with no process: what ran there is gone (or never started), and why."""
    await deployments.set_residency_state(
        session,
        residency,
        ResidencyState.COLD,
        now=now,
        pid=0,
        last_failure_reason=reason,
        last_failure_message=message,
    )
