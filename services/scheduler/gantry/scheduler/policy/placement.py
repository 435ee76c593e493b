"""Placement: which nodes take a deployment's replicas. Pure and deterministic: the same nodes,
ledger and claims give the same answer whatever the order of the node list.

Every node passes four gates in order (connected, not already holding a replica, labels cover the
requirement, the ledger fits the claims); among those that pass, BIN_PACK takes the fullest by its
scarcest dimension and SPREAD the emptiest, ties by node id. Placing charges nothing: the caller
charges the ledger with what it decided.
"""

from __future__ import annotations

import heapq
import operator
import random
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gantry.scheduler.policy.domains import Demand, demand_of
from gantry.scheduler.policy.ledger import Fit, Ledger
from gantry.scheduler.policy.types import Claim, Domain, PlacementPolicy, ResourceKind

# How many refused nodes the NotPlaced message names; node_refusals always lists them all.
_REFUSALS_IN_MESSAGE = 5


@dataclass(frozen=True, slots=True)
class NodeCandidate:
    node_id: str
    connected: bool
    labels: frozenset[str]


@dataclass(frozen=True, slots=True)
class NodeRefusal:
    node_id: str
    reason: str  # NO_ELIGIBLE_NODE | NO_CAPACITY
    message: str


@dataclass(frozen=True, slots=True)
class Placed:
    node_ids: list[str]  # distinct, best first; at least one


@dataclass(frozen=True, slots=True)
class NotPlaced:
    reason: str  # NO_CAPACITY if any node failed only on capacity, else NO_ELIGIBLE_NODE
    message: str
    node_refusals: list[NodeRefusal]  # every node, sorted by node id


def place(
    *,
    nodes: Sequence[NodeCandidate],
    ledger: Ledger,
    claims: Sequence[Claim],
    required_labels: frozenset[str],
    replicas: int,
    exclude: Collection[str],
    policy: PlacementPolicy,
) -> Placed | NotPlaced:
    """Up to ``replicas`` distinct nodes for the claims, best first (fewer if fewer fit)."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    demand = demand_of(claims)
    excluded = exclude if isinstance(exclude, (set, frozenset)) else frozenset(exclude)
    spread = policy == PlacementPolicy.SPREAD
    # Hot loop: messages are only built when nothing fits, in a second pass.
    eligible = [
        node.node_id
        for node in nodes
        if node.connected and node.node_id not in excluded and required_labels <= node.labels
    ]
    best = ledger.free_fractions(eligible, demand)
    if not best:
        return _not_placed(nodes, ledger, demand, required_labels, excluded)
    # BIN_PACK: the least free first; SPREAD: the most free first. Ties by node id either way.
    scores = map(operator.neg, best.values()) if spread else iter(best.values())
    ranked = zip(scores, best.keys(), strict=True)
    if replicas == 1:
        return Placed([min(ranked)[1]])
    return Placed([node_id for _, node_id in heapq.nsmallest(replicas, ranked)])


def refusal_of(
    node: NodeCandidate,
    ledger: Ledger,
    demand: Demand,
    required_labels: frozenset[str],
    exclude: Collection[str],
) -> NodeRefusal | None:
    """The first gate the node fails, or None when it can take the demand."""
    if not node.connected:
        return NodeRefusal(node.node_id, "NO_ELIGIBLE_NODE", "not connected")
    if node.node_id in exclude:
        return NodeRefusal(node.node_id, "NO_ELIGIBLE_NODE", "already holds a replica")
    missing = required_labels - node.labels
    if missing:
        return NodeRefusal(
            node.node_id, "NO_ELIGIBLE_NODE", f"missing labels: {', '.join(sorted(missing))}"
        )
    outcome = ledger.measure(node.node_id, demand)
    if isinstance(outcome, Fit):
        return NodeRefusal(node.node_id, outcome.reason, outcome.message)
    return None


def _not_placed(
    nodes: Sequence[NodeCandidate],
    ledger: Ledger,
    demand: Demand,
    required_labels: frozenset[str],
    exclude: Collection[str],
) -> NotPlaced:
    refusals = sorted(
        (
            refusal
            for node in nodes
            if (refusal := refusal_of(node, ledger, demand, required_labels, exclude)) is not None
        ),
        key=lambda refusal: (refusal.node_id, refusal.reason, refusal.message),
    )
    reason = (
        "NO_CAPACITY"
        if any(refusal.reason == "NO_CAPACITY" for refusal in refusals)
        else "NO_ELIGIBLE_NODE"
    )
    if not refusals:
        return NotPlaced(reason, "0 of 0 nodes can take it: no node is known", [])
    named = ", ".join(
        f"{refusal.node_id} {refusal.reason} ({refusal.message})"
        for refusal in refusals[:_REFUSALS_IN_MESSAGE]
    )
    more = len(refusals) - _REFUSALS_IN_MESSAGE
    if more > 0:
        named += f", and {more} more"
    return NotPlaced(reason, f"0 of {len(refusals)} nodes can take it: {named}", refusals)


def bench_placement(nodes: int, placements: int) -> float:
    """Placements per second on one core: ``nodes`` connected nodes of two domains each (host
    RAM, one GPU), partly filled, placing one replica at a time and charging it as the scheduler
    does (older placements are released, so the fill stays steady). For ``make bench``, not a
    test; it is the one function here that reads the clock."""
    rng = random.Random(8)
    ledger = Ledger()
    candidates = []
    gib = 1 << 30
    for index in range(nodes):
        node_id = f"node-{index:04d}"
        ledger.set_node(
            node_id,
            [
                Domain("host.ram", ResourceKind.RAM, 64 * gib, margin=4 * gib),
                Domain("gpu0.vram", ResourceKind.VRAM, 80 * gib, margin=2 * gib, device=0),
            ],
        )
        ledger.charge(
            f"resident-{index:04d}",
            node_id,
            [
                Claim(ResourceKind.RAM, rng.randrange(0, 60) * gib),
                Claim(ResourceKind.VRAM, rng.randrange(0, 78) * gib, device=0),
            ],
        )
        candidates.append(NodeCandidate(node_id, True, frozenset({"adapter:st", "gpu"})))
    envelopes = [
        [Claim(ResourceKind.RAM, ram * gib), Claim(ResourceKind.VRAM, vram * gib, device=0)]
        for ram, vram in ((2, 4), (4, 16), (1, 1), (8, 24))
    ]
    policies = (PlacementPolicy.BIN_PACK, PlacementPolicy.SPREAD)
    in_flight = 50
    started = time.perf_counter()
    for round_index in range(placements):
        claims = envelopes[round_index % len(envelopes)]
        decision = place(
            nodes=candidates,
            ledger=ledger,
            claims=claims,
            required_labels=frozenset({"gpu"}),
            replicas=1,
            exclude=(),
            policy=policies[round_index % 2],
        )
        if isinstance(decision, Placed):
            ledger.charge(f"placement-{round_index}", decision.node_ids[0], claims)
        ledger.release(f"placement-{round_index - in_flight}")
    elapsed = time.perf_counter() - started
    return placements / elapsed if elapsed > 0 else float("inf")
