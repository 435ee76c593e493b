"""When to restart a child that exited: exponential backoff, reset once a child stays up (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gantry.common.clock import Clock


@dataclass(frozen=True, slots=True, kw_only=True)
class BackoffSettings:
    initial_s: float = 1.0
    maximum_s: float = 30.0
    # A child that ran this long was healthy: its next crash starts the backoff over.
    reset_after_s: float = 60.0


class RestartBackoff:
    """One child's backoff: 1 s doubling to 30 s, back to 1 s after 60 s of uptime."""

    def __init__(self, settings: BackoffSettings, clock: Clock) -> None:
        self._settings = settings
        self._clock = clock
        self._next_delay_s = settings.initial_s
        self._started_at: float | None = None

    def started(self) -> None:
        self._started_at = self._clock.monotonic()

    def uptime_s(self) -> float:
        if self._started_at is None:
            return 0.0
        return self._clock.monotonic() - self._started_at

    def exited(self) -> float:
        """The delay before the restart of a child that just exited."""
        if self.uptime_s() >= self._settings.reset_after_s:
            self._next_delay_s = self._settings.initial_s
        delay = self._next_delay_s
        self._next_delay_s = min(delay * 2, self._settings.maximum_s)
        self._started_at = None
        return delay
