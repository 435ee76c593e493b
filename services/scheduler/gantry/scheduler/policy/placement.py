"""Placement: which nodes take a deployment's replicas. Pure and deterministic: the same nodes,
ledger and claims give the same answer whatever the order of the node list.

Every node passes five gates in order (connected, not already holding a replica, labels cover the
requirement, a GPU meets the operator's GPU constraints, the ledger fits the claims); among those
that pass, BIN_PACK takes the fullest by its scarcest dimension and SPREAD the emptiest, ties by
node id. Placing charges nothing: the caller charges the ledger with what it decided.

The GPU constraints (a model, a minimum compute capability, a minimum of free VRAM) hold together
on one GPU: the one the deployment's VRAM claim names, else any GPU of the node. Free VRAM is what
the ledger leaves the GPU's memory domain (its margin, the residencies' charges and the memory of
processes Gantry did not start taken off), so it is NO_CAPACITY; the others are NO_ELIGIBLE_NODE.
"""

from __future__ import annotations

import heapq
import operator
import random
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gantry.scheduler.policy.domains import VRAM, Demand, demand_of, format_bytes
from gantry.scheduler.policy.ledger import Fit, Ledger
from gantry.scheduler.policy.types import Claim, Domain, PlacementPolicy, ResourceKind

# How many refused nodes the NotPlaced message names; node_refusals always lists them all.
_REFUSALS_IN_MESSAGE = 5


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One GPU of a node as its worker's NVML named it ("" where it did not say)."""

    device: int
    name: str = ""
    compute_capability: str = ""  # "major.minor"


@dataclass(frozen=True, slots=True)
class GpuConstraints:
    """What an operator requires of the GPU a replica runs on; the defaults require nothing."""

    model: str = ""  # a part of the GPU's name, compared case-insensitively
    min_compute_capability: tuple[int, int] | None = None
    min_free_vram: int = 0

    def __bool__(self) -> bool:
        return bool(self.model or self.min_compute_capability or self.min_free_vram)


NO_GPU_CONSTRAINTS = GpuConstraints()


@dataclass(frozen=True, slots=True)
class NodeCandidate:
    node_id: str
    connected: bool
    labels: frozenset[str]
    gpus: tuple[GpuFacts, ...] = ()  # by device; one per GPU NVML named or VRAM domain declared


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
    gpu: GpuConstraints = NO_GPU_CONSTRAINTS,
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
    if gpu:
        by_id = {node.node_id: node for node in nodes}
        eligible = [n for n in eligible if _gpu_refusal(by_id[n], ledger, demand, gpu) is None]
    best = ledger.free_fractions(eligible, demand)
    if not best:
        return _not_placed(nodes, ledger, demand, required_labels, excluded, gpu)
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
    gpu: GpuConstraints = NO_GPU_CONSTRAINTS,
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
    if gpu and (refusal := _gpu_refusal(node, ledger, demand, gpu)) is not None:
        return refusal
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
    gpu: GpuConstraints,
) -> NotPlaced:
    refusals = sorted(
        (
            refusal
            for node in nodes
            if (refusal := refusal_of(node, ledger, demand, required_labels, exclude, gpu))
            is not None
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


def _gpu_refusal(
    node: NodeCandidate, ledger: Ledger, demand: Demand, gpu: GpuConstraints
) -> NodeRefusal | None:
    """None when one GPU the replica may run on meets every GPU constraint; else why not, for
    each such GPU (NO_CAPACITY only when free VRAM is all that every one of them lacks)."""
    claimed = {device for kind, device, _ in demand.parts if kind == VRAM}
    gpus = [g for g in node.gpus if not claimed or g.device in claimed]
    if not gpus:
        where = f"GPU {min(claimed)}" if claimed else "GPU"
        return NodeRefusal(node.node_id, "NO_ELIGIBLE_NODE", f"no {where} reported")
    failures: list[tuple[int, str, str]] = []
    for facts in gpus:
        failure = _gpu_failure(facts, ledger.gpu_headroom(node.node_id, facts.device), gpu)
        if failure is None:
            return None
        failures.append((facts.device, *failure))
    reason = (
        "NO_CAPACITY"
        if all(reason == "NO_CAPACITY" for _, reason, _ in failures)
        else "NO_ELIGIBLE_NODE"
    )
    if len(failures) == 1:
        return NodeRefusal(node.node_id, reason, failures[0][2])
    message = "; ".join(f"GPU {device}: {text}" for device, _, text in failures)
    return NodeRefusal(node.node_id, reason, message)


def _gpu_failure(
    facts: GpuFacts, headroom: int | None, gpu: GpuConstraints
) -> tuple[str, str] | None:
    """The first GPU constraint this GPU fails, as (reason, message), or None."""
    if gpu.model and gpu.model.casefold() not in facts.name.casefold():
        return "NO_ELIGIBLE_NODE", f"gpu model {facts.name or 'unknown'} is not {gpu.model}"
    if gpu.min_compute_capability is not None:
        wanted = ".".join(map(str, gpu.min_compute_capability))
        have = parse_compute_capability(facts.compute_capability)
        if have is None or have < gpu.min_compute_capability:
            shown = facts.compute_capability or "unknown"
            return "NO_ELIGIBLE_NODE", f"compute capability {shown} < {wanted}"
    if gpu.min_free_vram and (headroom or 0) < gpu.min_free_vram:
        if headroom is None:
            return "NO_ELIGIBLE_NODE", f"GPU {facts.device} has no VRAM domain"
        return (
            "NO_CAPACITY",
            f"free VRAM {format_bytes(headroom)} < {format_bytes(gpu.min_free_vram)}",
        )
    return None


def parse_compute_capability(text: str) -> tuple[int, int] | None:
    """ "8.0" as (8, 0); None for anything else (a GPU whose worker did not say)."""
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        return None
    return int(major), int(minor)


def gpu_facts(gpus: Sequence[GpuFacts], domains: Sequence[Domain]) -> tuple[GpuFacts, ...]:
    """A node's GPUs by device: those its worker named, and one without a name for each VRAM
    (or unified) domain it declares that no named GPU covers (free VRAM is still known there)."""
    named = {facts.device: facts for facts in gpus}
    for domain in domains:
        if domain.kind in (ResourceKind.VRAM, ResourceKind.UNIFIED):
            named.setdefault(domain.device, GpuFacts(domain.device))
    return tuple(named[device] for device in sorted(named))


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
