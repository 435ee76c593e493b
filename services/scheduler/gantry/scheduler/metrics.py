"""The scheduler's metrics: counted where the service applies the core's decisions.

The core in `policy/` stays pure; the service hands this module each decision as it turns it into
an output, and a summary of the core's state about once a second for the gauges (queue depth per
tenant, breaker states, the resource ledger), so a scrape never reads the core itself.
"""

from __future__ import annotations

from collections import Counter

from gantry.common.metrics import (
    OTHER,
    BoundedValues,
    Labels,
    SummedCounter,
    duration_histogram,
    meter,
    metrics_enabled,
    observable_gauge,
)
from gantry.scheduler.policy.breakers import BreakerChange
from gantry.scheduler.policy.events import (
    CoreSnapshot,
    Decision,
    Dispatched,
    PlacementMade,
    PlacementRefused,
    WorkRejected,
)
from gantry.scheduler.policy.types import BreakerState

# Tenants, nodes and reasons are data: past these many distinct values they count as "_other".
TENANT_LABELS = 256
NODE_LABELS = 256
REASON_LABELS = 64
DOMAIN_LABELS = 64

_meter = meter("gantry.scheduler")
# Counted on every dispatch: summed here and handed to the SDK when a reader collects.
_dispatches = SummedCounter(
    _meter.create_counter(
        "gantry_scheduler_dispatches", description="Work dispatched to a residency, per tenant"
    )
)
_rejections = _meter.create_counter(
    "gantry_scheduler_rejections",
    description="Work the scheduler answered with a refusal, by reason (admission, queue, breaker)",
)
_queue_wait = duration_histogram(
    _meter,
    "gantry_scheduler_queue_wait_seconds",
    "Time work waited in the scheduler's queue before its dispatch, per tenant",
)
_breaker_transitions = _meter.create_counter(
    "gantry_scheduler_breaker_transitions",
    description="Circuit-breaker state changes, by new state and scope (node or deployment)",
)
_placements = _meter.create_counter(
    "gantry_scheduler_placements", description="Placement answers, by outcome and reason"
)
_queue_depth = observable_gauge(
    _meter, "gantry_scheduler_queue_depth", "Work waiting in the scheduler's queue, per tenant"
)
_in_flight = observable_gauge(
    _meter, "gantry_scheduler_in_flight", "Work dispatched and not yet finished, per tenant"
)
_breakers = observable_gauge(
    _meter,
    "gantry_scheduler_breakers",
    "Circuit breakers by state (CLOSED counts only breakers with failures counted)",
)
_ledger_requested = observable_gauge(
    _meter,
    "gantry_scheduler_ledger_requested_bytes",
    "Bytes claimed in a node's resource domain",
    unit="By",
)
_ledger_reserved = observable_gauge(
    _meter,
    "gantry_scheduler_ledger_reserved_bytes",
    "Bytes held in a node's resource domain (claims less replacement overlap)",
    unit="By",
)
_ledger_capacity = observable_gauge(
    _meter,
    "gantry_scheduler_ledger_capacity_bytes",
    "Capacity of a node's resource domain",
    unit="By",
)

_STATE_NAMES = {int(state): state.name for state in BreakerState}
_OTHER_TENANT = {"tenant": OTHER}


class SchedulerMetrics:
    """Bounded label sets and the submit times of waiting work (for the queue wait)."""

    def __init__(self) -> None:
        self._tenants = BoundedValues(TENANT_LABELS)
        self._nodes = BoundedValues(NODE_LABELS)
        self._reasons = BoundedValues(REASON_LABELS)
        self._domains = BoundedValues(DOMAIN_LABELS)
        # work id -> (tenant label, submitted at): bounded by the core's queue and in-flight
        # bounds, like the service's trace contexts; never a label itself.
        self._waiting: dict[str, tuple[dict[str, str], float]] = {}
        self._tenant_attributes: dict[str, dict[str, str]] = {}

    @property
    def enabled(self) -> bool:
        return metrics_enabled()

    def reset(self) -> None:
        self._waiting.clear()

    def submitted(self, work_id: str, tenant_id: str, now: float) -> None:
        self._waiting[work_id] = (self._tenant(tenant_id), now)

    def _tenant(self, tenant_id: str) -> dict[str, str]:
        attributes = self._tenant_attributes.get(tenant_id)
        if attributes is None:
            if self._tenants(tenant_id) != tenant_id:
                return _OTHER_TENANT  # not cached: the cache stays as bounded as the labels
            attributes = self._tenant_attributes[tenant_id] = {"tenant": tenant_id}
        return attributes

    def finished(self, work_id: str) -> None:
        self._waiting.pop(work_id, None)

    def credited(self, tenant_id: str) -> None:
        """A call the control plane dispatched on a credit: a dispatch that waited for nothing."""
        attributes = self._tenant(tenant_id)
        _dispatches.add(1, attributes)
        _queue_wait.record(0.0, attributes)

    def decided(self, decision: Decision, now: float) -> None:
        if isinstance(decision, Dispatched):
            waiting = self._waiting.pop(decision.work_id, None)
            if waiting is None:
                _dispatches.add(1, _OTHER_TENANT)
            else:
                _dispatches.add(1, waiting[0])
                _queue_wait.record(max(0.0, now - waiting[1]), waiting[0])
        elif isinstance(decision, WorkRejected):
            self._waiting.pop(decision.work_id, None)
            _rejections.add(1, {"reason": self._reasons(decision.reason)})
        elif isinstance(decision, BreakerChange):
            _breaker_transitions.add(
                1,
                {
                    "state": _STATE_NAMES.get(int(decision.state), "UNKNOWN"),
                    "scope": "deployment" if decision.deployment_id else "node",
                },
            )
        elif isinstance(decision, PlacementMade):
            _placements.add(1, {"outcome": "PLACED", "reason": ""})
        elif isinstance(decision, PlacementRefused):
            _placements.add(1, {"outcome": "REFUSED", "reason": self._reasons(decision.reason)})

    def summarise(self, snapshot: CoreSnapshot) -> None:
        """Publish the gauges from one snapshot of the core (the ticker calls this)."""
        queued: Counter[Labels] = Counter()
        in_flight: Counter[Labels] = Counter()
        for tenant in snapshot.tenants:
            who: Labels = (("tenant", self._tenants(tenant.tenant_id)),)
            queued[who] += tenant.queued
            in_flight[who] += tenant.in_flight
        _queue_depth.publish(queued)
        _in_flight.publish(in_flight)
        states: Counter[Labels] = Counter(
            {((("state", name),)): 0 for name in _STATE_NAMES.values()}
        )
        for breaker in snapshot.breakers:
            states[(("state", _STATE_NAMES.get(int(breaker.state), "UNKNOWN")),)] += 1
        _breakers.publish(states)
        requested: Counter[Labels] = Counter()
        reserved: Counter[Labels] = Counter()
        capacity: Counter[Labels] = Counter()
        for view in snapshot.ledger:
            where: Labels = (
                ("node", self._nodes(view.node_id)),
                ("domain", self._domains(view.domain.name)),
            )
            requested[where] += view.requested
            reserved[where] += view.reserved
            capacity[where] += view.domain.capacity
        _ledger_requested.publish(requested)
        _ledger_reserved.publish(reserved)
        _ledger_capacity.publish(capacity)
