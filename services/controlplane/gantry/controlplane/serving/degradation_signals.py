"""The reconciler's degradation step: read what crash-loops, evaluate the policy, audit changes.

The policy (serving/capability_degradation.py) holds the outcome windows; this step feeds it the
one fact the database has (which capabilities' deployments crash-loop) and records each change
of condition as `capability.degraded` or `capability.recovered`. It sends nothing to a worker.
"""

from __future__ import annotations

import datetime as dt
import functools

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.metrics import BoundedValues, Labels, meter, observable_gauge
from gantry.controlplane.observability import audit
from gantry.controlplane.platform.models import Deployment, Residency
from gantry.controlplane.platform.state_machines import ResidencyState
from gantry.controlplane.serving.capability_degradation import (
    CRASH_LOOP,
    CapabilityDegradation,
    CapabilityHealth,
    Condition,
)

DEGRADATION_ACTOR = "reconciler"
# Capabilities are named by operators' deployments (bounded by configuration); bounded again here.
CAPABILITY_LABELS = 256

_degraded = observable_gauge(
    meter("gantry.controlplane.degradation"),
    "gantry_capability_degraded",
    "1 while a capability is DEGRADED (by reason), 0 once it is followed and healthy",
)
_capabilities = BoundedValues(CAPABILITY_LABELS)


def publish_degradation(degradation: CapabilityDegradation) -> None:
    values: dict[Labels, float] = {}
    for health in degradation.states():
        labels = (("capability", _capabilities(health.capability)), ("reason", health.reason))
        degraded = 1.0 if health.condition is Condition.DEGRADED else 0.0
        values[labels] = max(values.get(labels, 0.0), degraded)
    _degraded.publish(values)


@functools.cache
def _questions() -> tuple[Select[str], Select[str]]:
    """The capabilities whose deployments crash-loop, and those of live deployments: built once,
    since the reconciler asks them on every pass and they hold no value of their own."""
    crash_looping = (
        select(Deployment.capability)
        .join(Residency, Residency.deployment_id == Deployment.deployment_id)
        .where(
            Residency.state != ResidencyState.COLD,
            Residency.last_failure_reason == CRASH_LOOP,
        )
        .distinct()
    )
    existing = select(Deployment.capability).where(Deployment.deleted_at.is_(None)).distinct()
    return crash_looping, existing


async def evaluate_degradation(
    session: AsyncSession, degradation: CapabilityDegradation, *, now: dt.datetime
) -> list[CapabilityHealth]:
    """Evaluate each capability's degradation from the outcomes recorded and the crash loops the
    database holds, in the caller's transaction (the reconciler's pass), auditing each change."""
    crash_looping_query, existing_query = _questions()
    crash_looping = set((await session.scalars(crash_looping_query)).all())
    existing = set((await session.scalars(existing_query)).all())
    degradation.retain(existing)
    changed = degradation.evaluate(crash_looping=crash_looping)
    for health in changed:
        degraded = health.condition is Condition.DEGRADED
        await audit.record_event(
            session,
            actor=DEGRADATION_ACTOR,
            action="capability.degraded" if degraded else "capability.recovered",
            subject_kind="capability",
            subject_id=health.capability,
            now=now,
            reason=health.reason,
            success_rate=f"{health.success_rate:.3f}",
            outcomes=health.outcomes,
        )
    publish_degradation(degradation)
    return changed
