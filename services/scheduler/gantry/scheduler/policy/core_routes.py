"""Where a deployment's work can go (policy/core.py moves it there): its routable residencies
(RESIDENT, on a connected node) and, when none can serve, the refusal that says why. Pure; mixed
into `SchedulerCore`, whose state it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gantry.scheduler.policy.events import NodeInfo, ResidencyInfo
from gantry.scheduler.policy.residency_slots import ResidencySlots
from gantry.scheduler.policy.types import BreakerState, Refusal, ResidencyPhase

if TYPE_CHECKING:
    from gantry.scheduler.policy.breakers import BreakerBoard
    from gantry.scheduler.policy.core import CoreSettings


@dataclass(frozen=True, slots=True)
class _Route:
    routable: list[ResidencySlots]  # by node id, then residency id
    refusal: Refusal | None


class CoreRoutes:
    # deployment id -> its route, until a node, a residency or a breaker changes (whoever changes
    # one clears it)
    _routes: dict[str, _Route]

    if TYPE_CHECKING:  # what of SchedulerCore these rules read
        _settings: CoreSettings
        _nodes: dict[str, NodeInfo]
        _residencies: dict[str, ResidencySlots]
        _by_deployment: dict[str, set[str]]
        _breakers: BreakerBoard

    def _with_room(self, deployment_id: str, now: float) -> list[ResidencySlots]:
        """The routable residencies with a free slot whose breakers let a call through, by node
        id, then residency id."""
        return [
            residency
            for residency in self._route(deployment_id).routable
            if residency.in_flight < residency.info.slots
            and self._breakers.allows(residency.info.node_id, deployment_id, now)
        ]

    def _slots_of(self, deployment_id: str) -> tuple[int, int]:
        """The deployment's routable slots, and the most one of its residencies has."""
        slots = [r.info.slots for r in self._route(deployment_id).routable]
        return sum(slots), max(slots, default=1)

    def _unserviceable(self, deployment_id: str, now: float) -> Refusal | None:
        return self._route(deployment_id).refusal

    def _route(self, deployment_id: str) -> _Route:
        """The deployment's routable residencies and whether any can serve, cached until a node,
        a residency or a breaker changes (the hot path reads it on every submit and dispatch)."""
        route = self._routes.get(deployment_id)
        if route is None:
            routable = sorted(
                (
                    self._residencies[rid]
                    for rid in self._by_deployment.get(deployment_id, ())
                    if self._routable(self._residencies[rid].info)
                ),
                key=lambda r: (r.info.node_id, r.info.residency_id),
            )
            route = self._routes[deployment_id] = _Route(
                routable=routable,
                refusal=self._refusal(deployment_id, [r.info for r in routable]),
            )
        return route

    def _refusal(self, deployment_id: str, routable: list[ResidencyInfo]) -> Refusal | None:
        if not routable:
            return Refusal(
                "DEPLOYMENT_NOT_READY",
                f"deployment {deployment_id} has no resident residency on a connected node",
            )
        if all(self._open(info) for info in routable):
            return Refusal(
                "CIRCUIT_OPEN",
                f"every residency of deployment {deployment_id} has an open circuit breaker "
                f"after repeated infrastructure failures; retry after the cooldown "
                f"({self._settings.breaker_cooldown_seconds:g}s)",
            )
        return None

    def _routable(self, info: ResidencyInfo) -> bool:
        node = self._nodes.get(info.node_id)
        return info.phase == ResidencyPhase.RESIDENT and node is not None and node.connected

    def _open(self, info: ResidencyInfo) -> bool:
        return (
            self._breakers.state(info.node_id, info.deployment_id) == BreakerState.OPEN
            or self._breakers.state(info.node_id, "") == BreakerState.OPEN
        )
