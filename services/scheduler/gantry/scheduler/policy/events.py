"""What goes into the scheduler's core and what comes out of it: plain values, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass

from gantry.scheduler.policy.admission import TenantLoadView
from gantry.scheduler.policy.autoscale import ScaleAdviceValue
from gantry.scheduler.policy.breakers import BreakerChange, BreakerView
from gantry.scheduler.policy.credits import CreditGranted, CreditsRevoked
from gantry.scheduler.policy.ledger import DomainView
from gantry.scheduler.policy.placement import (
    NO_GPU_CONSTRAINTS,
    GpuConstraints,
    GpuFacts,
    NodeRefusal,
)
from gantry.scheduler.policy.types import BreakerState, Claim, Domain, PlacementPolicy

# ---- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    connected: bool
    labels: frozenset[str] = frozenset()
    domains: tuple[Domain, ...] = ()
    adapters: frozenset[str] = frozenset()
    max_residencies: int = 0  # the worker's bound on model hosts; 0: none
    # Memory held by processes its worker did not start (VRAM, per device): the ledger charges it.
    external: tuple[Claim, ...] = ()
    gpus: tuple[GpuFacts, ...] = ()  # as its worker's NVML named them


@dataclass(frozen=True, slots=True)
class ResidencyInfo:
    residency_id: str
    deployment_id: str
    node_id: str
    phase: int  # a ResidencyPhase value
    claims: tuple[Claim, ...] = ()
    slots: int = 1
    replaces: str = ""


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    deployment_id: str
    replicas: int
    min_replicas: int
    max_replicas: int


@dataclass(frozen=True, slots=True)
class WorkRequest:
    work_id: str
    tenant_id: str
    deployment_id: str
    priority: int  # 0 = the tenant's default
    cost: int
    timeout_seconds: float = 0.0  # 0 = no deadline while queued
    # The slots it takes on a residency: its input count (an Embed's texts), at most the
    # residency's slots, so a call bigger than a residency runs there alone; 0 counts as 1.
    inputs: int = 1
    # The control-plane stream that submitted it (the service names each stream): its answer
    # goes back there, and it leaves with that stream (`SchedulerCore.drop_origin`).
    origin: str = ""


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    request_id: str
    deployment_id: str
    replicas: int
    claims: tuple[Claim, ...] = ()
    required_labels: frozenset[str] = frozenset()
    policy: PlacementPolicy = PlacementPolicy.BIN_PACK
    gpu: GpuConstraints = NO_GPU_CONSTRAINTS  # the operator's, on the GPU a replica runs on


# ---- decisions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatched:
    work_id: str
    residency_id: str
    node_id: str
    deployment_id: str


@dataclass(frozen=True, slots=True)
class WorkRejected:
    work_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class PlacementMade:
    request_id: str
    deployment_id: str
    node_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlacementRefused:
    request_id: str
    deployment_id: str
    reason: str
    message: str
    node_refusals: tuple[NodeRefusal, ...]


Decision = (
    Dispatched
    | WorkRejected
    | PlacementMade
    | PlacementRefused
    | BreakerChange
    | ScaleAdviceValue
    | CreditGranted
    | CreditsRevoked
)


# ---- what the core reads back -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResidencyLoadView:
    residency_id: str
    deployment_id: str
    node_id: str
    phase: int
    in_flight: int
    slots: int
    infra_failures: int
    breaker: BreakerState


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    queued: int
    in_flight: int
    dispatched_total: int
    rejected_total: int
    expired_total: int
    cancelled_total: int
    infra_failures_total: int
    tenants: list[TenantLoadView]
    ledger: list[DomainView]
    breakers: list[BreakerView]
    advice: list[ScaleAdviceValue]
    residencies: list[ResidencyLoadView]
    nodes: list[NodeInfo]
    credits: int = 0  # granted and not yet returned, on every stream
    credited_total: int = 0  # calls dispatched on credits (in dispatched_total too)
