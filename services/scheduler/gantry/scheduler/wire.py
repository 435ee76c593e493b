"""The scheduler's proto messages to and from the pure core's values: one place converts."""

from __future__ import annotations

from typing import Any

from gantry.common.errors import GantryError
from gantry.scheduler.policy import events
from gantry.scheduler.policy.admission import TenantLoadView
from gantry.scheduler.policy.autoscale import ScaleAdviceValue
from gantry.scheduler.policy.breakers import BreakerChange, BreakerView
from gantry.scheduler.policy.credits import CreditGranted, CreditsRevoked
from gantry.scheduler.policy.ledger import DomainView
from gantry.scheduler.policy.placement import GpuConstraints, GpuFacts, parse_compute_capability
from gantry.scheduler.policy.types import (
    ALL_PRIORITIES,
    DEFAULT_BUDGET_WINDOW_SECONDS,
    Claim,
    Domain,
    PlacementPolicy,
    Priority,
    TenantPolicy,
)
from gantry.v1 import common_pb2, scheduler_pb2

DEFAULT_SLOTS = 1  # SchedulerResidency.slots 0, as the proto says
_KNOWN_PRIORITIES = frozenset(int(p) for p in Priority)


def node(message: scheduler_pb2.SchedulerNode) -> events.NodeInfo:
    adapters = frozenset(message.adapters)
    # A node that sends no labels (an older control plane) is labelled from its adapters.
    labels = frozenset(message.labels) or frozenset(
        {f"adapter:{name}" for name in adapters} | {"device:cpu"}
    )
    return events.NodeInfo(
        node_id=message.node_id,
        connected=message.state == common_pb2.NODE_STATE_CONNECTED,
        labels=labels,
        domains=tuple(
            Domain(
                name=d.name,
                kind=d.kind,
                capacity=d.capacity_bytes,
                margin=d.safety_margin_bytes,
                device=d.device,
            )
            for d in message.domains
        ),
        adapters=adapters,
        max_residencies=message.max_residencies,
        external=claims(list(message.external_usage)),
        gpus=tuple(
            GpuFacts(device=g.device, name=g.name, compute_capability=g.compute_capability)
            for g in message.gpus
        ),
    )


def claims(messages: list[common_pb2.ResourceClaim]) -> tuple[Claim, ...]:
    return tuple(Claim(kind=c.kind, bytes=c.bytes, device=c.device) for c in messages)


def residency(message: scheduler_pb2.SchedulerResidency) -> events.ResidencyInfo:
    return events.ResidencyInfo(
        residency_id=message.residency_id,
        deployment_id=message.deployment_id,
        node_id=message.node_id,
        phase=message.state,
        claims=claims(list(message.claims)),
        slots=message.slots or DEFAULT_SLOTS,
        replaces=message.replaces_residency_id,
    )


def deployment(message: scheduler_pb2.SchedulerDeployment) -> events.DeploymentInfo:
    replicas = max(1, message.replicas)
    return events.DeploymentInfo(
        deployment_id=message.deployment_id,
        replicas=replicas,
        min_replicas=message.min_replicas or replicas,
        max_replicas=message.max_replicas or replicas,
    )


def tenant_policy(message: common_pb2.TenantPolicy) -> TenantPolicy:
    return TenantPolicy(
        tenant_id=message.tenant_id,
        weight=message.weight or 1,
        max_queue_depth=message.max_queue_depth,
        max_concurrency=message.max_concurrency,
        budget_units=message.budget_units,
        budget_window_seconds=message.budget_window_seconds or DEFAULT_BUDGET_WINDOW_SECONDS,
        # A value this scheduler does not know grants nothing (the control plane validates them).
        allowed_priorities=frozenset(
            Priority(p) for p in message.allowed_priorities if p in _KNOWN_PRIORITIES
        )
        or ALL_PRIORITIES,
    )


def work(message: scheduler_pb2.WorkSubmitted, *, origin: str = "") -> events.WorkRequest:
    return events.WorkRequest(
        work_id=message.work_id,
        tenant_id=message.tenant_id,
        deployment_id=message.deployment_id,
        priority=message.priority,
        cost=max(1, message.cost),
        timeout_seconds=max(0.0, message.timeout_seconds),
        inputs=max(1, message.inputs),  # 0 (an older control plane): one slot, as before
        origin=origin,
    )


def placement(message: scheduler_pb2.PlaceDeployment) -> events.PlacementRequest:
    labels = set(message.required_labels) | set(message.constraints.node_labels)
    if message.required_adapter:
        labels.add(f"adapter:{message.required_adapter}")
    return events.PlacementRequest(
        request_id=message.request_id,
        deployment_id=message.deployment_id,
        replicas=max(1, message.replicas),
        claims=claims(list(message.claims)),
        required_labels=frozenset(labels),
        policy=(
            PlacementPolicy.SPREAD
            if message.policy == common_pb2.PLACEMENT_POLICY_SPREAD
            else PlacementPolicy.BIN_PACK
        ),
        gpu=gpu_constraints(message.constraints),
    )


def gpu_constraints(message: common_pb2.PlacementConstraints) -> GpuConstraints:
    """The GPU fields of an operator's constraints (the control plane checked their form; a
    capability it could not have sent is read as no requirement rather than as 0.0)."""
    return GpuConstraints(
        model=message.gpu_model.strip(),
        min_compute_capability=parse_compute_capability(message.min_compute_capability),
        min_free_vram=message.min_free_vram_bytes,
    )


def output(decision: events.Decision) -> scheduler_pb2.SchedulerOutput:
    if isinstance(decision, events.Dispatched):
        return scheduler_pb2.SchedulerOutput(
            dispatch=scheduler_pb2.Dispatch(
                work_id=decision.work_id,
                residency_id=decision.residency_id,
                node_id=decision.node_id,
                deployment_id=decision.deployment_id,
            )
        )
    if isinstance(decision, events.WorkRejected):
        return scheduler_pb2.SchedulerOutput(
            rejected=scheduler_pb2.Rejected(
                work_id=decision.work_id,
                failure=GantryError(decision.reason, decision.message).to_failure(),
            )
        )
    if isinstance(decision, events.PlacementMade):
        return scheduler_pb2.SchedulerOutput(
            placement=scheduler_pb2.Placement(
                request_id=decision.request_id,
                deployment_id=decision.deployment_id,
                node_ids=decision.node_ids,
            )
        )
    if isinstance(decision, events.PlacementRefused):
        return scheduler_pb2.SchedulerOutput(
            rejected=scheduler_pb2.Rejected(
                work_id=decision.request_id,
                failure=GantryError(
                    decision.reason, decision.message, deployment_id=decision.deployment_id
                ).to_failure(),
                node_refusals=[
                    scheduler_pb2.NodeRefusal(node_id=r.node_id, reason=r.reason, message=r.message)
                    for r in decision.node_refusals
                ],
            )
        )
    if isinstance(decision, CreditGranted):
        return scheduler_pb2.SchedulerOutput(
            credit_granted=scheduler_pb2.CreditGranted(
                credit_id=decision.credit_id,
                deployment_id=decision.deployment_id,
                tenant_id=decision.tenant_id,
                residency_id=decision.residency_id,
                node_id=decision.node_id,
                slots=decision.slots,
            )
        )
    if isinstance(decision, CreditsRevoked):
        return scheduler_pb2.SchedulerOutput(
            credits_revoked=scheduler_pb2.CreditsRevoked(credit_ids=decision.credit_ids)
        )
    if isinstance(decision, BreakerChange):
        return scheduler_pb2.SchedulerOutput(
            breaker_changed=scheduler_pb2.BreakerChanged(
                node_id=decision.node_id,
                deployment_id=decision.deployment_id,
                state=_enum(decision.state),
                consecutive_failures=decision.consecutive_failures,
            )
        )
    return scheduler_pb2.SchedulerOutput(scale_advice=scale_advice(decision))


def scale_advice(advice: ScaleAdviceValue) -> scheduler_pb2.ScaleAdvice:
    return scheduler_pb2.ScaleAdvice(
        deployment_id=advice.deployment_id,
        desired_replicas=advice.desired_replicas,
        current_replicas=advice.current_replicas,
        reason=advice.reason,
    )


def snapshot(core: events.CoreSnapshot, *, connected: bool) -> scheduler_pb2.QueueSnapshot:
    return scheduler_pb2.QueueSnapshot(
        control_plane_connected=connected,
        in_flight=core.in_flight,
        queued=core.queued,
        dispatched_total=core.dispatched_total,
        rejected_total=core.rejected_total,
        expired_total=core.expired_total,
        cancelled_total=core.cancelled_total,
        infra_failures_total=core.infra_failures_total,
        residencies=[_residency_load(r) for r in core.residencies],
        nodes=[_node_view(n) for n in core.nodes],
        tenants=[_tenant_load(t) for t in core.tenants],
        ledger=[_domain_ledger(view) for view in core.ledger],
        breakers=[_breaker_view(b) for b in core.breakers],
        advice=[scale_advice(a) for a in core.advice],
        credits=core.credits,
        credited_total=core.credited_total,
    )


def _residency_load(r: events.ResidencyLoadView) -> scheduler_pb2.ResidencyLoad:
    return scheduler_pb2.ResidencyLoad(
        residency_id=r.residency_id,
        deployment_id=r.deployment_id,
        node_id=r.node_id,
        state=_enum(r.phase),
        in_flight=r.in_flight,
        infra_failures=r.infra_failures,
        slots=r.slots,
        breaker=_enum(r.breaker),
    )


def _node_view(n: events.NodeInfo) -> scheduler_pb2.SchedulerNode:
    return scheduler_pb2.SchedulerNode(
        node_id=n.node_id,
        state=(
            common_pb2.NODE_STATE_CONNECTED if n.connected else common_pb2.NODE_STATE_DISCONNECTED
        ),
        adapters=sorted(n.adapters),
        labels=sorted(n.labels),
        domains=[_domain(d) for d in n.domains],
        max_residencies=n.max_residencies,
        external_usage=[
            common_pb2.ResourceClaim(kind=_enum(c.kind), bytes=c.bytes, device=c.device)
            for c in n.external
        ],
        gpus=[
            common_pb2.GpuDevice(
                device=g.device, name=g.name, compute_capability=g.compute_capability
            )
            for g in n.gpus
        ],
    )


def _tenant_load(t: TenantLoadView) -> scheduler_pb2.TenantLoad:
    return scheduler_pb2.TenantLoad(
        tenant_id=t.tenant_id,
        weight=t.weight,
        queued=t.queued,
        in_flight=t.in_flight,
        served_total=t.served_total,
        served_cost=t.served_cost,
        served_share=t.served_share,
        weight_share=t.weight_share,
        rejected_total=t.rejected_total,
        budget_used=t.budget_used,
        budget_units=t.budget_units,
    )


def _domain_ledger(view: DomainView) -> scheduler_pb2.DomainLedger:
    return scheduler_pb2.DomainLedger(
        node_id=view.node_id,
        domain=_domain(view.domain),
        requested_bytes=view.requested,
        reserved_bytes=view.reserved,
        available_bytes=view.available,
        blocked_reason=view.blocked_reason,
    )


def _breaker_view(b: BreakerView) -> scheduler_pb2.BreakerView:
    return scheduler_pb2.BreakerView(
        node_id=b.node_id,
        deployment_id=b.deployment_id,
        state=_enum(b.state),
        consecutive_failures=b.consecutive_failures,
        cooldown_left_seconds=b.cooldown_left,
    )


def _domain(domain: Domain) -> common_pb2.ResourceDomain:
    return common_pb2.ResourceDomain(
        name=domain.name,
        kind=_enum(domain.kind),
        capacity_bytes=domain.capacity,
        safety_margin_bytes=domain.margin,
        device=domain.device,
    )


def _enum(value: int) -> Any:
    """A core value as the proto enum field takes it: the core's enums equal the proto's values,
    and a kind the core kept unknown travels back as the same number."""
    return int(value)
