"""Draining before unloading: a residency takes no new call, finishes those in flight within a
deadline, then unloads, so a planned change loses no call.

`begin_drain` starts one residency's drain in the caller's transaction: DrainDeployment
(lifecycle.unload with a deadline), an operator's scale down and the autoscaler's (surplus.py).
The DRAINING state, committed, is announced to the scheduler like any residency change, and the
scheduler dispatches only to RESIDENT residencies. The reconciler's drain step ends the drain
(`drain_rules.drain_verdict`): DRAINING -> UNLOADING with the ordinary UNLOAD job, so the custody
rules of an unload hold unchanged.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy.ext.asyncio import AsyncSession

from gantry.controlplane.deployments import store as deployments
from gantry.controlplane.deployments.residency_stop import stop_residency
from gantry.controlplane.platform.models import Residency
from gantry.controlplane.platform.state_machines import ResidencyState


async def begin_drain(
    session: AsyncSession,
    residency: Residency,
    *,
    deadline_at: dt.datetime,
    worker_connected: bool,
    now: dt.datetime,
) -> None:
    """RESIDENT -> DRAINING until `deadline_at`. One already DRAINING keeps its first deadline.

    What has no call to finish is stopped at once, as an unload stops it (stop_residency): a
    load under way (it serves nothing yet), a residency whose worker is away (its calls failed
    when its stream closed), one already unloading or UNCERTAIN. The caller cancels the
    residency's open jobs first, as it does before an unload.
    """
    if residency.state == ResidencyState.DRAINING:
        return
    if residency.state != ResidencyState.RESIDENT or not worker_connected:
        await stop_residency(session, residency, worker_connected=worker_connected, now=now)
        return
    await deployments.set_residency_state(
        session, residency, ResidencyState.DRAINING, now=now, drain_deadline_at=deadline_at
    )
