"""One scheduler core behind several control-plane streams (origins): fairness is the tenants',
whichever stream their calls came on; a stream's snapshot replaces the cluster's facts but keeps
other streams' work; a stream that closes takes its own work, and only its own, with it."""

from __future__ import annotations

import dataclasses
from collections import Counter

from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.events import (
    Decision,
    NodeInfo,
    PlacementMade,
    PlacementRequest,
    ResidencyInfo,
    WorkRequest,
)
from gantry.scheduler.policy.types import BreakerState, Claim, Outcome, ResourceKind, TenantPolicy
from tests.unit.test_scheduler_core import GIB, cluster, dispatched, node, rejected, residency, work


def from_(origin: str, request: WorkRequest) -> WorkRequest:
    """The request as the service hands it on from the stream named `origin`."""
    return dataclasses.replace(request, origin=origin)


def resync(
    core: SchedulerCore, residencies: list[ResidencyInfo], nodes: list[NodeInfo] | None = None
) -> list[Decision]:
    """Another stream's snapshot of the same cluster."""
    return core.load_cluster(
        nodes=nodes or [node("n1"), node("n2")],
        residencies=residencies,
        deployments=[],
        policies=[],
        now=1.0,
    )


def test_a_tenant_spreading_its_calls_over_two_streams_gets_no_more_than_its_weighted_share() -> (
    None
):
    core = SchedulerCore()
    policies = [TenantPolicy("spread", weight=1), TenantPolicy("single", weight=1)]
    cluster(core, residencies=[residency("r1", slots=1)], policies=policies)
    running = dispatched(core.submit(from_("a", work("first", "single")), 0.0))[0].work_id
    for i in range(30):
        # The spreading tenant sends twice as many calls, half on each stream.
        core.submit(from_("a" if i % 2 else "b", work(f"spread-a{i}", "spread")), 0.0)
        core.submit(from_("b" if i % 2 else "a", work(f"spread-b{i}", "spread")), 0.0)
        core.submit(from_("a", work(f"single-{i}", "single")), 0.0)
    served: Counter[str] = Counter()
    for step in range(40):  # one slot, saturated: each finish lets exactly one call go
        (next_call,) = dispatched(core.finish(running, Outcome.SUCCESS, 1.0 + step))
        running = next_call.work_id
        served[running.split("-")[0]] += 1
    assert served == {"spread": 20, "single": 20}


def test_a_closed_stream_takes_only_its_own_work_and_frees_its_slots_without_an_outcome() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=1))
    cluster(core, residencies=[residency("r1", slots=2)])
    on_a = dispatched(core.submit(from_("a", work("a-run", "t1")), 0.0))
    on_b = dispatched(core.submit(from_("b", work("b-run", "t2")), 0.0))
    assert [d.work_id for d in on_a + on_b] == ["a-run", "b-run"]  # both slots taken
    assert core.submit(from_("a", work("a-wait", "t1")), 0.0) == []
    assert core.submit(from_("b", work("b-wait", "t2")), 0.0) == []

    decisions = core.drop_origin("a", 1.0)

    # a-run's slot went back and b-wait took it; a-wait left without an answer.
    assert [d.work_id for d in dispatched(decisions)] == ["b-wait"]
    assert rejected(decisions) == [] and len(decisions) == 1
    assert core.queued == 0 and core.in_flight == 2
    snapshot = core.snapshot(1.0)
    assert snapshot.residencies[0].in_flight == 2 and snapshot.residencies[0].infra_failures == 0
    # No breaker heard of it (threshold 1: any INFRA outcome would have opened one).
    assert all(b.state == BreakerState.CLOSED for b in snapshot.breakers)
    assert {t.tenant_id: (t.queued, t.in_flight) for t in snapshot.tenants} == {
        "t1": (0, 0),
        "t2": (0, 2),
    }
    # A late outcome for the dropped work is ignored; b's own work goes on as before.
    assert core.finish("a-run", Outcome.INFRA_FAILURE, 2.0) == []
    assert core.submit(from_("b", work("b-next", "t2")), 2.0) == []
    assert [d.work_id for d in dispatched(core.finish("b-run", Outcome.SUCCESS, 3.0))] == ["b-next"]


def test_dropping_a_stream_with_nothing_left_changes_nothing() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")])
    core.submit(from_("b", work("b-run")), 0.0)
    assert core.drop_origin("a", 1.0) == []
    assert core.in_flight == 1


def test_a_second_streams_snapshot_keeps_the_first_streams_queued_and_running_work() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1", slots=1)])
    core.submit(from_("a", work("a-run")), 0.0)
    assert core.submit(from_("a", work("a-wait")), 0.0) == []

    # Stream b connects and sends the same database's picture (r1's slot count grew meanwhile).
    again = resync(core, [residency("r1", slots=2)])
    assert [d.work_id for d in dispatched(again)] == ["a-wait"]  # the new slot serves it
    assert core.queued == 0 and core.in_flight == 2
    assert core.snapshot(1.0).residencies[0].in_flight == 2  # a-run still holds its slot
    assert core.finish("a-run", Outcome.SUCCESS, 1.0) == []


def test_a_snapshot_whose_residency_moved_to_a_new_id_keeps_the_queue_waiting_for_it() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1", slots=1)])
    core.submit(from_("a", work("a-run")), 0.0)
    assert core.submit(from_("a", work("a-wait")), 0.0) == []
    # r1 is gone and r2 serves d1 now: settled once against the whole picture, nothing is
    # refused DEPLOYMENT_NOT_READY in between, and the waiting call goes to r2.
    moved = resync(core, [residency("r2", node_id="n2")])
    assert [(d.work_id, d.residency_id) for d in dispatched(moved)] == [("a-wait", "r2")]
    assert rejected(moved) == []


def test_a_snapshot_keeps_placement_holds_and_drops_what_it_no_longer_lists() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")], nodes=[node("n1", ram_gib=4), node("n2")])
    held = core.place(PlacementRequest("p1", "d2", 1, (Claim(ResourceKind.RAM, 2 * GIB),)), 0.0)
    # Bin-packing: the fuller node (r1 holds 1 GiB of n1's 3 usable).
    assert isinstance(held, PlacementMade) and held.node_ids == ("n1",)
    resync(core, [residency("r1")], nodes=[node("n1", ram_gib=4)])
    snapshot = core.snapshot(1.0)
    assert {n.node_id for n in snapshot.nodes} == {"n1"}
    assert [(v.node_id, v.reserved) for v in snapshot.ledger] == [("n1", 3 * GIB)]  # r1 + hold
    # The hold still keeps a second placement of d2 off n1, and n2 has gone: nowhere is left.
    again = core.place(PlacementRequest("p2", "d2", 1, (Claim(ResourceKind.RAM, GIB),)), 1.0)
    assert not isinstance(again, PlacementMade)
