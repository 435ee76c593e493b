"""Credits in the scheduler's pure core (policy/credits.py): granted to a stream while its
deployment is uncontended, counted against the same slots as every call in flight (whichever
stream holds them), revoked at contention, and given back by a return or the stream's end."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gantry.scheduler.policy.breakers import BreakerChange
from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.credits import (
    DEFAULT_CREDITS_PER_TENANT,
    CreditGranted,
    CreditsRevoked,
    GrantFacts,
    credit_room,
    may_grant,
)
from gantry.scheduler.policy.events import (
    Dispatched,
    NodeInfo,
    ResidencyInfo,
    WorkRejected,
    WorkRequest,
)
from gantry.scheduler.policy.types import (
    BreakerState,
    Outcome,
    Priority,
    ResidencyPhase,
    TenantPolicy,
)


def core_with(*, slots: int = 4, per_tenant: int = 2, **settings: object) -> SchedulerCore:
    core = SchedulerCore(
        CoreSettings(credits_per_tenant=per_tenant, breaker_threshold=2, **settings)  # type: ignore[arg-type]
    )
    core.load_cluster(
        nodes=[NodeInfo("n1", connected=True)],
        residencies=[ResidencyInfo("r1", "d1", "n1", ResidencyPhase.RESIDENT, slots=slots)],
        deployments=[],
        policies=[],
        now=0.0,
    )
    for origin in ("a", "b"):  # streams whose control planes take credits (their snapshot said)
        core.takes_credits(origin, True)
    return core


def work(work_id: str, tenant: str = "t1", *, origin: str = "a", **fields: object) -> WorkRequest:
    request = WorkRequest(
        work_id=work_id, tenant_id=tenant, deployment_id="d1", priority=0, cost=10, origin=origin
    )
    return dataclasses.replace(request, **fields)  # type: ignore[arg-type]


def served(core: SchedulerCore, work_id: str, now: float = 0.0, **fields: object) -> list[object]:
    """Submit and finish one call through the queue: the decisions its success made."""
    (dispatch,) = core.submit(work(work_id, **fields), now)
    assert isinstance(dispatch, Dispatched)
    return core.finish(work_id, Outcome.SUCCESS, now)


def grants(decisions: list[object]) -> list[CreditGranted]:
    return [d for d in decisions if isinstance(d, CreditGranted)]


def in_flight(core: SchedulerCore) -> int:
    return core.snapshot(0.0).residencies[0].in_flight


def test_a_success_through_the_queue_earns_its_stream_a_credit_that_holds_its_slot() -> None:
    core = core_with()
    (grant,) = grants(served(core, "w1"))
    assert (grant.origin, grant.tenant_id, grant.residency_id, grant.node_id, grant.slots) == (
        "a",
        "t1",
        "r1",
        "n1",
        1,
    )
    assert in_flight(core) == 1 and core.snapshot(0.0).credits == 1
    # Calls on it are counted served when reported, budget window included; the slot stays held.
    assert core.credit_used("a", grant.credit_id, Outcome.SUCCESS, 1.0, reason="", cost=7) == []
    snapshot = core.snapshot(1.0)
    (tenant,) = snapshot.tenants
    assert (snapshot.dispatched_total, snapshot.credited_total) == (2, 1)
    assert (tenant.served_total, tenant.served_cost, tenant.in_flight) == (2, 17, 0)
    assert in_flight(core) == 1
    # Another stream cannot report on it, nor return it.
    assert core.credit_used("b", grant.credit_id, Outcome.SUCCESS, 1.0, reason="", cost=1) == []
    core.return_credits("b", [grant.credit_id], 1.0)
    assert core.snapshot(1.0).credits == 1
    core.return_credits("a", [grant.credit_id], 1.0)
    assert in_flight(core) == 0 and core.snapshot(1.0).credits == 0


def test_credits_stop_at_per_tenant_per_stream_and_short_of_the_deployments_reserve() -> None:
    core = core_with(slots=4, per_tenant=2)
    assert len(grants(served(core, "w1"))) == 1
    assert len(grants(served(core, "w2"))) == 1
    assert grants(served(core, "w3")) == []  # stream a holds 2 for t1
    # Stream b's credits count against the same slots: 2 of 4 are leased already, and the last
    # is the reserve (an eighth of 4, at least one).
    assert len(grants(served(core, "w4", origin="b"))) == 1
    assert grants(served(core, "w5", origin="b")) == []
    assert in_flight(core) == 3


@pytest.mark.parametrize(
    ("slots", "room"), [(1, 1), (2, 1), (4, 3), (8, 7), (9, 7), (32, 28), (64, 56)]
)
def test_credits_hold_every_slot_but_an_eighth_at_least_one(slots: int, room: int) -> None:
    assert credit_room(slots) == room


def test_by_default_a_lone_tenants_burst_is_credited_up_to_the_reserve() -> None:
    """The default lets one tenant's concurrent calls run on credits, not two of them: 32
    concurrent clients of one tenant went 94 % through the queue with 2 per stream, half with
    16 and credits held to half the slots (issue 29)."""
    assert DEFAULT_CREDITS_PER_TENANT == 32
    for slots, credited in ((32, 28), (64, DEFAULT_CREDITS_PER_TENANT)):
        core = core_with(slots=slots, per_tenant=DEFAULT_CREDITS_PER_TENANT)
        earned = [len(grants(served(core, f"w{i}"))) for i in range(credited + 4)]
        assert earned == [1] * credited + [0] * 4  # all but the reserve, or the per-stream cap
        assert in_flight(core) == credited
        # The reserve serves the queue at once: another tenant's call does not wait.
        assert [type(d) for d in core.submit(work("b1", "t2", origin="b"), 0.0)] == [Dispatched]


def test_work_that_waits_revokes_the_deployments_credits_and_their_return_serves_it() -> None:
    core = core_with(slots=2)
    (grant,) = grants(served(core, "w1"))
    assert [type(d) for d in core.submit(work("b1", "t2", origin="b"), 1.0)] == [Dispatched]
    # Both slots held (t2's call and the credit): t2's next call waits, which is contention.
    decisions = core.submit(work("b2", "t2", origin="b"), 1.0)
    assert decisions == [CreditsRevoked("a", (grant.credit_id,))]
    assert core.queued == 1 and in_flight(core) == 2  # revoked, not yet returned: still held
    # A call that was running on it when the revoke left is still reported and counted.
    core.credit_used("a", grant.credit_id, Outcome.SUCCESS, 1.5, reason="", cost=1)
    returned = core.return_credits("a", [grant.credit_id], 2.0)
    assert [(d.work_id, d.residency_id) for d in returned if isinstance(d, Dispatched)] == [
        ("b2", "r1")
    ]
    # The deployment was contended until b2 went at 2.0: no credit until the quiet second passed.
    assert core.finish("b1", Outcome.SUCCESS, 2.9) == []
    assert len(grants(core.finish("b2", Outcome.SUCCESS, 3.0))) == 1


def _full_with_a_new_credit(core: SchedulerCore) -> CreditGranted:
    """Four calls of t1 through the queue fill the 4 slots; the first ends and earns stream a
    credit, which takes its slot back at once: still 4 held, 3 calls and 1 credit."""
    for i in range(1, 5):
        (dispatch,) = core.submit(work(f"w{i}"), 0.0)
        assert isinstance(dispatch, Dispatched)
    (grant,) = grants(core.finish("w1", Outcome.SUCCESS, 0.0))
    assert in_flight(core) == 4
    return grant


def test_a_call_waiting_only_behind_its_streams_new_credit_takes_back_that_credit_alone() -> None:
    """The grant's race (issue 29): w1's client calls again before the credit its success
    earned reaches its control plane. Its call waits for the slot that credit holds; that is
    not contention, so only that credit comes back and credits keep being granted."""
    core = core_with(slots=4, per_tenant=4)
    grant = _full_with_a_new_credit(core)
    assert core.submit(work("w5"), 0.1) == [CreditsRevoked("a", (grant.credit_id,))]
    assert core.queued == 1
    returned = core.return_credits("a", [grant.credit_id], 0.2)
    assert [d.work_id for d in returned if isinstance(d, Dispatched)] == ["w5"]
    # No quiet second began: the next success earns a credit at once.
    assert len(grants(core.finish("w2", Outcome.SUCCESS, 0.3))) == 1


def test_own_waits_past_the_streams_live_credits_are_contention() -> None:
    core = core_with(slots=4, per_tenant=4)
    grant = _full_with_a_new_credit(core)
    assert core.submit(work("w5"), 0.1) == [CreditsRevoked("a", (grant.credit_id,))]
    # A second call waits with no credit of its stream left to explain it: contention.
    assert core.submit(work("w6"), 0.1) == []
    assert core.queued == 2
    core.return_credits("a", [grant.credit_id], 0.2)  # w5 goes; w6 waits on
    assert core.queued == 1
    assert grants(core.finish("w2", Outcome.SUCCESS, 0.3)) == []  # w6 takes w2's slot
    assert grants(core.finish("w6", Outcome.SUCCESS, 0.4)) == []  # quiet until 1.1


def test_another_tenants_or_streams_wait_beside_an_own_wait_revokes_every_credit() -> None:
    # Another tenant on the same stream, the same tenant on another stream, a BATCH call.
    for other in (work("x1", "t2", origin="a"), work("x1", origin="b"), work("x1", priority=2)):
        core = core_with(slots=4, per_tenant=4)
        _full_with_a_new_credit(core)
        (second,) = grants(core.finish("w2", Outcome.SUCCESS, 0.0))
        (first_back,) = core.submit(work("w5"), 0.1)  # the newest comes back alone
        assert first_back == CreditsRevoked("a", (second.credit_id,))
        (all_back,) = core.submit(other, 0.1)
        assert isinstance(all_back, CreditsRevoked) and len(all_back.credit_ids) == 1
        assert all_back.credit_ids != first_back.credit_ids


def test_a_stream_that_ends_gives_its_credits_back_to_the_work_waiting() -> None:
    core = core_with(slots=2, per_tenant=1)
    (grant,) = grants(served(core, "w1"))
    core.submit(work("b1", "t2", origin="b"), 1.0)
    revoked = core.submit(work("b2", "t2", origin="b"), 1.0)
    assert revoked == [CreditsRevoked("a", (grant.credit_id,))]
    decisions = core.drop_origin("a", 2.0)
    assert [d.work_id for d in decisions if isinstance(d, Dispatched)] == ["b2"]
    assert core.snapshot(2.0).credits == 0
    # What the ended stream reports late counts nothing.
    assert core.credit_used("a", grant.credit_id, Outcome.SUCCESS, 2.0, reason="", cost=1) == []
    assert core.snapshot(2.0).credited_total == 0


def test_infra_failures_on_credits_count_on_the_breakers_and_an_open_one_revokes() -> None:
    core = core_with()
    (grant,) = grants(served(core, "w1"))
    failed = core.credit_used(
        "a", grant.credit_id, Outcome.INFRA_FAILURE, 1.0, reason="RUNTIME_CRASHED", cost=1
    )
    assert failed == []  # one of two
    failed = core.credit_used(
        "a", grant.credit_id, Outcome.INFRA_FAILURE, 1.0, reason="RUNTIME_CRASHED", cost=1
    )
    assert BreakerChange("n1", "d1", BreakerState.OPEN, 2) in failed
    assert CreditsRevoked("a", (grant.credit_id,)) in failed
    assert core.snapshot(1.0).infra_failures_total == 2


def test_a_residency_that_leaves_revokes_its_credits() -> None:
    core = core_with()
    (grant,) = grants(served(core, "w1"))
    draining = ResidencyInfo("r1", "d1", "n1", ResidencyPhase.DRAINING, slots=4)
    assert core.upsert_residency(draining, 1.0) == [CreditsRevoked("a", (grant.credit_id,))]


def test_no_credit_for_a_budget_a_tight_quota_or_batch_work_and_a_new_policy_revokes() -> None:
    core = core_with()
    core.set_policies(
        [TenantPolicy("budgeted", budget_units=1000), TenantPolicy("tight", max_concurrency=1)]
    )
    assert grants(served(core, "w1", tenant_id="budgeted")) == []
    assert grants(served(core, "w2", tenant_id="tight")) == []
    assert grants(served(core, "w3", priority=int(Priority.BATCH))) == []
    (grant,) = grants(served(core, "w4"))
    assert core.set_policies([TenantPolicy("t1", weight=3)]) == [
        CreditsRevoked("a", (grant.credit_id,))
    ]


def test_credits_off_grants_none() -> None:
    core = core_with(per_tenant=0)
    assert grants(served(core, "w1")) == []


def test_a_stream_that_does_not_take_credits_gets_none() -> None:
    core = core_with()
    assert grants(served(core, "w1", origin="older")) == []
    core.takes_credits("a", False)
    assert grants(served(core, "w2")) == []


def test_a_credit_counts_against_the_tenants_concurrency_like_a_call() -> None:
    core = core_with()
    core.set_policies([TenantPolicy("t1", max_concurrency=2)])
    assert len(grants(served(core, "w1"))) == 1  # outstanding 1 of 2
    assert grants(served(core, "w2")) == []  # a second would leave no room for a call
    assert [type(d) for d in core.submit(work("w3"), 1.0)] == [Dispatched]
    (refused,) = core.submit(work("w4"), 1.0)
    assert getattr(refused, "reason", "") == "TENANT_QUOTA_EXCEEDED"


FACTS = GrantFacts(
    per_tenant=2,
    held=0,
    queue_empty=True,
    quiet=True,
    routable=True,
    tenant_free=True,
    free_slots=4,
    slots=1,
    credit_slots=0,
    routable_slots=8,
)


def test_may_grant_needs_every_condition() -> None:
    assert may_grant(FACTS)
    for change in (
        {"per_tenant": 0},
        {"held": 2},
        {"queue_empty": False},
        {"quiet": False},
        {"routable": False},
        {"tenant_free": False},
        {"free_slots": 0},
        {"credit_slots": 7},  # 8 routable slots: the eighth is the reserve
        {"slots": 5},
    ):
        assert not may_grant(dataclasses.replace(FACTS, **change)), change  # type: ignore[arg-type]
    # A residency of one slot may still lease it (it has no reserve).
    assert may_grant(dataclasses.replace(FACTS, routable_slots=1, free_slots=1))


class CreditMachine(RuleBasedStateMachine):
    """Random calls on two streams, credits used, returned and revoked, residencies moving and
    streams closing: the credits the streams hold are the core's, and every slot held comes
    back (nothing running and no credit held leaves every residency empty)."""

    def __init__(self) -> None:
        super().__init__()
        self.core = core_with(slots=4, per_tenant=2, global_queue_depth=20)
        self.now = 0.0
        self.next_id = 0
        self.open: dict[str, str] = {}  # accepted, not yet finished -> its origin
        self.credits: dict[str, CreditGranted] = {}  # held by a stream, not yet returned

    def _apply(self, decisions: list[object]) -> None:
        for decision in decisions:
            if isinstance(decision, WorkRejected):
                self.open.pop(decision.work_id, None)
            elif isinstance(decision, CreditGranted):
                assert decision.credit_id not in self.credits
                self.credits[decision.credit_id] = decision
            elif isinstance(decision, CreditsRevoked):
                assert all(self.credits[c].origin == decision.origin for c in decision.credit_ids)

    @rule(tenant=st.sampled_from(["t1", "t2"]), origin=st.sampled_from(["a", "b"]))
    def submit(self, tenant: str, origin: str) -> None:
        self.next_id += 1
        work_id = f"w{self.next_id}"
        self.open[work_id] = origin
        self._apply(self.core.submit(work(work_id, tenant, origin=origin), self.now))

    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)))
    def finish(self, data: st.DataObject, outcome: Outcome) -> None:
        if self.open:
            work_id = data.draw(st.sampled_from(sorted(self.open)))
            del self.open[work_id]
            self._apply(self.core.finish(work_id, outcome, self.now))

    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)))
    def use_a_credit(self, data: st.DataObject, outcome: Outcome) -> None:
        if self.credits:
            grant = self.credits[data.draw(st.sampled_from(sorted(self.credits)))]
            self._apply(
                self.core.credit_used(
                    grant.origin, grant.credit_id, outcome, self.now, reason="", cost=3
                )
            )

    @rule(data=st.data())
    def return_a_credit(self, data: st.DataObject) -> None:
        if self.credits:
            grant = self.credits.pop(data.draw(st.sampled_from(sorted(self.credits))))
            self._apply(self.core.return_credits(grant.origin, [grant.credit_id], self.now))

    @rule(seconds=st.floats(0.01, 2.0))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self._apply(self.core.tick(self.now))

    @rule(phase=st.sampled_from([ResidencyPhase.RESIDENT, ResidencyPhase.DRAINING]))
    def move_r1(self, phase: ResidencyPhase) -> None:
        residency = ResidencyInfo("r1", "d1", "n1", phase, slots=4)
        self._apply(self.core.upsert_residency(residency, self.now))

    @rule(origin=st.sampled_from(["a", "b"]))
    def stream_closes(self, origin: str) -> None:
        self.open = {w: o for w, o in self.open.items() if o != origin}
        self.credits = {c: g for c, g in self.credits.items() if g.origin != origin}
        self._apply(self.core.drop_origin(origin, self.now))
        self.core.takes_credits(origin, True)  # it reconnects, its snapshot saying so again

    @invariant()
    def the_streams_credits_are_the_cores_and_every_slot_comes_back(self) -> None:
        snapshot = self.core.snapshot(self.now)
        assert snapshot.credits == len(self.credits)
        held = sum(r.in_flight for r in snapshot.residencies)
        assert held <= sum(r.slots for r in snapshot.residencies)
        if not self.open and not self.credits:
            assert held == 0
            assert all(t.in_flight == 0 for t in snapshot.tenants)


TestCreditMachine = CreditMachine.TestCase
TestCreditMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
