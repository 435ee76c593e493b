"""Tenant admission: limits refused in order with nothing counted, budgets, policies, accounting."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.common.errors import GantryError
from gantry.scheduler.policy.admission import TenantBook, TenantLoadView
from gantry.scheduler.policy.types import Priority, Refusal, TenantPolicy


def _book(*, queue_depth: int = 10, concurrency: int = 10, global_depth: int = 100) -> TenantBook:
    return TenantBook(
        default_queue_depth=queue_depth,
        default_concurrency=concurrency,
        global_queue_depth=global_depth,
    )


def _load(book: TenantBook, tenant_id: str, now: float = 0.0) -> TenantLoadView:
    return next(view for view in book.loads(now) if view.tenant_id == tenant_id)


def _refusal(outcome: Refusal | None) -> Refusal:
    assert isinstance(outcome, Refusal), outcome
    return outcome


def test_a_full_global_queue_is_refused_first_and_names_the_limit():
    book = _book(queue_depth=1, concurrency=1, global_depth=2)
    book.set_policy(TenantPolicy("c", budget_units=1))
    assert book.admit("a", 1, 0.0) is None
    assert book.admit("b", 1, 0.0) is None
    before = book.loads(0.0)
    # "c" would also break its budget; the global limit is what it hears about first.
    refusal = _refusal(book.admit("c", 5, 0.0))
    assert refusal.reason == "QUEUE_FULL" and "global limit 2" in refusal.message
    assert book.loads(0.0) == before and book.queued_total() == 2


def test_a_tenants_full_queue_comes_before_its_quota_and_budget():
    book = _book(queue_depth=2, concurrency=2)
    book.set_policy(TenantPolicy("a", budget_units=2))
    assert book.admit("a", 1, 0.0) is None
    assert book.admit("a", 1, 0.0) is None
    before = _load(book, "a")
    refusal = _refusal(book.admit("a", 1, 0.0))
    assert refusal.reason == "QUEUE_FULL" and "tenant a" in refusal.message
    assert "limit is 2" in refusal.message
    assert _load(book, "a") == before


def test_outstanding_work_over_the_quota_is_refused_before_the_budget():
    book = _book(queue_depth=5, concurrency=2)
    book.set_policy(TenantPolicy("a", budget_units=2))
    assert book.admit("a", 1, 0.0) is None
    book.dispatched("a", 1)
    assert book.admit("a", 1, 0.0) is None  # one running, one waiting: at its quota of 2
    before = _load(book, "a")
    refusal = _refusal(book.admit("a", 1, 0.0))
    assert refusal.reason == "TENANT_QUOTA_EXCEEDED" and "limit is 2" in refusal.message
    assert _load(book, "a") == before


def test_budget_refusal_says_used_limit_and_when_the_window_resets():
    book = _book()
    book.set_policy(TenantPolicy("a", budget_units=10, budget_window_seconds=60))
    assert book.admit("a", 6, 100.0) is None
    book.dispatched("a", 6)
    before = _load(book, "a", 110.0)
    refusal = _refusal(book.admit("a", 5, 110.0))
    assert refusal.reason == "BUDGET_EXCEEDED"
    assert "used 6 of 10" in refusal.message and "resets in 50s" in refusal.message
    assert _load(book, "a", 110.0) == before and before.budget_used == 6


def test_a_call_bigger_than_the_whole_budget_is_refused_with_that_reason():
    book = _book()
    book.set_policy(TenantPolicy("a", budget_units=10))
    refusal = _refusal(book.admit("a", 11, 0.0))
    assert refusal.reason == "BUDGET_EXCEEDED" and "whole budget of 10" in refusal.message


def test_the_budget_window_opens_at_the_first_charge_and_resets_after_it():
    book = _book()
    book.set_policy(TenantPolicy("a", budget_units=10, budget_window_seconds=60))
    assert book.admit("a", 10, 5.0) is None
    assert _refusal(book.admit("a", 1, 64.9)).reason == "BUDGET_EXCEEDED"
    assert book.admit("a", 4, 65.0) is None  # 60 s after the first charge: a fresh window
    assert _load(book, "a", 65.0).budget_used == 4
    assert _load(book, "a", 125.0).budget_used == 0  # that window closed too


def test_dropped_work_is_refunded_when_its_charge_is_in_the_current_window():
    book = _book()
    book.set_policy(TenantPolicy("a", budget_units=10, budget_window_seconds=60))
    assert book.admit("a", 4, 0.0) is None
    book.dropped("a", 4, 1.0)
    load = _load(book, "a", 1.0)
    assert load.queued == 0 and load.budget_used == 0
    assert book.admit("a", 10, 2.0) is None


def test_a_charge_from_a_closed_window_is_not_refunded_from_the_next():
    book = _book()
    book.set_policy(TenantPolicy("a", budget_units=10, budget_window_seconds=60))
    assert book.admit("a", 4, 0.0) is None  # charged in the window 0..60
    assert book.admit("a", 3, 61.0) is None  # opens the window 61..121
    book.dropped("a", 4, 62.0, charged_at=0.0)
    load = _load(book, "a", 62.0)
    assert load.queued == 1 and load.budget_used == 3


def test_a_policy_change_applies_to_the_next_admit_and_leaves_counts_alone():
    book = _book()
    book.set_policy(TenantPolicy("a", max_concurrency=1))
    assert book.admit("a", 1, 0.0) is None
    assert _refusal(book.admit("a", 1, 0.0)).reason == "TENANT_QUOTA_EXCEEDED"
    before = _load(book, "a")
    book.set_policy(TenantPolicy("a", max_concurrency=2, weight=4))
    after = _load(book, "a")
    assert (after.queued, after.in_flight, after.rejected_total) == (
        before.queued,
        before.in_flight,
        before.rejected_total,
    )
    assert after.weight == 4
    assert book.admit("a", 1, 0.0) is None


def test_replacing_the_policies_drops_stale_ones_back_to_defaults():
    book = _book(concurrency=3)
    book.set_policy(TenantPolicy("a", weight=5, max_concurrency=1))
    book.replace_policies([TenantPolicy("b", weight=2)])
    assert book.policy("a") == TenantPolicy("a")
    assert book.policy("b").weight == 2
    for _ in range(3):
        assert book.admit("a", 1, 0.0) is None
    assert _refusal(book.admit("a", 1, 0.0)).reason == "TENANT_QUOTA_EXCEEDED"


def test_proto_zero_values_mean_their_defaults():
    book = _book()
    book.set_policy(
        TenantPolicy("a", weight=0, budget_window_seconds=0, allowed_priorities=frozenset())
    )
    policy = book.policy("a")
    assert policy.weight == 1 and policy.budget_window_seconds == 60
    assert policy.allowed_priorities == frozenset(Priority)


def test_unspecified_priority_resolves_to_interactive_when_allowed_else_batch():
    book = _book()
    assert book.resolve_priority("a", 0) is Priority.INTERACTIVE
    book.set_policy(TenantPolicy("b", allowed_priorities=frozenset({Priority.BATCH})))
    assert book.resolve_priority("b", 0) is Priority.BATCH
    assert book.resolve_priority("b", int(Priority.BATCH)) is Priority.BATCH


def test_a_priority_the_tenant_may_not_use_is_permission_denied():
    book = _book()
    book.set_policy(TenantPolicy("b", allowed_priorities=frozenset({Priority.BATCH})))
    refusal = book.resolve_priority("b", int(Priority.INTERACTIVE))
    assert refusal == Refusal(
        "PERMISSION_DENIED", "tenant b may not use priority INTERACTIVE; allowed: BATCH"
    )
    unknown = book.resolve_priority("b", 9)
    assert isinstance(unknown, Refusal) and unknown.reason == "INVALID_ARGUMENT"


def test_loads_report_served_and_weight_shares():
    book = _book()
    book.set_policy(TenantPolicy("a", weight=1))
    book.set_policy(TenantPolicy("b", weight=3))
    book.set_policy(TenantPolicy("idle", weight=10))
    for tenant_id, cost in (("a", 1), ("b", 3)):
        assert book.admit(tenant_id, cost, 0.0) is None
        book.dispatched(tenant_id, cost)
    book.rejected("a")
    loads = {view.tenant_id: view for view in book.loads(0.0)}
    assert [view.tenant_id for view in book.loads(0.0)] == ["a", "b", "idle"]
    assert loads["a"].served_share == pytest.approx(0.25)
    assert loads["b"].served_share == pytest.approx(0.75)
    assert loads["a"].weight_share == pytest.approx(0.25)
    assert loads["b"].weight_share == pytest.approx(0.75)
    assert loads["idle"].weight_share == 0.0
    assert loads["a"].rejected_total == 1
    book.finished("a")
    loads = {view.tenant_id: view for view in book.loads(0.0)}
    assert loads["a"].weight_share == 0.0 and loads["b"].weight_share == 1.0


def test_unmatched_calls_never_drive_counts_below_zero():
    book = _book()
    book.finished("ghost")  # work dispatched before a restart finishes after it
    book.dropped("ghost", 3, 0.0)
    load = _load(book, "ghost")
    assert (load.queued, load.in_flight) == (0, 0) and book.queued_total() == 0


def test_nonpositive_limits_and_costs_are_programming_errors():
    with pytest.raises(GantryError):
        _book(global_depth=0)
    with pytest.raises(GantryError):
        _book().admit("a", 0, 0.0)


# The model the book must agree with under any sequence of events.


@dataclass
class _ModelTenant:
    queued_charges: list[float] = field(default_factory=list)  # each waiting call's admit time
    in_flight: int = 0
    served_total: int = 0
    served_cost: int = 0
    window_opened_at: float | None = None
    window_used: int = 0


_LIMITS = {"t0": TenantPolicy("t0", max_queue_depth=3, max_concurrency=4, budget_units=20)}
_LIMITS["t1"] = TenantPolicy("t1", weight=2, budget_units=0)
_LIMITS["t2"] = TenantPolicy("t2", max_concurrency=2, budget_units=9, budget_window_seconds=10)
_GLOBAL_DEPTH, _DEFAULT_DEPTH, _DEFAULT_CONCURRENCY = 6, 5, 6


def _expected_reason(model: dict[str, _ModelTenant], tenant_id: str, cost: int, now: float):
    policy = _LIMITS[tenant_id]
    tenant = model[tenant_id]
    if sum(len(t.queued_charges) for t in model.values()) >= _GLOBAL_DEPTH:
        return "QUEUE_FULL"
    if len(tenant.queued_charges) >= (policy.max_queue_depth or _DEFAULT_DEPTH):
        return "QUEUE_FULL"
    if len(tenant.queued_charges) + tenant.in_flight >= (
        policy.max_concurrency or _DEFAULT_CONCURRENCY
    ):
        return "TENANT_QUOTA_EXCEEDED"
    if policy.budget_units and _model_used(tenant, policy, now) + cost > policy.budget_units:
        return "BUDGET_EXCEEDED"
    return None


def _window_open(tenant: _ModelTenant, policy: TenantPolicy, now: float) -> bool:
    opened = tenant.window_opened_at
    return opened is not None and now < opened + policy.budget_window_seconds


def _model_used(tenant: _ModelTenant, policy: TenantPolicy, now: float) -> int:
    return tenant.window_used if _window_open(tenant, policy, now) else 0


_events = st.lists(
    st.tuples(
        st.sampled_from(["admit", "dispatch", "finish", "drop"]),
        st.sampled_from(sorted(_LIMITS)),
        st.integers(1, 6),
        st.floats(0, 4),
    ),
    max_size=150,
)


@settings(max_examples=200, deadline=None)
@given(events=_events)
def test_counts_never_go_negative_and_match_a_model(events):
    book = TenantBook(
        default_queue_depth=_DEFAULT_DEPTH,
        default_concurrency=_DEFAULT_CONCURRENCY,
        global_queue_depth=_GLOBAL_DEPTH,
    )
    book.replace_policies(_LIMITS.values())
    model = {tenant_id: _ModelTenant() for tenant_id in _LIMITS}
    costs: dict[str, list[int]] = {tenant_id: [] for tenant_id in _LIMITS}
    now = 0.0
    for kind, tenant_id, cost, elapsed in events:
        now += elapsed
        tenant, policy = model[tenant_id], _LIMITS[tenant_id]
        if kind == "admit":
            expected = _expected_reason(model, tenant_id, cost, now)
            outcome = book.admit(tenant_id, cost, now)
            assert (outcome.reason if outcome else None) == expected
            if outcome is None:
                tenant.queued_charges.append(now)
                costs[tenant_id].append(cost)
                if not _window_open(tenant, policy, now):
                    tenant.window_opened_at, tenant.window_used = now, 0
                tenant.window_used += cost
            else:
                book.rejected(tenant_id)
        elif kind == "dispatch" and tenant.queued_charges:
            tenant.queued_charges.pop(0)
            served_cost = costs[tenant_id].pop(0)
            book.dispatched(tenant_id, served_cost)
            tenant.in_flight += 1
            tenant.served_total += 1
            tenant.served_cost += served_cost
        elif kind == "finish":
            book.finished(tenant_id)  # sometimes unmatched: must be ignored
            tenant.in_flight = max(0, tenant.in_flight - 1)
        elif kind == "drop" and tenant.queued_charges:
            charged_at = tenant.queued_charges.pop()
            dropped_cost = costs[tenant_id].pop()
            book.dropped(tenant_id, dropped_cost, now, charged_at=charged_at)
            if _window_open(tenant, policy, now) and charged_at >= (tenant.window_opened_at or 0):
                tenant.window_used -= dropped_cost
        for view in book.loads(now):
            twin = model[view.tenant_id]
            assert view.queued == len(twin.queued_charges) >= 0
            assert view.in_flight == twin.in_flight >= 0
            assert (view.served_total, view.served_cost) == (twin.served_total, twin.served_cost)
            assert view.budget_used == _model_used(twin, _LIMITS[view.tenant_id], now) >= 0
        assert book.queued_total() == sum(len(t.queued_charges) for t in model.values())
