"""Tells the scheduler what changed, after the commit, and forgets cached routes.

It subscribes to the domain events a commit publishes (platform/events.py; the subscriptions are
made in app.py): each method here is what one event means for the scheduler and the route cache.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gantry.controlplane.deployments.autoscale_rules import ReplicaBounds
from gantry.controlplane.deployments.requirements import NOTHING_CHARGED, ResidencyCharge
from gantry.controlplane.deployments.residency_charges import ChargeBook
from gantry.controlplane.nodes.capabilities import (
    domains_from_json,
    gpus_from_json,
    node_labels,
    registered_labels,
)
from gantry.controlplane.nodes.gpu_rules import stored_external_usage
from gantry.controlplane.platform import convert
from gantry.controlplane.platform.models import Deployment, Node, Residency
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.platform.state_machines import NodeState, ResidencyState
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.v1 import common_pb2, scheduler_pb2


def scheduler_residency(
    row: Residency, charge: ResidencyCharge
) -> scheduler_pb2.SchedulerResidency:
    """A residency with what it charges its node (the scheduler ignores it while COLD)."""
    return scheduler_pb2.SchedulerResidency(
        residency_id=row.residency_id,
        deployment_id=row.deployment_id,
        node_id=row.node_id,
        state=convert.enum_value(common_pb2.ResidencyState, "RESIDENCY_STATE_", row.state),
        claims=charge.claims(),
        slots=charge.slots,
    )


def scheduler_deployment(row: Deployment) -> scheduler_pb2.SchedulerDeployment:
    """What autoscale advice needs: the replicas wanted and the bounds (each explicit)."""
    bounds = ReplicaBounds.resolve(
        replicas=row.replicas, min_replicas=row.min_replicas, max_replicas=row.max_replicas
    )
    return scheduler_pb2.SchedulerDeployment(
        deployment_id=row.deployment_id,
        replicas=row.replicas,
        min_replicas=bounds.minimum,
        max_replicas=bounds.maximum,
    )


def scheduler_node(
    node_id: str,
    generation: int,
    inventory: dict[str, Any],
    connected: Collection[str],
    *,
    disabled: bool = False,
    labels: Mapping[str, str] | None = None,
) -> scheduler_pb2.SchedulerNode:
    """A node is CONNECTED for the scheduler only while its stream is open and it is enabled.
    `labels`: those it was registered with, offered as `key=value` beside the derived ones."""
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
        labels=sorted({*node_labels(inventory), *registered_labels(labels or {})}),
        domains=domains_from_json(inventory.get("domains", [])),
        max_residencies=int(inventory.get("max_residents", 0)),
        # GPU memory of processes the worker did not start, as its heartbeat last read it.
        external_usage=stored_external_usage(inventory),
        gpus=gpus_from_json(inventory.get("gpu_devices", [])),
    )


class Announcer:
    def __init__(self, *, scheduler: SchedulerLink, routes: RouteCache) -> None:
        self._scheduler = scheduler
        self._routes = routes
        self._charges = ChargeBook()

    def learn_charges(self, charges: Mapping[str, ResidencyCharge]) -> None:
        """Charges just read (by placement, by a snapshot): later announcements carry them."""
        self._charges.learn(charges)

    def residencies(self, rows: Sequence[Residency]) -> None:
        self._routes.clear()
        for row in rows:
            charge = self._charges.charge_of(row.deployment_id)
            if charge is None and row.state != ResidencyState.COLD:
                # Announced without claims it would release its charge in the ledger: have the
                # scheduler rebuild from a snapshot instead, which reads the charge with it.
                self._scheduler.resynchronise(
                    f"the charge of deployment {row.deployment_id} is not known here yet"
                )
                continue
            self._scheduler.residency_changed(scheduler_residency(row, charge or NOTHING_CHARGED))

    def node(self, row: Node, connected: Collection[str]) -> None:
        """A node changed; a deleted one is announced removed, whoever announces it (a
        goodbye of the stream its delete closed comes after the delete itself)."""
        self._routes.clear()
        if row.deleted_at is not None:
            self._scheduler.node_removed(row.node_id)
            return
        self._scheduler.node_changed(
            scheduler_node(
                row.node_id,
                row.generation,
                row.inventory,
                connected if row.state == NodeState.CONNECTED else (),
                disabled=row.state == NodeState.DISABLED,
                labels=row.labels,
            )
        )

    def deployments_changed(self) -> None:
        """Which deployment a capability reaches may have changed: forget cached routes."""
        self._routes.clear()

    def deployment(self, row: Deployment, *, removed: bool = False) -> None:
        """A deployment was created, scaled, or (removed) is being unloaded or was deleted."""
        self._routes.clear()
        self._scheduler.deployment_changed(
            scheduler_deployment(row), removed=removed or row.deleted_at is not None
        )
