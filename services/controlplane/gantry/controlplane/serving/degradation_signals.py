"""The reconciler's degradation step: read what crash-loops, evaluate the policy, audit changes.

The policy (serving/capability_degradation.py) holds the outcome windows; this step feeds it the
one fact the database has (which capabilities' deployments crash-loop) and records each change
of condition as `capability.degraded` or `capability.recovered`. It sends nothing to a worker.
"""

from __future__ import annotations

import datetime as dt
import functools

from sqlalchemy import CompoundSelect, literal, select, union_all
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


_CRASH_LOOPING, _EXISTING = "crash-looping", "existing"


@functools.cache
def _question() -> CompoundSelect[str, str]:
    """The capabilities whose deployments crash-loop, and those of live deployments, each row
    tagged with which: one statement, built once, since the reconciler asks it on every pass
    (each statement costs its event loop about half a millisecond, issue 29) and it holds no
    value of its own."""
    crash_looping = (
        select(literal(_CRASH_LOOPING), Deployment.capability)
        .join(Residency, Residency.deployment_id == Deployment.deployment_id)
        .where(
            Residency.state != ResidencyState.COLD,
            Residency.last_failure_reason == CRASH_LOOP,
        )
        .distinct()
    )
    existing = (
        select(literal(_EXISTING), Deployment.capability)
        .where(Deployment.deleted_at.is_(None))
        .distinct()
    )
    return union_all(crash_looping, existing)


async def evaluate_degradation(
    session: AsyncSession, degradation: CapabilityDegradation, *, now: dt.datetime
) -> list[CapabilityHealth]:
    """Evaluate each capability's degradation from the outcomes recorded and the crash loops the
    database holds, in the caller's transaction (the reconciler's pass), auditing each change."""
    found: dict[str, set[str]] = {_CRASH_LOOPING: set(), _EXISTING: set()}
    for tag, capability in (await session.execute(_question())).all():
        found[tag].add(capability)
    crash_looping, existing = found[_CRASH_LOOPING], found[_EXISTING]
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
