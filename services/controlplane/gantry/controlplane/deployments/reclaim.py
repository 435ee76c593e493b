"""Reclaim one exact residency: drain it from routing, unload it, and read back how it ended.

The same custody path as an unload or an autoscale drain: the residency goes UNLOADING (so the
scheduler, told after the commit, routes it no new work) and gets the ordinary UNLOAD job; the
job's result decides COLD (the worker saw the process exit) or UNCERTAIN (it could not). Nothing
else of its deployment is touched. The deployment still wants its replicas, so the reconciler's
usual rule (place what is missing) loads a new replica afterwards, on whichever node placement
picks: a reclaim frees a residency, it does not scale a deployment down.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from google.protobuf import json_format
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.errors import GantryError
from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.residency_stop import create_unload_job
from gantry.controlplane.deployments.settle import settle_deployment
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.observability import audit
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import Residency, ServingJob
from gantry.controlplane.platform.state_machines import (
    TERMINAL_JOB_STATES,
    JobState,
    JobType,
    ResidencyState,
)
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg

# States the wait ends in: custody is settled one way or the other.
SETTLED = frozenset({ResidencyState.COLD, ResidencyState.UNCERTAIN})


@dataclass(kw_only=True)
class ReclaimStarted:
    residency: Residency
    unload_job_id: str  # "" when nothing ran there (a load whose worker is away: COLD at once)
    cancelled: list[ServingJob] = field(default_factory=list)  # leased ones: tell the worker


async def start_reclaim(
    session: AsyncSession, residency_id: str, *, hub: WorkerHub, actor: str, now: dt.datetime
) -> ReclaimStarted:
    """UNLOADING with an UNLOAD job (an open one is reused), audited as `residency.reclaim`.

    NOT_FOUND for an unknown id; INVALID_STATE_TRANSITION (FAILED_PRECONDITION) when it is COLD.
    """
    residency = await deployments.get_residency(session, residency_id)
    _check_reclaimable(residency)
    from_state = residency.state
    started = ReclaimStarted(residency=residency, unload_job_id="")
    await _cancel_all_but_unload(session, started, now=now)
    if started.unload_job_id:
        pass  # its residency is UNLOADING or UNCERTAIN already: that job settles it
    elif residency.state == ResidencyState.LOADING and hub.get(residency.node_id) is None:
        # Its worker is away and its load was just cancelled: nothing runs there.
        await deployments.set_residency_state(
            session, residency, ResidencyState.COLD, now=now, pid=0
        )
    else:
        if residency.state != ResidencyState.UNLOADING:
            await deployments.set_residency_state(
                session, residency, ResidencyState.UNLOADING, now=now
            )
        started.unload_job_id = (await create_unload_job(session, residency, now=now)).job_id
    await settle_deployment(session, residency.deployment_id, now=now)
    await audit.record_event(
        session,
        actor=actor,
        action="residency.reclaim",
        subject_kind="residency",
        subject_id=residency_id,
        now=now,
        deployment_id=residency.deployment_id,
        node_id=residency.node_id,
        from_state=str(from_state),
        unload_job_id=started.unload_job_id,
    )
    return started


def _check_reclaimable(residency: Residency) -> None:
    if residency.state == ResidencyState.COLD:
        raise GantryError(
            "INVALID_STATE_TRANSITION",
            f"residency {residency.residency_id} is already COLD: nothing runs there to reclaim",
            machine="residency",
            current=str(residency.state),
            target=str(ResidencyState.UNLOADING),
        )


async def _cancel_all_but_unload(
    session: AsyncSession, started: ReclaimStarted, *, now: dt.datetime
) -> None:
    """Cancel the residency's open jobs but an UNLOAD, which the reclaim then waits for."""
    for job in await jobs.open_jobs_for_residency(session, started.residency.residency_id):
        if job.job_type == JobType.UNLOAD:
            started.unload_job_id = job.job_id  # already being reclaimed: wait for that one
            continue
        was_leased = job.state != JobState.QUEUED
        await jobs.cancel_job(session, job, now=now)  # a load under way, a health check
        if was_leased:
            started.cancelled.append(job)


async def reclaim_outcome(
    session: AsyncSession, residency_id: str, unload_job_id: str
) -> tuple[cp.ReclaimResidencyResponse, bool]:
    """The response as things stand, and whether custody is settled (COLD or UNCERTAIN)."""
    residency = await deployments.get_residency(session, residency_id)
    response = cp.ReclaimResidencyResponse(residency=convert.residency(residency))
    state = ResidencyState(residency.state)
    if not unload_job_id:
        return response, state in SETTLED  # COLD at once: nothing ran there
    job = await jobs.get_job(session, unload_job_id)
    response.unload_job.CopyFrom(convert.serving_job(job))
    if "unload" in job.result:
        evidence = json_format.ParseDict(
            job.result["unload"], wg.UnloadEvidence(), ignore_unknown_fields=True
        )
        response.evidence.CopyFrom(evidence)
        # As the UNLOAD's plan decides COLD: exited, and the worker's reclaim check (if it made
        # one) verified (on a GPU, NVML read and no longer listing the pid).
        reclaimed = not evidence.HasField("reclaim") or evidence.reclaim.reclaimed
        response.reclaim_verified = (
            job.state == JobState.SUCCEEDED and evidence.process_exited and reclaimed
        )
    # The job's end settles it too: by the time this reads, the reconciler may already have
    # placed the replica again (the same row, LOADING).
    return response, state in SETTLED or job.state in TERMINAL_JOB_STATES
