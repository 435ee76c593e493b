"""Which deployment serves a capability, remembered briefly so Embed skips the database.

The database stays the truth: entries live for a second at most and every residency change this
control plane commits clears the cache. A stale entry can only name a deployment that has stopped
serving, and the scheduler then answers DEPLOYMENT_NOT_READY for it.
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

    def get(self, capability: str) -> str | None:
        route = self._routes.get(capability)
        if route is None or route.expires_at < self._clock.monotonic():
            return None
        return route.deployment_id

    def put(self, capability: str, deployment_id: str) -> None:
        self._routes[capability] = _Route(deployment_id, self._clock.monotonic() + self._ttl)

    def clear(self) -> None:
        self._routes.clear()
