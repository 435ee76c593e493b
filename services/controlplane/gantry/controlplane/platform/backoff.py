"""Per-key exponential backoff for retried reconciler actions. Pure: time from an injected clock."""

from __future__ import annotations

from dataclasses import dataclass

from gantry.common.clock import Clock


@dataclass(slots=True)
class _Attempts:
    failures: int
    next_at: float


class Backoff:
    def __init__(self, clock: Clock, *, initial_s: float, max_s: float) -> None:
        self._clock = clock
        self._initial = initial_s
        self._max = max_s
        self._keys: dict[str, _Attempts] = {}

    def due(self, key: str) -> bool:
        attempts = self._keys.get(key)
        return attempts is None or self._clock.monotonic() >= attempts.next_at

    def failed(self, key: str) -> float:
        """Record a failed attempt; returns the seconds until the next one is due."""
        failures = self._keys[key].failures + 1 if key in self._keys else 1
        delay = min(self._initial * 2 ** (failures - 1), self._max)
        self._keys[key] = _Attempts(failures=failures, next_at=self._clock.monotonic() + delay)
        return delay

    def succeeded(self, key: str) -> None:
        self._keys.pop(key, None)

    def reset(self) -> None:
        """Every key due now: what they waited for may have changed."""
        self._keys.clear()

    def forget_except(self, keys: set[str]) -> None:
        for key in [k for k in self._keys if k not in keys]:
            del self._keys[key]
