"""Which deployment a capability's binding names, remembered briefly so Embed skips the database.

The database stays the truth: entries live for a second at most and every residency change this
control plane commits clears the cache. A binding that moves is stricter (the database calls
`routing_changing` before that commit and `routing_changed` after it): in between nothing is
served from the cache, so once the move is visible no request reaches the old deployment. A read
that started before a clear cannot put its (possibly stale) answer back afterwards: each clear
starts a new epoch and `put` only stores an answer read in the current one, with no change in
flight. A stale entry can otherwise only name a deployment that has stopped serving, and the
scheduler then answers DEPLOYMENT_NOT_READY for it.

A route in use is read again before it expires (`refresh_due`, `DeploymentResolver`): the first
call in its last REFRESH_AHEAD_S starts the read in the background and is answered from the
entry, so a steady caller never waits on the database for a route that is merely aging. Measured
(issue 29, `gantry up`, one caller): with the read on the call's path, the call that found its
route expired, one a second, spent 3-5 ms resolving where the others spent none, which is the
concurrency-1 p99. The refresh changes no freshness: an entry still answers only until
`expires_at`, and a clear still makes the next call read.
"""

from __future__ import annotations

from dataclasses import dataclass

from gantry.common.clock import Clock

TTL_SECONDS = 1.0
# How long before its expiry a route in use is read again in the background.
REFRESH_AHEAD_S = 0.25


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

    def refresh_due(self, capability: str) -> bool:
        """The route `get` just answered expires within REFRESH_AHEAD_S: read it again now."""
        route = self._routes.get(capability)
        return route is not None and route.expires_at - self._clock.monotonic() < REFRESH_AHEAD_S

    def put(self, capability: str, deployment_id: str, *, epoch: int | None = None) -> None:
        if self._changes_in_flight or (epoch is not None and epoch != self._epoch):
            return  # cleared since the answer was read (or a change commits): it may be stale
        self._routes[capability] = _Route(deployment_id, self._clock.monotonic() + self._ttl)

    def drop(self, capability: str) -> None:
        """Forget one route (a refresh found it no longer answers): the next call reads."""
        self._routes.pop(capability, None)

    def clear(self) -> None:
        self._epoch += 1
        self._routes.clear()

    def routing_changing(self) -> None:
        self._changes_in_flight += 1
        self.clear()

    def routing_changed(self) -> None:
        self._changes_in_flight = max(0, self._changes_in_flight - 1)
        self.clear()
