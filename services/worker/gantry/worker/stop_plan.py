"""When each step of the worker's own stop is due, decided once when the stop begins.

The worker's whole stop (SIGTERM to exit) must fit `WORKER_STOP_BOUND_S`, which its supervisor's
grace is derived from. Every model host and fork server is signalled at once and shares these
deadlines, so six hosts take as long as the slowest one, never six times one host's grace.
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.common.process import WORKER_STOP_BOUND_S

# Shares of the bound. Until the first, a SIGTERMed host (an EOFed fork server) may exit by
# itself; then the rest are SIGKILLed and waited for until the second. What is left closes the
# hosts' channels and lets the interpreter exit.
_TERM_SHARE = 0.5
_REAP_SHARE = 0.8
_MIN_EXIT_S = 1.0


@dataclass(frozen=True, kw_only=True)
class StopPlan:
    """Deadlines on one clock (the event loop's `time()`): SIGKILL at `kill_at`, stop waiting
    for reaps at `give_up_at`."""

    started_at: float
    kill_at: float
    give_up_at: float
    exit_by: float = 0.0  # the bound's end: the process is ended then if it has not exited

    @classmethod
    def starting(cls, now: float, bound_s: float = WORKER_STOP_BOUND_S) -> StopPlan:
        if bound_s <= 0:
            raise ValueError(f"a stop bound must be positive, not {bound_s:g}")
        return cls(
            started_at=now,
            kill_at=now + bound_s * _TERM_SHARE,
            give_up_at=now + bound_s * _REAP_SHARE,
            exit_by=now + bound_s,
        )

    def term_grace_s(self, now: float) -> float:
        """How long something signalled at `now` may take to exit before SIGKILL."""
        return max(0.0, self.kill_at - now)

    def reap_s(self, now: float) -> float:
        """How long to wait, after the SIGKILL due at `kill_at` (or at `now`, if later), for the
        process to be reaped."""
        return max(0.0, self.give_up_at - max(now, self.kill_at))

    def exit_s(self, now: float) -> float:
        """How long the interpreter's own exit may take from `now` before the process is ended
        (at least a second: logs flushed, atexit handlers run)."""
        return max(_MIN_EXIT_S, self.exit_by - now)

    def elapsed_s(self, now: float) -> float:
        return now - self.started_at
