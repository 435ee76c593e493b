"""When a crashed model host restarts: exponential backoff, and crash-loop detection in a window.

Pure policy: no asyncio, no processes, time only from the injected clock. The supervisor feeds it
each crash and sleeps for the delay it returns.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from gantry.common.clock import Clock


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    # `crash_loop_threshold` crashes within `crash_loop_window_s` make a crash loop.
    crash_loop_threshold: int = 3
    crash_loop_window_s: float = 300.0
    # While crash-looping, restarts continue (the fault may be transient) but only this often.
    crash_loop_backoff_s: float = 60.0

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s")
        if self.crash_loop_threshold < 1 or self.crash_loop_window_s <= 0:
            raise ValueError("need crash_loop_threshold >= 1 and crash_loop_window_s > 0")
        if self.crash_loop_backoff_s < 0:
            raise ValueError("need crash_loop_backoff_s >= 0")


@dataclass(frozen=True, kw_only=True)
class RestartDecision:
    delay_s: float
    crash_loop: bool
    crashes_in_window: int


class CrashHistory:
    """The recent crashes of one resident's host and the restart each one earns."""

    def __init__(self, policy: RestartPolicy, clock: Clock) -> None:
        self._policy = policy
        self._clock = clock
        self._crashed_at: collections.deque[float] = collections.deque()

    def record_crash(self) -> RestartDecision:
        self._forget_old()
        self._crashed_at.append(self._clock.monotonic())
        crashes = len(self._crashed_at)
        if crashes >= self._policy.crash_loop_threshold:
            return RestartDecision(
                delay_s=self._policy.crash_loop_backoff_s,
                crash_loop=True,
                crashes_in_window=crashes,
            )
        # The first crash waits `initial_backoff_s`; each further one within the window doubles it.
        delay = min(self._policy.initial_backoff_s * 2 ** (crashes - 1), self._policy.max_backoff_s)
        return RestartDecision(delay_s=delay, crash_loop=False, crashes_in_window=crashes)

    @property
    def crash_loop(self) -> bool:
        """Still looping now: the window slides, so a host that stays up long enough leaves it."""
        self._forget_old()
        return len(self._crashed_at) >= self._policy.crash_loop_threshold

    @property
    def crashes_in_window(self) -> int:
        self._forget_old()
        return len(self._crashed_at)

    def _forget_old(self) -> None:
        horizon = self._clock.monotonic() - self._policy.crash_loop_window_s
        while self._crashed_at and self._crashed_at[0] <= horizon:
            self._crashed_at.popleft()
