"""Which deployment a capability's binding names, remembered briefly so Embed skips the database.

The database stays the truth: entries live for a second at most and every residency change this
control plane commits clears the cache. A binding that moves is stricter (the database calls
`routing_changing` before that commit and `routing_changed` after it): in between nothing is
served from the cache, so once the move is visible no request reaches the old deployment. A read
that started before a clear cannot put its (possibly stale) answer back afterwards: each clear
starts a new epoch and `put` only stores an answer read in the current one, with no change in
flight. A stale entry can otherwise only name a deployment that has stopped serving, and the
scheduler then answers DEPLOYMENT_NOT_READY for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.common.clock import Clock

TTL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _Route:
    deployment_id: str
    expires_at: float


class RouteCache:
    def __init__(self, clock: Clock, *, ttl_seconds: float = TTL_SECONDS) -> None:
        self._clock = clock
        self._ttl = ttl_seconds
        self._routes: dict[str, _Route] = {}
        self._epoch = 0
        self._changes_in_flight = 0

    @property
    def epoch(self) -> int:
        """Read before looking a binding up; hand it to `put` with the answer."""
        return self._epoch

    def current(self, epoch: int) -> bool:
        """True when nothing was cleared since `epoch` was read and no change is in flight: an
        answer being read in `epoch` is as fresh as one read now."""
        return epoch == self._epoch and not self._changes_in_flight

    def get(self, capability: str) -> str | None:
        if self._changes_in_flight:
            return None
        route = self._routes.get(capability)
        if route is None or route.expires_at < self._clock.monotonic():
            return None
        return route.deployment_id

    def put(self, capability: str, deployment_id: str, *, epoch: int | None = None) -> None:
        if self._changes_in_flight or (epoch is not None and epoch != self._epoch):
            return  # cleared since the answer was read (or a change commits): it may be stale
        self._routes[capability] = _Route(deployment_id, self._clock.monotonic() + self._ttl)

    def clear(self) -> None:
        self._epoch += 1
        self._routes.clear()

    def routing_changing(self) -> None:
        self._changes_in_flight += 1
        self.clear()

    def routing_changed(self) -> None:
        self._changes_in_flight = max(0, self._changes_in_flight - 1)
        self.clear()
