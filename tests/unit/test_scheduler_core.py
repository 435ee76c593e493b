"""The scheduler's pure core: scenarios with a hand-moved time, and one property over random
event sequences (every piece of work is in exactly one place)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gantry.scheduler.policy.autoscale import ScaleAdviceValue
from gantry.scheduler.policy.breakers import BreakerChange
from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.events import (
    DeploymentInfo,
    Dispatched,
    NodeInfo,
    PlacementMade,
    PlacementRefused,
    PlacementRequest,
    ResidencyInfo,
    WorkRejected,
    WorkRequest,
)
from gantry.scheduler.policy.types import (
    BreakerState,
    Claim,
    Domain,
    Outcome,
    Priority,
    ResidencyPhase,
    ResourceKind,
    TenantPolicy,
)

GIB = 1024**3
CPU_LABELS = frozenset({"adapter:st", "device:cpu"})


def node(node_id: str, *, ram_gib: int = 16, connected: bool = True) -> NodeInfo:
    return NodeInfo(
        node_id=node_id,
        connected=connected,
        labels=CPU_LABELS,
        domains=(Domain("host.ram", ResourceKind.RAM, ram_gib * GIB, GIB),),
    )


def residency(
    rid: str,
    *,
    node_id: str = "n1",
    deployment_id: str = "d1",
    slots: int = 1,
    phase: ResidencyPhase = ResidencyPhase.RESIDENT,
    ram_gib: int = 1,
) -> ResidencyInfo:
    return ResidencyInfo(
        residency_id=rid,
        deployment_id=deployment_id,
        node_id=node_id,
        phase=phase,
        claims=(Claim(ResourceKind.RAM, ram_gib * GIB),),
        slots=slots,
    )


def cluster(
    core: SchedulerCore,
    *,
    residencies: list[ResidencyInfo],
    nodes: list[NodeInfo] | None = None,
    policies: list[TenantPolicy] | None = None,
    deployments: list[DeploymentInfo] | None = None,
) -> None:
    core.load_cluster(
        nodes=nodes or [node("n1"), node("n2")],
        residencies=residencies,
        deployments=deployments or [],
        policies=policies or [],
        now=0.0,
    )


def work(
    work_id: str,
    tenant: str = "t1",
    *,
    deployment_id: str = "d1",
    cost: int = 1,
    priority: Priority | int = 0,
    timeout: float = 0.0,
    inputs: int = 1,
) -> WorkRequest:
    return WorkRequest(
        work_id=work_id,
        tenant_id=tenant,
        deployment_id=deployment_id,
        priority=int(priority),
        cost=cost,
        timeout_seconds=timeout,
        inputs=inputs,
    )


def dispatched(decisions: list[object]) -> list[Dispatched]:
    return [d for d in decisions if isinstance(d, Dispatched)]


def rejected(decisions: list[object]) -> list[WorkRejected]:
    return [d for d in decisions if isinstance(d, WorkRejected)]


def test_work_waits_for_a_free_slot_and_goes_when_one_frees() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1", slots=1)])
    first = core.submit(work("w1"), 0.0)
    assert [d.work_id for d in dispatched(first)] == ["w1"]
    assert core.submit(work("w2"), 0.0) == []  # queued, no answer yet
    assert core.queued == 1
    after = core.finish("w1", Outcome.SUCCESS, 1.0)
    assert [(d.work_id, d.residency_id) for d in dispatched(after)] == [("w2", "r1")]
    assert core.queued == 0 and core.in_flight == 1


def test_routing_takes_the_least_outstanding_residency_and_respects_slots() -> None:
    core = SchedulerCore()
    cluster(
        core, residencies=[residency("r1", node_id="n1", slots=2), residency("r2", node_id="n2")]
    )
    placed = [dispatched(core.submit(work(f"w{i}"), 0.0)) for i in range(4)]
    assert [p[0].residency_id if p else None for p in placed] == ["r1", "r2", "r1", None]


def test_a_flood_past_the_queue_depth_is_refused_at_once_while_queued_work_completes() -> None:
    core = SchedulerCore(CoreSettings(global_queue_depth=3))
    cluster(core, residencies=[residency("r1")])
    core.submit(work("running"), 0.0)
    for i in range(3):
        assert core.submit(work(f"q{i}"), 0.0) == []
    flood = core.submit(work("over"), 0.0)
    assert [(r.work_id, r.reason) for r in rejected(flood)] == [("over", "QUEUE_FULL")]
    served = ["running"]
    for _ in range(3):
        (next_one,) = dispatched(core.finish(served[-1], Outcome.SUCCESS, 1.0))
        served.append(next_one.work_id)
    assert served == ["running", "q0", "q1", "q2"]


def test_queued_work_past_its_deadline_fails_deadline_exceeded() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")])
    core.submit(work("busy"), 0.0)
    core.submit(work("late", timeout=2.0), 0.0)
    assert rejected(core.tick(1.9)) == []
    (late,) = rejected(core.tick(2.0))
    assert (late.work_id, late.reason) == ("late", "DEADLINE_EXCEEDED")
    assert core.snapshot(2.0).expired_total == 1
    assert dispatched(core.finish("busy", Outcome.SUCCESS, 2.1)) == []


def test_work_whose_caller_has_gone_is_removed_from_the_queue() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")])
    core.submit(work("busy"), 0.0)
    core.submit(work("gone"), 0.0)
    assert core.finish("gone", Outcome.CANCELLED, 0.5) == []
    assert core.queued == 0
    assert dispatched(core.finish("busy", Outcome.SUCCESS, 1.0)) == []
    (load,) = core.snapshot(1.0).tenants
    assert (load.queued, load.in_flight) == (0, 0)


def test_a_disallowed_priority_is_refused_and_unspecified_takes_the_tenants_own() -> None:
    core = SchedulerCore()
    batch_only = TenantPolicy(tenant_id="t1", allowed_priorities=frozenset({Priority.BATCH}))
    cluster(core, residencies=[residency("r1", slots=4)], policies=[batch_only])
    (refused,) = rejected(core.submit(work("w1", priority=Priority.INTERACTIVE), 0.0))
    assert refused.reason == "PERMISSION_DENIED"
    assert dispatched(core.submit(work("w2"), 0.0))


def test_interactive_work_goes_before_batch_work_queued_earlier() -> None:
    core = SchedulerCore(CoreSettings(aging_seconds=60.0))
    cluster(core, residencies=[residency("r1")])
    core.submit(work("busy"), 0.0)
    core.submit(work("batch", "t1", priority=Priority.BATCH), 0.0)
    core.submit(work("interactive", "t2", priority=Priority.INTERACTIVE), 0.1)
    (first,) = dispatched(core.finish("busy", Outcome.SUCCESS, 1.0))
    assert first.work_id == "interactive"


def test_tenant_quota_and_budget_refusals_are_typed() -> None:
    core = SchedulerCore()
    policies = [
        TenantPolicy(tenant_id="quota", max_concurrency=1),
        TenantPolicy(tenant_id="budget", budget_units=10, budget_window_seconds=60),
    ]
    cluster(core, residencies=[residency("r1", slots=8)], policies=policies)
    assert dispatched(core.submit(work("q1", "quota"), 0.0))
    (quota,) = rejected(core.submit(work("q2", "quota"), 0.0))
    assert quota.reason == "TENANT_QUOTA_EXCEEDED"
    assert dispatched(core.submit(work("b1", "budget", cost=8), 0.0))
    (budget,) = rejected(core.submit(work("b2", "budget", cost=8), 0.0))
    assert budget.reason == "BUDGET_EXCEEDED"


def test_weighted_tenants_saturating_one_slot_are_served_in_proportion() -> None:
    core = SchedulerCore()
    cluster(
        core,
        residencies=[residency("r1")],
        policies=[TenantPolicy(tenant_id="a", weight=1), TenantPolicy(tenant_id="b", weight=3)],
    )
    served: Counter[str] = Counter()
    running = dispatched(core.submit(work("a-0", "a"), 0.0))[0].work_id
    for i in range(1, 200):
        core.submit(work(f"a-{i}", "a"), 0.0)
        core.submit(work(f"b-{i}", "b"), 0.0)
    now = 0.0
    for _ in range(200):
        now += 0.01
        (running_next,) = dispatched(core.finish(running, Outcome.SUCCESS, now))
        running = running_next.work_id
        served[running.split("-")[0]] += 1
    assert 0.70 <= served["b"] / 200 <= 0.80, served


def test_a_huge_request_counts_as_its_size_and_does_not_hold_small_tenants_back() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")])
    running = dispatched(core.submit(work("big-0", "big", cost=100_000), 0.0))[0].work_id
    for i in range(1, 5):
        core.submit(work(f"big-{i}", "big", cost=100_000), 0.0)
    for i in range(20):
        core.submit(work(f"small-{i}", "small", cost=100), 0.0)
    order = []
    for _ in range(24):
        (running_next,) = dispatched(core.finish(running, Outcome.SUCCESS, 1.0))
        running = running_next.work_id
        order.append(running.split("-")[0])
    # Every small request goes before the second big one.
    assert order[:21].count("small") == 20, order


def test_breaker_opens_on_infra_failures_spills_over_and_closes_after_a_probe() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=3, breaker_cooldown_seconds=30.0))
    cluster(core, residencies=[residency("r1", node_id="n1"), residency("r2", node_id="n2")])
    changes: list[object] = []
    for i in range(3):
        (d,) = dispatched(core.submit(work(f"w{i}"), float(i)))
        if d.residency_id == "r2":  # keep r2 free: finish it and send the next to r1
            core.finish(d.work_id, Outcome.SUCCESS, float(i))
            continue
        changes += core.finish(d.work_id, Outcome.INFRA_FAILURE, float(i))
    while not any(isinstance(c, BreakerChange) and c.state == BreakerState.OPEN for c in changes):
        (d,) = dispatched(core.submit(work(f"x{len(changes)}"), 3.0))
        outcome = Outcome.INFRA_FAILURE if d.residency_id == "r1" else Outcome.SUCCESS
        changes += core.finish(d.work_id, outcome, 3.0)
    # Open on r1: everything goes to r2.
    assert {
        d.residency_id for i in range(3) for d in dispatched(core.submit(work(f"s{i}"), 4.0))
    } == {"r2"}


def test_request_failures_never_open_a_breaker() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=3))
    cluster(core, residencies=[residency("r1")])
    for i in range(10):
        (d,) = dispatched(core.submit(work(f"w{i}"), 0.0))
        assert not [c for c in core.finish(d.work_id, Outcome.REQUEST_FAILURE, 0.0)]
    assert dispatched(core.submit(work("after"), 0.0))


def test_with_every_breaker_open_the_caller_gets_circuit_open_and_a_half_open_probe_heals() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=2, breaker_cooldown_seconds=10.0))
    cluster(core, residencies=[residency("r1")])
    for i in range(2):
        (d,) = dispatched(core.submit(work(f"w{i}"), 0.0))
        core.finish(d.work_id, Outcome.INFRA_FAILURE, 0.0)
    (refused,) = rejected(core.submit(work("refused"), 1.0))
    assert refused.reason == "CIRCUIT_OPEN"
    half_open = [c for c in core.tick(10.5) if isinstance(c, BreakerChange)]
    assert {c.state for c in half_open} == {BreakerState.HALF_OPEN}
    (probe,) = dispatched(core.submit(work("probe"), 11.0))
    assert core.submit(work("waits"), 11.0) == []  # one probe at a time: the next one queues
    healed = core.finish(probe.work_id, Outcome.SUCCESS, 11.5)
    assert any(isinstance(c, BreakerChange) and c.state == BreakerState.CLOSED for c in healed)
    assert [d.work_id for d in dispatched(healed)] == ["waits"]


def test_queued_work_is_answered_when_the_last_residency_stops_serving() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")])
    core.submit(work("busy"), 0.0)
    core.submit(work("queued"), 0.0)
    draining = core.upsert_residency(residency("r1", phase=ResidencyPhase.DRAINING), 1.0)
    assert [(r.work_id, r.reason) for r in rejected(draining)] == [
        ("queued", "DEPLOYMENT_NOT_READY")
    ]


def test_placement_holds_its_claim_until_the_residency_is_announced() -> None:
    core = SchedulerCore(CoreSettings(placement_hold_seconds=30.0))
    cluster(core, residencies=[], nodes=[node("n1", ram_gib=5)])
    request = PlacementRequest(
        request_id="p1",
        deployment_id="d1",
        replicas=1,
        claims=(Claim(ResourceKind.RAM, 3 * GIB),),
        required_labels=frozenset({"adapter:st"}),
    )
    placed = core.place(request, 0.0)
    assert isinstance(placed, PlacementMade) and placed.node_ids == ("n1",)
    second = core.place(
        PlacementRequest(
            request_id="p2",
            deployment_id="d2",
            replicas=1,
            claims=(Claim(ResourceKind.RAM, 3 * GIB),),
        ),
        1.0,
    )
    assert isinstance(second, PlacementRefused) and second.reason == "NO_CAPACITY"
    assert [r.reason for r in second.node_refusals] == ["NO_CAPACITY"]
    core.upsert_residency(residency("r1", ram_gib=3), 2.0)  # the hold becomes the residency's
    (ram,) = core.snapshot(2.0).ledger
    assert ram.reserved == 3 * GIB
    core.upsert_residency(residency("r1", phase=ResidencyPhase.COLD), 3.0)
    assert isinstance(core.place(second_request := request, 3.0), PlacementMade), second_request


def test_an_unclaimed_placement_hold_expires() -> None:
    core = SchedulerCore(CoreSettings(placement_hold_seconds=30.0))
    cluster(core, residencies=[], nodes=[node("n1", ram_gib=5)])
    claims = (Claim(ResourceKind.RAM, 3 * GIB),)
    assert isinstance(core.place(PlacementRequest("p1", "d1", 1, claims), 0.0), PlacementMade)
    assert isinstance(core.place(PlacementRequest("p2", "d2", 1, claims), 1.0), PlacementRefused)
    core.tick(31.0)
    assert isinstance(core.place(PlacementRequest("p3", "d2", 1, claims), 31.0), PlacementMade)


def test_a_released_placement_frees_its_node_for_the_same_deployment_at_once() -> None:
    # The control plane placed on two nodes but recorded one residency (fewer were missing by
    # the time it wrote): the unused node is released, and the deployment's next placement may
    # choose it, long before the hold would lapse.
    core = SchedulerCore(CoreSettings(placement_hold_seconds=60.0))
    cluster(core, residencies=[], nodes=[node("n1", ram_gib=5), node("n2", ram_gib=5)])
    claims = (Claim(ResourceKind.RAM, GIB),)
    placed = core.place(PlacementRequest("p1", "d1", 2, claims), 0.0)
    assert isinstance(placed, PlacementMade) and set(placed.node_ids) == {"n1", "n2"}
    core.upsert_residency(residency("r1", node_id="n1", ram_gib=1), 1.0)
    held = core.place(PlacementRequest("p2", "d1", 1, claims), 2.0)
    assert isinstance(held, PlacementRefused)
    assert {r.message for r in held.node_refusals} == {"already holds a replica"}
    assert core.release_holds("d1", ["n2", "n-unknown"]) == []
    again = core.place(PlacementRequest("p3", "d1", 1, claims), 3.0)
    assert isinstance(again, PlacementMade) and again.node_ids == ("n2",)
    assert core.release_holds("d-unknown", ["n1"]) == []


def test_an_uncertain_residency_keeps_its_claim_and_blocks_its_domain() -> None:
    core = SchedulerCore()
    cluster(
        core,
        residencies=[residency("r1", phase=ResidencyPhase.UNCERTAIN)],
        nodes=[node("n1", ram_gib=64)],
    )
    refused = core.place(PlacementRequest("p1", "d2", 1, (Claim(ResourceKind.RAM, GIB),)), 0.0)
    assert isinstance(refused, PlacementRefused) and refused.reason == "NO_CAPACITY"
    (ram,) = core.snapshot(0.0).ledger
    assert ram.reserved == GIB and ram.blocked_reason


def test_autoscale_advice_follows_the_queue() -> None:
    core = SchedulerCore(CoreSettings(advice_interval_seconds=1.0))
    cluster(
        core,
        residencies=[residency("r1", slots=1)],
        deployments=[DeploymentInfo("d1", replicas=1, min_replicas=1, max_replicas=3)],
    )
    for i in range(6):
        core.submit(work(f"w{i}"), 0.0)
    advice = [a for a in core.tick(1.0) if isinstance(a, ScaleAdviceValue)]
    assert advice and advice[0].desired_replicas == 3
    assert core.snapshot(1.0).advice == advice


class CoreMachine(RuleBasedStateMachine):
    """Random submits on two streams, finishes, ticks, residency moves, snapshots and streams
    closing: each work id is answered at most once, and queued + in flight always equals what
    was accepted and not yet answered."""

    def __init__(self) -> None:
        super().__init__()
        self.core = SchedulerCore(
            CoreSettings(global_queue_depth=20, breaker_threshold=2, breaker_cooldown_seconds=1.0)
        )
        cluster(
            self.core,
            residencies=[residency("r1", slots=2), residency("r2", node_id="n2", slots=1)],
        )
        self.now = 0.0
        self.next_id = 0
        self.open: set[str] = set()  # accepted, no final answer yet
        self.running: set[str] = set()
        self.answered: set[str] = set()
        self.origin_of: dict[str, str] = {}
        self.r1_slots = 2

    def _apply(self, decisions: list[object]) -> None:
        for decision in decisions:
            if isinstance(decision, Dispatched):
                assert decision.work_id in self.open and decision.work_id not in self.running
                self.running.add(decision.work_id)
            elif isinstance(decision, WorkRejected):
                assert decision.work_id not in self.answered
                self.answered.add(decision.work_id)
                self.open.discard(decision.work_id)

    @rule(
        tenant=st.sampled_from(["a", "b", "c"]),
        cost=st.integers(1, 50),
        timeout=st.floats(0, 3),
        inputs=st.integers(0, 3),
        origin=st.sampled_from(["a", "b"]),
    )
    def submit(self, tenant: str, cost: int, timeout: float, inputs: int, origin: str) -> None:
        self.next_id += 1
        work_id = f"w{self.next_id}"
        self.open.add(work_id)
        self.origin_of[work_id] = origin
        request = work(work_id, tenant, cost=cost, timeout=timeout, inputs=inputs)
        self._apply(self.core.submit(dataclasses.replace(request, origin=origin), self.now))

    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)))
    def finish(self, data: st.DataObject, outcome: Outcome) -> None:
        if not self.open:
            return
        work_id = data.draw(st.sampled_from(sorted(self.open)))
        self.open.discard(work_id)
        self.running.discard(work_id)
        self.answered.add(work_id)
        self._apply(self.core.finish(work_id, outcome, self.now))

    @rule(seconds=st.floats(0.01, 2.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._apply(self.core.tick(self.now))

    @rule(phase=st.sampled_from([ResidencyPhase.RESIDENT, ResidencyPhase.DRAINING]))
    def move_r2(self, phase: ResidencyPhase) -> None:
        self._apply(
            self.core.upsert_residency(residency("r2", node_id="n2", phase=phase), self.now)
        )

    @rule()
    def delete_n2(self) -> None:
        self._apply(self.core.remove_node("n2", self.now))

    @rule()
    def register_n2_again(self) -> None:
        self._apply(self.core.upsert_node(node("n2"), self.now))

    @rule()
    def remove_d1(self) -> None:
        self._apply(self.core.remove_deployment("d1", self.now))

    # Slots only grow here: a residency shrunk under its calls in flight holds more than it has
    # until they finish, which the last invariant does not allow for.
    @rule(grown=st.integers(0, 1))
    def another_streams_snapshot(self, grown: int) -> None:
        self.r1_slots += grown
        self._apply(
            self.core.load_cluster(
                nodes=[node("n1"), node("n2")],
                residencies=[residency("r1", slots=self.r1_slots), residency("r2", node_id="n2")],
                deployments=[],
                policies=[],
                now=self.now,
            )
        )

    @rule(origin=st.sampled_from(["a", "b"]))
    def stream_closes(self, origin: str) -> None:
        # Its work leaves unanswered (its control plane failed those callers itself).
        gone = {w for w in self.open if self.origin_of[w] == origin}
        self.open -= gone
        self.running -= gone
        self.answered |= gone
        self._apply(self.core.drop_origin(origin, self.now))

    @invariant()
    def every_open_work_is_in_exactly_one_place(self) -> None:
        waiting = self.open - self.running
        assert self.core.queued == len(waiting)
        assert self.core.in_flight == len(self.running)
        loads = self.core.snapshot(self.now).tenants
        assert sum(t.queued for t in loads) == len(waiting)
        assert sum(t.in_flight for t in loads) == len(self.running)
        # Calls of several inputs hold several slots, never more than a residency has.
        assert all(r.in_flight <= r.slots for r in self.core.snapshot(self.now).residencies)


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_model_hosts_own_crashes_open_its_breaker_but_not_its_nodes() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=2))
    cluster(
        core,
        residencies=[residency("r1"), residency("r2", deployment_id="d2")],
        nodes=[node("n1")],
    )
    for i in range(2):
        (d,) = dispatched(core.submit(work(f"w{i}"), 0.0))
        core.finish(d.work_id, Outcome.INFRA_FAILURE, 0.0, reason="RUNTIME_CRASHED")
    (refused,) = rejected(core.submit(work("d1-call"), 0.0))
    assert refused.reason == "CIRCUIT_OPEN"
    assert dispatched(core.submit(work("d2-call", deployment_id="d2"), 0.0))


def test_a_node_wide_failure_opens_the_nodes_breaker_for_every_deployment() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=2))
    cluster(
        core,
        residencies=[residency("r1"), residency("r2", deployment_id="d2")],
        nodes=[node("n1")],
    )
    for i in range(2):
        (d,) = dispatched(core.submit(work(f"w{i}"), 0.0))
        core.finish(d.work_id, Outcome.INFRA_FAILURE, 0.0, reason="WORKER_UNAVAILABLE")
    (refused,) = rejected(core.submit(work("d2-call", deployment_id="d2"), 0.0))
    assert refused.reason == "CIRCUIT_OPEN"


def test_a_residency_resident_again_after_a_restart_starts_with_a_closed_breaker() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=2, breaker_cooldown_seconds=30.0))
    cluster(core, residencies=[residency("r1")])
    for i in range(2):
        (d,) = dispatched(core.submit(work(f"w{i}"), 0.0))
        core.finish(d.work_id, Outcome.INFRA_FAILURE, 0.0, reason="RUNTIME_CRASHED")
    core.upsert_residency(residency("r1", phase=ResidencyPhase.LOADING), 1.0)
    core.upsert_residency(residency("r1"), 2.0)
    assert dispatched(core.submit(work("after-restart"), 2.0))


def _where(core: SchedulerCore, now: float) -> dict[str, set[str]]:
    """Which nodes and deployments each view of the snapshot still names."""
    snapshot = core.snapshot(now)
    return {
        "nodes": {n.node_id for n in snapshot.nodes},
        "ledger": {v.node_id for v in snapshot.ledger},
        "breaker nodes": {b.node_id for b in snapshot.breakers},
        "breaker deployments": {b.deployment_id for b in snapshot.breakers},
        "residency nodes": {r.node_id for r in snapshot.residencies},
        "advice": {a.deployment_id for a in snapshot.advice},
    }


def test_a_deleted_node_leaves_every_view_and_its_placement_hold_lapses() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=5))
    cluster(core, residencies=[residency("r1", node_id="n1"), residency("r2", node_id="n2")])
    counted = dispatched(core.submit(work("w0"), 0.0)) + dispatched(core.submit(work("w1"), 0.0))
    on_n2 = next(d for d in counted if d.node_id == "n2")
    on_n1 = next(d for d in counted if d.node_id == "n1")
    core.finish(on_n2.work_id, Outcome.INFRA_FAILURE, 0.0, reason="WORKER_UNAVAILABLE")
    late = dispatched(core.submit(work("late"), 0.0))  # in flight on n2 when it goes
    assert [d.node_id for d in late] == ["n2"]
    held = core.place(PlacementRequest("p1", "d2", 2, (Claim(ResourceKind.RAM, GIB),)), 0.0)
    assert isinstance(held, PlacementMade) and set(held.node_ids) == {"n1", "n2"}
    assert "n2" in _where(core, 0.0)["breaker nodes"]

    assert core.remove_node("n2", 1.0) == []  # d1 still has r1: nothing to settle
    views = _where(core, 1.0)
    for name in ("nodes", "ledger", "breaker nodes", "residency nodes"):
        assert "n2" not in views[name], name
    assert views["nodes"] == views["ledger"] == {"n1"}
    # Its in-flight work ends without bringing back a breaker row for it.
    core.finish("late", Outcome.INFRA_FAILURE, 2.0, reason="WORKER_UNAVAILABLE")
    assert core.snapshot(2.0).breakers == []
    # Only n1 is left to place on; its hold for d2 is still there, n2's went with it.
    again = core.place(PlacementRequest("p2", "d3", 2, (Claim(ResourceKind.RAM, GIB),)), 2.0)
    assert isinstance(again, PlacementMade) and again.node_ids == ("n1",)
    core.finish(on_n1.work_id, Outcome.SUCCESS, 2.0)
    assert [d.node_id for d in dispatched(core.submit(work("after"), 2.0))] == ["n1"]


def test_deleting_the_only_node_of_a_deployment_answers_its_queued_work() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1", node_id="n2")])
    core.submit(work("running"), 0.0)
    assert core.submit(work("waiting"), 0.0) == []
    (refused,) = rejected(core.remove_node("n2", 1.0))
    assert (refused.work_id, refused.reason) == ("waiting", "DEPLOYMENT_NOT_READY")
    assert core.queued == 0 and core.in_flight == 1
    assert core.finish("running", Outcome.SUCCESS, 2.0) == []
    assert core.in_flight == 0


def test_a_removed_deployment_leaves_its_breakers_advice_and_queue() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=3))
    cluster(
        core,
        residencies=[residency("r1"), residency("r2", deployment_id="d2")],
        nodes=[node("n1")],
        deployments=[DeploymentInfo("d1", replicas=1, min_replicas=1, max_replicas=3)],
    )
    for i in range(2):  # counted on (n1, d1) and on n1, not yet open
        (d,) = dispatched(core.submit(work(f"w{i}"), 0.0))
        core.finish(d.work_id, Outcome.INFRA_FAILURE, 0.0, reason="RUNTIME_CRASHED")
    for i in range(6):
        core.submit(work(f"busy{i}"), 0.0)
    core.tick(1.0)
    views = _where(core, 1.0)
    assert views["breaker deployments"] == {"d1"} and views["advice"] == {"d1"}

    # Unloaded: r1 is on its way out; what waits is answered rather than kept for nothing.
    core.upsert_residency(residency("r1", phase=ResidencyPhase.UNLOADING), 2.0)
    assert core.queued == 0
    assert core.remove_deployment("d1", 2.0) == []
    views = _where(core, 2.0)
    assert views["breaker deployments"] == set() and views["advice"] == set()
    # A late failure of work that was already running on it counts again only on its pair,
    # which goes with the residency when it is COLD.
    core.finish("busy0", Outcome.INFRA_FAILURE, 3.0, reason="RUNTIME_CRASHED")
    core.upsert_residency(residency("r1", phase=ResidencyPhase.COLD), 3.0)
    snapshot = core.snapshot(3.0)
    assert snapshot.breakers == [] and snapshot.residencies[0].deployment_id == "d2"
    assert dispatched(core.submit(work("other", deployment_id="d2"), 3.0))


def test_a_removed_deployment_still_serves_what_waits_while_a_residency_is_resident() -> None:
    core = SchedulerCore()
    cluster(core, residencies=[residency("r1")], nodes=[node("n1")])
    core.submit(work("running"), 0.0)
    assert core.submit(work("waiting"), 0.0) == []
    assert core.remove_deployment("d1", 1.0) == []  # r1 still RESIDENT: it keeps its place
    assert core.queued == 1
    assert [d.work_id for d in dispatched(core.finish("running", Outcome.SUCCESS, 2.0))] == [
        "waiting"
    ]


def test_a_resynchronisation_drops_what_it_no_longer_lists() -> None:
    core = SchedulerCore(CoreSettings(breaker_threshold=5))
    cluster(
        core,
        residencies=[residency("r1"), residency("r2", node_id="n2", deployment_id="d2")],
        deployments=[DeploymentInfo("d2", replicas=1, min_replicas=1, max_replicas=3)],
    )
    (d,) = dispatched(core.submit(work("w", deployment_id="d2"), 0.0))
    core.finish(d.work_id, Outcome.INFRA_FAILURE, 0.0, reason="WORKER_UNAVAILABLE")
    core.tick(0.0)
    assert _where(core, 0.0)["breaker nodes"] == {"n2"}

    cluster(core, residencies=[residency("r1")], nodes=[node("n1")])
    assert _where(core, 1.0) == {
        "nodes": {"n1"},
        "ledger": {"n1"},
        "breaker nodes": set(),
        "breaker deployments": set(),
        "residency nodes": {"n1"},
        "advice": set(),
    }
