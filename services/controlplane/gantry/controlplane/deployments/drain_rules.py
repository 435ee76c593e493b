"""When a draining residency is unloaded, and the bounds of a drain's deadline. Pure: no IO.

A residency drains before it unloads (DrainDeployment, a scale down): RESIDENT -> DRAINING takes
it out of routing (the scheduler dispatches only to RESIDENT residencies) while the calls it
already runs finish. It is unloaded (DRAINING -> UNLOADING with the ordinary UNLOAD job) once
none is left, or once its deadline passes, whichever comes first: a drain never holds a
residency longer than its deadline. deployments/drain.py starts drains; the reconciler's drain
step (reconciler_plans.plan_finish_drains) ends them with `drain_verdict`.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from gantry.common.errors import invalid_argument

DEFAULT_DRAIN_DEADLINE_S = 30
# A drain holds a residency's charge (and its capacity) for its deadline at most: an hour is past
# any inference call's own budget, so a longer one would only hold a replica nobody routes to.
MAX_DRAIN_DEADLINE_S = 3600
# A call the scheduler dispatched just before it heard of the drain reaches the control plane a
# round trip later. An idle residency is unloaded only once it has drained this long, so such a
# call is counted in flight (and served) instead of being cut by the unload.
DRAIN_SETTLE_S = 1.0


def drain_deadline_s(requested: int) -> int:
    """The deadline a DrainDeployment asked for: 0 is the default; above the bound is refused."""
    if requested == 0:
        return DEFAULT_DRAIN_DEADLINE_S
    if requested > MAX_DRAIN_DEADLINE_S:
        raise invalid_argument(
            f"deadline_seconds is {requested}; a drain waits at most {MAX_DRAIN_DEADLINE_S}s",
            field="deadline_seconds",
            limit=str(MAX_DRAIN_DEADLINE_S),
            value=str(requested),
        )
    return requested


class DrainVerdict(enum.Enum):
    WAIT = "WAIT"  # calls still run (or it has just begun) and its deadline is ahead
    IDLE = "IDLE"  # nothing runs on it any more: unload it
    DEADLINE = "DEADLINE"  # its deadline passed with calls still running: cut them, unload it


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainingResidency:
    """A DRAINING residency and what its drain is decided on."""

    residency_id: str
    deployment_id: str
    node_id: str
    draining_since: dt.datetime
    deadline_at: dt.datetime | None  # None: no deadline was recorded; the default one applies
    in_flight: int  # its calls the control plane has sent to its worker and not had answered
    stream_open: bool  # its worker's stream is open here


def deadline_of(residency: DrainingResidency) -> dt.datetime:
    if residency.deadline_at is not None:
        return residency.deadline_at
    return residency.draining_since + dt.timedelta(seconds=DEFAULT_DRAIN_DEADLINE_S)


def drain_verdict(
    residency: DrainingResidency, *, now: dt.datetime, settle_s: float = DRAIN_SETTLE_S
) -> DrainVerdict:
    """Whether the draining residency is done (and how), or still waits."""
    if not residency.stream_open:
        # Its calls failed when its stream closed (WORKER_UNAVAILABLE): nothing is left to wait
        # for, and its UNLOAD waits for the worker like any other.
        return DrainVerdict.IDLE
    if now >= deadline_of(residency):
        return DrainVerdict.DEADLINE if residency.in_flight else DrainVerdict.IDLE
    settled = now >= residency.draining_since + dt.timedelta(seconds=settle_s)
    if residency.in_flight == 0 and settled:
        return DrainVerdict.IDLE
    return DrainVerdict.WAIT
