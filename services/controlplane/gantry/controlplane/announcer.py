"""Tells the scheduler what changed, after the commit, and forgets cached routes."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from gantry.controlplane import convert
from gantry.controlplane.domain.transitions import NodeState
from gantry.controlplane.persistence.models import Node, Residency
from gantry.controlplane.route_cache import RouteCache
from gantry.controlplane.scheduler_link import SchedulerLink
from gantry.v1 import common_pb2, scheduler_pb2


def scheduler_residency(row: Residency) -> scheduler_pb2.SchedulerResidency:
    return scheduler_pb2.SchedulerResidency(
        residency_id=row.residency_id,
        deployment_id=row.deployment_id,
        node_id=row.node_id,
        state=convert.enum_value(common_pb2.ResidencyState, "RESIDENCY_STATE_", row.state),
    )


def scheduler_node(
    node_id: str,
    generation: int,
    inventory: dict[str, Any],
    connected: Collection[str],
    *,
    disabled: bool = False,
) -> scheduler_pb2.SchedulerNode:
    """A node is CONNECTED for the scheduler only while its stream is open and it is enabled."""
    if disabled:
        state = common_pb2.NODE_STATE_DISABLED
    elif node_id in connected:
        state = common_pb2.NODE_STATE_CONNECTED
    else:
        state = common_pb2.NODE_STATE_DISCONNECTED
    return scheduler_pb2.SchedulerNode(
        node_id=node_id,
        state=state,
        generation=generation,
        adapters=sorted(inventory.get("adapters", [])),
    )


class Announcer:
    def __init__(self, *, scheduler: SchedulerLink, routes: RouteCache) -> None:
        self._scheduler = scheduler
        self._routes = routes

    def residencies(self, rows: Sequence[Residency]) -> None:
        self._routes.clear()
        for row in rows:
            self._scheduler.residency_changed(scheduler_residency(row))

    def node(self, row: Node, connected: Collection[str]) -> None:
        self._routes.clear()
        self._scheduler.node_changed(
            scheduler_node(
                row.node_id,
                row.generation,
                row.inventory,
                connected if row.state == NodeState.CONNECTED else (),
                disabled=row.state == NodeState.DISABLED,
            )
        )

    def deployments_changed(self) -> None:
        self._routes.clear()
