"""Which residency serves a piece of work, and which nodes take a new deployment. Pure rules."""

from __future__ import annotations

from dataclasses import dataclass

from gantry.scheduler.policy.cluster import ClusterView, ResidencyView


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str  # an ErrorInfo reason
    message: str


def choose_residency(view: ClusterView, deployment_id: str) -> ResidencyView | Refusal:
    """The least-loaded resident residency of the deployment on a connected node.

    Ties break by node id, then residency id, so the same state always gives the same answer.
    """
    candidates = [
        residency
        for residency in view.residencies.values()
        if residency.deployment_id == deployment_id
        and residency.resident
        and (node := view.nodes.get(residency.node_id)) is not None
        and node.connected
    ]
    if not candidates:
        return Refusal(
            "DEPLOYMENT_NOT_READY", f"deployment {deployment_id} has no resident, healthy residency"
        )
    return min(candidates, key=lambda r: (r.in_flight, r.node_id, r.residency_id))


def choose_nodes(
    view: ClusterView, *, deployment_id: str, replicas: int, required_adapter: str
) -> list[str] | Refusal:
    """Spread: the connected nodes that support the adapter, fewest residencies first."""
    already = {
        residency.node_id
        for residency in view.residencies.values()
        if residency.deployment_id == deployment_id
    }
    load = {node_id: 0 for node_id in view.nodes}
    for residency in view.residencies.values():
        if residency.node_id in load:
            load[residency.node_id] += 1
    eligible = [
        node
        for node in view.nodes.values()
        if node.connected
        and node.node_id not in already
        and (not required_adapter or required_adapter in node.adapters)
    ]
    if len(eligible) < replicas:
        return Refusal(
            "NO_ELIGIBLE_NODE",
            f"{len(eligible)} connected node(s) can run adapter {required_adapter!r}, "
            f"{replicas} needed",
        )
    eligible.sort(key=lambda node: (load[node.node_id], node.node_id))
    return [node.node_id for node in eligible[:replicas]]
