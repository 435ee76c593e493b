"""The scheduler's in-memory view of the cluster, rebuilt from the control plane on connect.

Updates are upserts keyed by id, so applying one twice (a snapshot and then the update that was
already in it, as the control plane does while it replays on reconnect) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gantry.v1 import common_pb2, scheduler_pb2


@dataclass(slots=True)
class NodeView:
    node_id: str
    connected: bool
    adapters: frozenset[str]


@dataclass(slots=True)
class ResidencyView:
    residency_id: str
    deployment_id: str
    node_id: str
    resident: bool
    in_flight: int = 0
    # Finished work that says something about this residency's health (INFRA failures only).
    infra_failures: int = 0


@dataclass(slots=True)
class ClusterView:
    nodes: dict[str, NodeView] = field(default_factory=dict)
    residencies: dict[str, ResidencyView] = field(default_factory=dict)
    # work id -> residency id, for the in-flight accounting that least-loaded routing reads.
    assignments: dict[str, str] = field(default_factory=dict)

    def reset(self) -> None:
        self.nodes.clear()
        self.residencies.clear()
        self.assignments.clear()

    def upsert_node(self, node_id: str, *, state: int, adapters: frozenset[str]) -> None:
        self.nodes[node_id] = NodeView(
            node_id=node_id,
            connected=state == common_pb2.NODE_STATE_CONNECTED,
            adapters=adapters,
        )

    def upsert_residency(
        self, residency_id: str, *, deployment_id: str, node_id: str, state: int
    ) -> None:
        if state == common_pb2.RESIDENCY_STATE_COLD:
            self.residencies.pop(residency_id, None)
            return
        previous = self.residencies.get(residency_id)
        self.residencies[residency_id] = ResidencyView(
            residency_id=residency_id,
            deployment_id=deployment_id,
            node_id=node_id,
            resident=state == common_pb2.RESIDENCY_STATE_RESIDENT,
            in_flight=previous.in_flight if previous else 0,
            infra_failures=previous.infra_failures if previous else 0,
        )

    def start_work(self, work_id: str, residency_id: str) -> None:
        self.assignments[work_id] = residency_id
        self.residencies[residency_id].in_flight += 1

    def finish_work(
        self, work_id: str, outcome: int = scheduler_pb2.WORK_OUTCOME_SUCCESS
    ) -> ResidencyView | None:
        """Release the work's slot; count the outcome only when it speaks to health."""
        residency_id = self.assignments.pop(work_id, None)
        residency = self.residencies.get(residency_id) if residency_id else None
        if residency is None:
            return None
        if residency.in_flight > 0:
            residency.in_flight -= 1
        if counts_against_health(outcome):
            residency.infra_failures += 1
        return residency


def counts_against_health(outcome: int) -> bool:
    """Only an INFRA failure says the residency is unwell. A cancelled call (the client went
    away, or its own deadline passed) and a bad request say nothing about it."""
    return outcome == scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE
