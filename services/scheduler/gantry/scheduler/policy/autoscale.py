"""Replica advice per deployment from queue depth and queue wait: scale up at once, scale down only
after a quiet spell, and say something only when the advice changes.

desired = ceil((queued + in_flight) / (slots_per_replica * target_utilization)), raised to at
least one more than now while work waits longer than the latency target, clamped to
[min_replicas, max_replicas]. A scale-down needs desired < current to hold for
`scale_down_after_seconds` without a break, and then goes only to the largest desired value seen
in that spell, so one quiet sample cannot shed capacity the spell as a whole needed. A replica
count outside [min, max] (the operator moved the bounds) is brought inside them at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gantry.common.errors import GantryError


@dataclass(frozen=True, slots=True)
class ScaleSignal:
    deployment_id: str
    replicas: int
    min_replicas: int
    max_replicas: int
    queued: int
    in_flight: int
    slots_per_replica: int
    queue_wait_p50: float  # seconds


@dataclass(frozen=True, slots=True)
class ScaleAdviceValue:
    deployment_id: str
    desired_replicas: int
    current_replicas: int
    reason: str


@dataclass(slots=True)
class _Memory:
    last_advised: int | None = None
    quiet_since: float | None = None  # when desired < current began to hold
    quiet_peak: int = 0  # the largest desired value seen since then


class Autoscaler:
    """Advice, not action: the caller applies it (or not) and keeps feeding signals."""

    def __init__(
        self,
        *,
        target_utilization: float = 0.8,
        latency_target_seconds: float = 1.0,
        scale_down_after_seconds: float = 60.0,
    ) -> None:
        if not 0 < target_utilization <= 1:
            raise GantryError(
                "INVALID_ARGUMENT",
                f"target_utilization must be in (0, 1], got {target_utilization}",
            )
        self._target_utilization = target_utilization
        self._latency_target_seconds = latency_target_seconds
        self._scale_down_after_seconds = scale_down_after_seconds
        self._memory: dict[str, _Memory] = {}

    def advise(self, signal: ScaleSignal, now: float) -> ScaleAdviceValue | None:
        if signal.min_replicas >= signal.max_replicas:
            return None  # nothing to choose between
        memory = self._memory.setdefault(signal.deployment_id, _Memory())
        current = signal.replicas
        desired, why = self._desired(signal)
        if current < signal.min_replicas or current > signal.max_replicas:
            memory.quiet_since = None
            bounds = f"[{signal.min_replicas}, {signal.max_replicas}]"
            # Back inside the bounds at once; any further step down still waits its quiet spell.
            target = max(desired, min(current, signal.max_replicas))
            reason = f"{current} replicas is outside {bounds}; {why}"
        elif desired > current:
            memory.quiet_since = None
            target, reason = desired, why
        elif desired == current:
            memory.quiet_since = None
            target, reason = current, why
        else:
            if memory.quiet_since is None:
                memory.quiet_since, memory.quiet_peak = now, desired
            memory.quiet_peak = max(memory.quiet_peak, desired)
            quiet_for = now - memory.quiet_since
            if quiet_for < self._scale_down_after_seconds:
                return None
            target = memory.quiet_peak
            reason = f"{why}; below {current} replicas for {quiet_for:.0f}s"
            # The next step down needs a quiet spell of its own.
            memory.quiet_since = None
        previous = memory.last_advised if memory.last_advised is not None else current
        if target == previous:
            return None
        memory.last_advised = target
        return ScaleAdviceValue(
            deployment_id=signal.deployment_id,
            desired_replicas=target,
            current_replicas=current,
            reason=reason,
        )

    def forget(self, deployment_id: str) -> None:
        self._memory.pop(deployment_id, None)

    def _desired(self, signal: ScaleSignal) -> tuple[int, str]:
        outstanding = signal.queued + signal.in_flight
        capacity_per_replica = max(1, signal.slots_per_replica) * self._target_utilization
        # Rounded first so float noise (49 / (7 * 0.7) = 10.000000000000002) cannot add a replica.
        desired = math.ceil(round(outstanding / capacity_per_replica, 9))
        reason = (
            f"{signal.queued} waiting + {signal.in_flight} running need {desired} replicas at "
            f"{self._target_utilization:.0%} utilization"
        )
        if signal.queued and signal.queue_wait_p50 > self._latency_target_seconds:
            if desired < signal.replicas + 1:
                desired = signal.replicas + 1
                reason = (
                    f"queue wait p50 {signal.queue_wait_p50:.2f}s is over the "
                    f"{self._latency_target_seconds:.2f}s target with {signal.queued} waiting"
                )
        clamped = min(max(desired, signal.min_replicas), signal.max_replicas)
        if clamped != desired:
            reason += f" (clamped to {clamped})"
        return clamped, reason
