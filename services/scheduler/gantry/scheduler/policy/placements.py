"""Placement answers and the holds they leave: which nodes take a deployment's replicas (the
rules are `placement.place`'s), and the provisional charge each answer puts on the nodes it chose.
A hold is kept on the resource ledger under its own holder id until the residency it was for is
announced (which then carries the charge), the control plane releases it, its node leaves, or it
lapses. Pure: the core hands it the nodes, the ledger and the time.

Without a hold, two placements asked back to back would both see the same free memory, and the
second residency's load would find the node full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gantry.scheduler.policy.events import (
    NodeInfo,
    PlacementMade,
    PlacementRefused,
    PlacementRequest,
)
from gantry.scheduler.policy.ledger import Ledger
from gantry.scheduler.policy.placement import NodeCandidate, NotPlaced, gpu_facts, place
from gantry.scheduler.policy.types import Claim


def hold_id(deployment_id: str, node_id: str) -> str:
    """The ledger holder a placement's charge on one node is kept under."""
    return f"placement:{deployment_id}:{node_id}"


class Placements:
    """Placement over the core's nodes and ledger, and every deployment's holds."""

    def __init__(self, nodes: Mapping[str, NodeInfo], ledger: Ledger) -> None:
        self._nodes = nodes  # the core's own map: read, never written here
        self._ledger = ledger
        self._lapses_at: dict[str, dict[str, float]] = {}  # deployment -> node -> lapses at
        self._candidates: list[NodeCandidate] | None = None  # the nodes placement weighs

    def nodes_changed(self) -> None:
        """A node came, went or changed: the candidates are weighed afresh at the next place."""
        self._candidates = None

    def place(
        self, request: PlacementRequest, *, exclude: set[str], hold_until: float
    ) -> PlacementMade | PlacementRefused:
        """Nodes for the request's replicas, none of `exclude` (those already serving or holding
        the deployment), each held until `hold_until`; or why none could be chosen."""
        if self._candidates is None:
            self._candidates = [
                NodeCandidate(
                    node_id=n.node_id,
                    connected=n.connected,
                    labels=n.labels,
                    gpus=gpu_facts(n.gpus, n.domains),
                )
                for n in self._nodes.values()
            ]
        result = place(
            nodes=self._candidates,
            ledger=self._ledger,
            claims=request.claims,
            required_labels=request.required_labels,
            replicas=max(1, request.replicas),
            exclude=exclude | self.nodes_held(request.deployment_id),
            policy=request.policy,
            gpu=request.gpu,
        )
        if isinstance(result, NotPlaced):
            return PlacementRefused(
                request_id=request.request_id,
                deployment_id=request.deployment_id,
                reason=result.reason,
                message=result.message,
                node_refusals=tuple(result.node_refusals),
            )
        self._hold(request.deployment_id, result.node_ids, request.claims, hold_until)
        return PlacementMade(
            request_id=request.request_id,
            deployment_id=request.deployment_id,
            node_ids=tuple(result.node_ids),
        )

    def nodes_held(self, deployment_id: str) -> set[str]:
        return set(self._lapses_at.get(deployment_id, ()))

    def release(self, deployment_id: str, node_ids: Iterable[str]) -> None:
        """The holds lapse now (one already turned into a residency, or lapsed, is not there)."""
        held = self._lapses_at.get(deployment_id)
        if held is None:
            return
        for node_id in node_ids:
            if held.pop(node_id, None) is not None:
                self._ledger.release(hold_id(deployment_id, node_id))
        if not held:
            del self._lapses_at[deployment_id]

    def forget_node(self, node_id: str) -> None:
        """The node left: every deployment's hold on it lapses now."""
        for deployment_id in [d for d, held in self._lapses_at.items() if node_id in held]:
            self.release(deployment_id, (node_id,))

    def lapse(self, now: float) -> None:
        """Holds whose residency was never announced in time give their charge back."""
        for deployment_id, held in list(self._lapses_at.items()):
            self.release(deployment_id, [n for n, at in held.items() if at <= now])

    def _hold(
        self, deployment_id: str, node_ids: Iterable[str], claims: Sequence[Claim], until: float
    ) -> None:
        held = self._lapses_at.setdefault(deployment_id, {})
        for node_id in node_ids:
            self._ledger.charge(hold_id(deployment_id, node_id), node_id, claims)
            held[node_id] = until
