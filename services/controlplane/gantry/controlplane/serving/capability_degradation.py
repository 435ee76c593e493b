"""When a capability is DEGRADED: a pure policy over a window of invocation outcomes.

The inference path records each finished invocation's outcome per capability; the reconciler's
pass (the one time-driven loop) calls `evaluate`, which returns the capabilities whose condition
changed, for it to audit. A capability is DEGRADED when, over the window, enough outcomes were
seen and too few succeeded, or when its deployment crash-loops. Only outcomes that say something
about the runtime or its configuration count (`inference_calls.degradation_outcome`): a success,
an INFRA failure, or a CONFIG one (INVOKE_OOM: the deployment's envelope fails calls its limits
admit); a bad request or a client that left says nothing about the model. This policy only
observes: it never decides anything for a worker.
"""

from __future__ import annotations

import collections
import datetime as dt
import enum
from collections.abc import Collection
from dataclasses import dataclass

from gantry.common.clock import Clock

SUCCESS_RATE_LOW = "SUCCESS_RATE_LOW"
CRASH_LOOP = "RUNTIME_CRASH_LOOP"


class Condition(enum.StrEnum):
    HEALTHY = "HEALTHY"
    DEGRADED = "DEGRADED"


@dataclass(frozen=True, kw_only=True)
class DegradationSettings:
    window_s: float = 300.0
    min_outcomes: int = 20  # fewer outcomes than this in the window decide nothing
    min_success_rate: float = 0.9
    # Bounds: outcomes kept per capability, and capabilities followed at all.
    max_outcomes_per_capability: int = 10_000
    max_capabilities: int = 1_024


@dataclass(frozen=True, kw_only=True)
class CapabilityHealth:
    capability: str
    condition: Condition
    success_rate: float  # over the window's outcomes; 1.0 with none
    outcomes: int
    reason: str  # why DEGRADED (SUCCESS_RATE_LOW, RUNTIME_CRASH_LOOP); "" when HEALTHY
    since: dt.datetime  # when the condition last changed


@dataclass
class _Window:
    outcomes: collections.deque[tuple[float, bool]]
    condition: Condition
    reason: str
    since: dt.datetime
    # The successes among `outcomes`, kept as they come and go: the rate is read on every pass
    # (and every state read), and summing a full window of 10,000 took the reconciler's event
    # loop about 0.3 ms each time (issue 29).
    successes: int = 0

    def add(self, at: float, succeeded: bool) -> None:
        outcomes = self.outcomes
        if outcomes.maxlen is not None and len(outcomes) == outcomes.maxlen:
            self.successes -= outcomes[0][1]  # the append below pushes the oldest out
        outcomes.append((at, succeeded))
        self.successes += succeeded

    def age_out(self, oldest: float) -> None:
        outcomes = self.outcomes
        while outcomes and outcomes[0][0] < oldest:
            self.successes -= outcomes.popleft()[1]


class CapabilityDegradation:
    def __init__(self, clock: Clock, settings: DegradationSettings | None = None) -> None:
        self._clock = clock
        self.settings = settings or DegradationSettings()
        self._windows: dict[str, _Window] = {}
        self.dropped = 0  # outcomes of capabilities past max_capabilities

    def record(self, capability: str, *, succeeded: bool) -> None:
        window = self._windows.get(capability)
        if window is None:
            if len(self._windows) >= self.settings.max_capabilities:
                self.dropped += 1
                return
            window = self._windows[capability] = _Window(
                outcomes=collections.deque(maxlen=self.settings.max_outcomes_per_capability),
                condition=Condition.HEALTHY,
                reason="",
                since=self._clock.now(),
            )
        window.add(self._clock.monotonic(), succeeded)

    def evaluate(self, *, crash_looping: Collection[str] = ()) -> list[CapabilityHealth]:
        """Age out old outcomes, decide each capability's condition; returns those that changed."""
        for capability in crash_looping:
            if capability not in self._windows and len(self._windows) < (
                self.settings.max_capabilities
            ):
                self._windows[capability] = _Window(
                    outcomes=collections.deque(maxlen=self.settings.max_outcomes_per_capability),
                    condition=Condition.HEALTHY,
                    reason="",
                    since=self._clock.now(),
                )
        oldest = self._clock.monotonic() - self.settings.window_s
        changed: list[CapabilityHealth] = []
        for capability, window in self._windows.items():
            window.age_out(oldest)
            rate, count = _rate(window)
            reason = ""
            if capability in crash_looping:
                reason = CRASH_LOOP
            elif count >= self.settings.min_outcomes and rate < self.settings.min_success_rate:
                reason = SUCCESS_RATE_LOW
            condition = Condition.DEGRADED if reason else Condition.HEALTHY
            if condition != window.condition:
                window.condition, window.since = condition, self._clock.now()
                window.reason = reason
                changed.append(self._health(capability, window))
            elif reason:
                window.reason = reason  # still DEGRADED, perhaps now for the other reason
        # A healthy capability with nothing left in its window is forgotten (keeps the bound).
        for capability in [
            c
            for c, w in self._windows.items()
            if not w.outcomes and w.condition is Condition.HEALTHY and c not in crash_looping
        ]:
            del self._windows[capability]
        return changed

    def retain(self, capabilities: Collection[str]) -> None:
        """Forget every capability not named (no deployment serves it any more): its window
        would otherwise show it, and later record it recovered, after it was deleted."""
        for capability in [c for c in self._windows if c not in capabilities]:
            del self._windows[capability]

    def states(self) -> list[CapabilityHealth]:
        return [self._health(c, w) for c, w in sorted(self._windows.items())]

    def _health(self, capability: str, window: _Window) -> CapabilityHealth:
        rate, count = _rate(window)
        return CapabilityHealth(
            capability=capability,
            condition=window.condition,
            success_rate=rate,
            outcomes=count,
            reason=window.reason,
            since=window.since,
        )


def _rate(window: _Window) -> tuple[float, int]:
    count = len(window.outcomes)
    if count == 0:
        return 1.0, 0
    return window.successes / count, count
