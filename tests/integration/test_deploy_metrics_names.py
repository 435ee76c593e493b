"""The names deploy/prometheus and deploy/grafana read, against a real scrape.

Every instrument of the three services is fed once through the functions the services call (the
control plane's and worker's metric functions, the scheduler's `SchedulerMetrics` with real core
decisions and a core snapshot), then `/metrics` is read over HTTP from the real OpenTelemetry
Prometheus exporter. That proves the name mapping the static tests assume (counters `_total`,
histograms `_bucket/_sum/_count`, unit suffixes), and checks each label an alert or a panel
selects or groups by against the labels the series really carry.
"""

from __future__ import annotations

import datetime as dt

import pytest

from gantry.common import operations
from gantry.common.bounded_spans import DROPPED_SPAN, PROCESS_DROPS
from gantry.common.clock import ManualClock
from gantry.controlplane.platform import metrics as controlplane_metrics
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.serving.degradation_signals import publish_degradation
from gantry.scheduler.metrics import SchedulerMetrics
from gantry.scheduler.policy.admission import TenantLoadView
from gantry.scheduler.policy.breakers import BreakerChange, BreakerView
from gantry.scheduler.policy.events import (
    CoreSnapshot,
    Dispatched,
    PlacementMade,
    PlacementRefused,
    WorkRejected,
)
from gantry.scheduler.policy.ledger import DomainView
from gantry.scheduler.policy.types import BreakerState, Domain
from gantry.worker import metrics as worker_metrics
from tests.integration.metrics_scrape import Scrape, metrics_port, scrape
from tests.unit.deploy_observability_support import (
    PENDING_METRICS,
    PROMETHEUS_SERIES,
    TARGET_LABELS,
    alert_rules,
    dashboard_queries,
    exposed_sample_names,
    load_dashboard,
    read_query,
)

TENANT = "tenant-names"


def _snapshot(
    *, tenants: list[TenantLoadView], ledger: list[DomainView], breakers: list[BreakerView]
) -> CoreSnapshot:
    return CoreSnapshot(
        queued=0,
        in_flight=0,
        dispatched_total=0,
        rejected_total=0,
        expired_total=0,
        cancelled_total=0,
        infra_failures_total=0,
        tenants=tenants,
        ledger=ledger,
        breakers=breakers,
        advice=[],
        residencies=[],
        nodes=[],
    )


def _feed_every_instrument(scheduler: SchedulerMetrics) -> None:
    now = dt.datetime.now(dt.UTC)
    # Control plane.
    with controlplane_metrics.counting():
        controlplane_metrics.call_resolved("names-capability", "dep-names")
        controlplane_metrics.stage_finished(
            operations.EMBED.rpc, controlplane_metrics.STAGE_WORKER, 0.005
        )
        controlplane_metrics.invocation_answered(operations.EMBED.rpc, None, 0.01)
    controlplane_metrics.admission_rejected("QUEUE_FULL")
    controlplane_metrics.job_committed("LOAD", "", now - dt.timedelta(seconds=2), now)
    controlplane_metrics.worker_stream("connected")
    controlplane_metrics.lease_expired("LOAD")
    controlplane_metrics.message_refused("LEASE_TOKEN_INVALID", "job_result")
    controlplane_metrics.publish_state_counts({"nodes": {"CONNECTED": 1}})
    degradation = CapabilityDegradation(ManualClock(now))
    degradation.evaluate(crash_looping={"names-capability"})  # DEGRADED: its deployment crash-loops
    publish_degradation(degradation)
    # Scheduler: real decisions of its core, and a snapshot for the gauges.
    scheduler.submitted("work-names", TENANT, 0.0)
    scheduler.decided(Dispatched("work-names", "res-1", "node-1", "dep-1"), 0.25)
    scheduler.decided(WorkRejected("work-2", "QUEUE_FULL", "full"), 0.3)
    scheduler.decided(BreakerChange("node-1", "dep-1", BreakerState.OPEN, 3), 0.3)
    scheduler.decided(PlacementMade("req-1", "dep-1", ("node-1",)), 0.3)
    scheduler.decided(PlacementRefused("req-2", "dep-1", "NO_CAPACITY", "full", ()), 0.3)
    tenant = TenantLoadView(
        tenant_id=TENANT,
        weight=1,
        queued=2,
        in_flight=1,
        served_total=0,
        served_cost=0,
        served_share=0.0,
        weight_share=1.0,
        rejected_total=0,
        budget_used=0,
        budget_units=0,
    )
    domain = DomainView(
        node_id="node-1",
        domain=Domain(name="gpu0", kind=1, capacity=1 << 30),
        requested=1 << 20,
        reserved=1 << 20,
        available=(1 << 30) - (1 << 20),
        blocked_reason="",
    )
    breaker = BreakerView("node-1", "dep-1", BreakerState.OPEN, 3, 30.0)
    snapshot = _snapshot(tenants=[tenant], ledger=[domain], breakers=[breaker])
    scheduler.summarise(snapshot)
    # Worker.
    worker_metrics.host_started(restart=False)
    worker_metrics.host_crashed("RUNTIME_CRASHED", crash_loop=True)
    worker_metrics.host_restart_attempted()
    worker_metrics.job_ran("load", "", 1.5)
    worker_metrics.invocation_answered(
        "", 0.02, capability="names-capability", deployment_id="dep-names"
    )
    worker_metrics.stream_event("connected")
    # The span pipeline's drop tally: a zero count still makes the kind a series.
    PROCESS_DROPS.add(DROPPED_SPAN, 0)


def _restore_gauges(scheduler: SchedulerMetrics) -> None:
    """Gauges keep their last published values: leave them as an idle system would."""
    controlplane_metrics.publish_state_counts({})
    publish_degradation(CapabilityDegradation(ManualClock(dt.datetime.now(dt.UTC))))
    scheduler.summarise(_snapshot(tenants=[], ledger=[], breakers=[]))


@pytest.fixture
async def fed_scrape() -> Scrape:
    port = metrics_port()
    scheduler = SchedulerMetrics()
    _feed_every_instrument(scheduler)
    try:
        return await scrape(port)
    finally:
        _restore_gauges(scheduler)


def _labels_by_name(result: Scrape) -> dict[str, set[str]]:
    labels: dict[str, set[str]] = {}
    for name, sample_labels in result.samples:
        labels.setdefault(name, set()).update(key for key, _ in sample_labels)
    return labels


def _queries() -> list[tuple[str, str]]:
    rules = [(rule["alert"], rule["expr"]) for rule in alert_rules()]
    return rules + dashboard_queries(load_dashboard())


async def test_every_instrument_is_exposed_under_the_name_the_static_tests_expect(
    fed_scrape: Scrape,
) -> None:
    expected = set(exposed_sample_names())
    scraped = {name for name, _ in fed_scrape.samples if name.startswith("gantry_")}
    # Every name the scrape shows is one the mapping predicts...
    assert scraped - expected == set()
    # ...and every instrument an alert or a panel reads shows up under its predicted names (an
    # instrument added later and read by nothing may be missing: nothing above feeds it).
    read = {metric for _, expr in _queries() for metric in read_query(expr).metrics}
    assert (expected - scraped) & read == set()
    assert len(scraped) >= 40


async def test_alert_and_dashboard_queries_read_series_and_labels_that_exist(
    fed_scrape: Scrape,
) -> None:
    labels = _labels_by_name(fed_scrape)
    problems = []
    for where, expr in _queries():
        use = read_query(expr)
        readable: set[str] = set(TARGET_LABELS)
        for metric in use.metrics:
            if metric in PENDING_METRICS:
                readable |= PENDING_METRICS[metric]
            elif metric not in PROMETHEUS_SERIES:
                if metric not in labels:
                    problems.append(f"{where}: {metric} is not in the scrape")
                    continue
                readable |= labels[metric]
        for metric, label in use.selector_labels:
            own = labels.get(metric, set()) | set(PENDING_METRICS.get(metric, ())) | TARGET_LABELS
            if label not in own:
                problems.append(f"{where}: {metric} has no label {label!r}")
        for label in use.grouping_labels - readable:
            problems.append(f"{where}: groups by {label!r}, which none of its series carry")
    assert problems == []


async def test_the_alerted_label_values_appear_in_the_scrape(fed_scrape: Scrape) -> None:
    """The exact series the alerts select, as the services write them."""
    assert fed_scrape.value("gantry_scheduler_breakers", state="OPEN") == 1
    assert fed_scrape.value("gantry_nodes", state="DISCONNECTED") == 0  # published, not absent
    assert ("reason", "QUEUE_FULL") in {
        pair for labels in fed_scrape.series("gantry_admission_rejections_total") for pair in labels
    }
    assert fed_scrape.series("gantry_model_host_crash_loops_total")
    assert fed_scrape.value("gantry_lease_expiries_total", type="LOAD") >= 1
