"""Tenant policies and per-tenant accounting for admission: a refused request changes no count,
an admitted one is counted queued and charged to its tenant's budget in the same step.

Budget windows are fixed windows of `budget_window_seconds` that open at a tenant's first charge
after the previous window closed (not on a wall-clock grid): a tenant that has been quiet starts a
whole fresh window with its next request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gantry.common.errors import GantryError
from gantry.scheduler.policy.types import (
    ALL_PRIORITIES,
    DEFAULT_BUDGET_WINDOW_SECONDS,
    Priority,
    Refusal,
    TenantPolicy,
)

# What requested priority 0 (unspecified) resolves to, first allowed wins.
_UNSPECIFIED_PRIORITY_ORDER = (Priority.INTERACTIVE, Priority.BATCH)


@dataclass(frozen=True, slots=True)
class TenantLoadView:
    tenant_id: str
    weight: int
    queued: int
    in_flight: int
    served_total: int
    served_cost: int
    served_share: float  # of all served cost
    weight_share: float  # its weight over the weights of tenants with work; 0 when it has none
    rejected_total: int
    budget_used: int  # in the current window
    budget_units: int  # 0 = unlimited


@dataclass(slots=True)
class _TenantCounts:
    queued: int = 0
    in_flight: int = 0
    served_total: int = 0
    served_cost: int = 0
    rejected_total: int = 0
    window_opened_at: float | None = None
    window_used: int = 0
    leased: int = 0  # credits held (policy/credits.py): outstanding calls-to-be, on any stream


class TenantBook:
    """Every tenant's policy and counts; the core calls one method per event of a request's life."""

    def __init__(
        self, *, default_queue_depth: int, default_concurrency: int, global_queue_depth: int
    ) -> None:
        limits = {
            "default_queue_depth": default_queue_depth,
            "default_concurrency": default_concurrency,
            "global_queue_depth": global_queue_depth,
        }
        for name, value in limits.items():
            if value < 1:
                raise GantryError("INVALID_ARGUMENT", f"{name} must be >= 1, got {value}")
        self._default_queue_depth = default_queue_depth
        self._default_concurrency = default_concurrency
        self._global_queue_depth = global_queue_depth
        self._policies: dict[str, TenantPolicy] = {}
        self._counts: dict[str, _TenantCounts] = {}
        self._queued_total = 0
        self._served_cost_total = 0

    # Policies

    def replace_policies(self, policies: Iterable[TenantPolicy]) -> None:
        """The full set, as after a resync: a tenant missing from it falls back to the defaults."""
        self._policies = {policy.tenant_id: _normalized(policy) for policy in policies}

    def set_policy(self, policy: TenantPolicy) -> None:
        """Applies from the next admit; counts already taken stay as they are."""
        self._policies[policy.tenant_id] = _normalized(policy)

    def policy(self, tenant_id: str) -> TenantPolicy:
        """The stored policy (0 for a depth or quota still means the scheduler default)."""
        return self._policies.get(tenant_id) or TenantPolicy(tenant_id=tenant_id)

    def resolve_priority(self, tenant_id: str, requested: int) -> Priority | Refusal:
        allowed = self.policy(tenant_id).allowed_priorities
        if requested == 0:
            for priority in _UNSPECIFIED_PRIORITY_ORDER:
                if priority in allowed:
                    return priority
        try:
            priority = Priority(requested)
        except ValueError:
            return Refusal("INVALID_ARGUMENT", f"unknown priority {requested}")
        if priority not in allowed:
            allowed_names = ", ".join(p.name for p in sorted(allowed)) or "none"
            return Refusal(
                "PERMISSION_DENIED",
                f"tenant {tenant_id} may not use priority {priority.name}; allowed: "
                f"{allowed_names}",
            )
        return priority

    # Admission and the life of an admitted request

    def admit(self, tenant_id: str, cost: int, now: float) -> Refusal | None:
        """The first limit the request would break, or None after counting it queued and charged."""
        if cost < 1:
            raise GantryError("INVALID_ARGUMENT", f"cost must be >= 1, got {cost}")
        policy = self.policy(tenant_id)
        counts = self._counts.get(tenant_id) or _TenantCounts()
        if self._queued_total >= self._global_queue_depth:
            return Refusal(
                "QUEUE_FULL",
                f"the scheduler's queue is full: {self._queued_total} calls waiting, "
                f"global limit {self._global_queue_depth}",
            )
        queue_depth = policy.max_queue_depth or self._default_queue_depth
        if counts.queued >= queue_depth:
            return Refusal(
                "QUEUE_FULL",
                f"tenant {tenant_id} has {counts.queued} calls waiting, its limit is {queue_depth}",
            )
        concurrency = policy.max_concurrency or self._default_concurrency
        outstanding = counts.queued + counts.in_flight + counts.leased
        if outstanding >= concurrency:
            return Refusal(
                "TENANT_QUOTA_EXCEEDED",
                f"tenant {tenant_id} has {outstanding} calls outstanding (waiting and running), "
                f"its limit is {concurrency}",
            )
        if policy.budget_units:
            used = self._window_used(counts, policy, now)
            if used + cost > policy.budget_units:
                return Refusal("BUDGET_EXCEEDED", _budget_message(policy, counts, used, cost, now))
        self._charge(tenant_id, counts, policy, cost, now)
        return None

    def dispatched(self, tenant_id: str, cost: int) -> None:
        counts = self._counts_of(tenant_id)
        if counts.queued > 0:
            counts.queued -= 1
            self._queued_total -= 1
        counts.in_flight += 1
        counts.served_total += 1
        counts.served_cost += cost
        self._served_cost_total += cost

    def may_lease(self, tenant_id: str) -> bool:
        """Whether the tenant may hold one more credit (policy/credits.py): it has no budget (a
        budget is charged before a call runs, a credited call only after) and its outstanding
        calls, credits counted, stay under its concurrency."""
        policy = self.policy(tenant_id)
        counts = self._counts.get(tenant_id) or _TenantCounts()
        concurrency = policy.max_concurrency or self._default_concurrency
        outstanding = counts.queued + counts.in_flight + counts.leased
        return not policy.budget_units and outstanding + 1 < concurrency

    def lease(self, tenant_id: str, held: int) -> None:
        """Credits granted (`held` > 0) or back (< 0): each counts against the tenant's
        concurrency as an outstanding call would, whether or not a call runs on it."""
        counts = self._counts_of(tenant_id)
        counts.leased = max(0, counts.leased + held)

    def served(self, tenant_id: str, cost: int, now: float) -> None:
        """A call dispatched on a credit ended: served, and charged to the budget window."""
        counts = self._counts_of(tenant_id)
        counts.served_total += 1
        counts.served_cost += cost
        self._served_cost_total += cost
        policy = self.policy(tenant_id)
        if not self._window_open(counts, policy, now):
            counts.window_opened_at = now
            counts.window_used = 0
        counts.window_used += cost

    def finished(self, tenant_id: str) -> None:
        # An unmatched finish (work dispatched before a scheduler restart) is ignored, not counted
        # below zero.
        counts = self._counts_of(tenant_id)
        counts.in_flight = max(0, counts.in_flight - 1)

    def dropped(
        self, tenant_id: str, cost: int, now: float, *, charged_at: float | None = None
    ) -> None:
        """Queued work that left unserved (deadline, caller gone, circuit open).

        The charge is refunded when it fell in the tenant's current window. Pass `charged_at` (the
        admit time) to decide that exactly; without it, a charge is taken to be in the current
        window whenever one is open, which only errs for work queued longer than a whole window.
        """
        counts = self._counts_of(tenant_id)
        if counts.queued > 0:
            counts.queued -= 1
            self._queued_total -= 1
        policy = self.policy(tenant_id)
        opened_at = counts.window_opened_at
        if opened_at is None or not self._window_open(counts, policy, now):
            return
        if charged_at is not None and charged_at < opened_at:
            return
        counts.window_used = max(0, counts.window_used - cost)

    def rejected(self, tenant_id: str) -> None:
        self._counts_of(tenant_id).rejected_total += 1

    # Views

    def queued_total(self) -> int:
        return self._queued_total

    def loads(self, now: float) -> list[TenantLoadView]:
        """One view per tenant with a policy or any count, by tenant id."""
        tenant_ids = sorted(self._policies.keys() | self._counts.keys())
        weights = {tenant_id: self.policy(tenant_id).weight for tenant_id in tenant_ids}
        busy_weight = sum(
            weights[tenant_id]
            for tenant_id, counts in self._counts.items()
            if counts.queued or counts.in_flight
        )
        views = []
        for tenant_id in tenant_ids:
            policy = self.policy(tenant_id)
            counts = self._counts.get(tenant_id) or _TenantCounts()
            busy = bool(counts.queued or counts.in_flight)
            views.append(
                TenantLoadView(
                    tenant_id=tenant_id,
                    weight=policy.weight,
                    queued=counts.queued,
                    in_flight=counts.in_flight,
                    served_total=counts.served_total,
                    served_cost=counts.served_cost,
                    served_share=(
                        counts.served_cost / self._served_cost_total
                        if self._served_cost_total
                        else 0.0
                    ),
                    weight_share=policy.weight / busy_weight if busy and busy_weight else 0.0,
                    rejected_total=counts.rejected_total,
                    budget_used=self._window_used(counts, policy, now),
                    budget_units=policy.budget_units,
                )
            )
        return views

    # Internals

    def _counts_of(self, tenant_id: str) -> _TenantCounts:
        counts = self._counts.get(tenant_id)
        if counts is None:
            counts = self._counts[tenant_id] = _TenantCounts()
        return counts

    def _charge(
        self, tenant_id: str, counts: _TenantCounts, policy: TenantPolicy, cost: int, now: float
    ) -> None:
        self._counts[tenant_id] = counts
        counts.queued += 1
        self._queued_total += 1
        if not self._window_open(counts, policy, now):
            counts.window_opened_at = now
            counts.window_used = 0
        counts.window_used += cost

    @staticmethod
    def _window_open(counts: _TenantCounts, policy: TenantPolicy, now: float) -> bool:
        opened_at = counts.window_opened_at
        return opened_at is not None and now < opened_at + policy.budget_window_seconds

    @classmethod
    def _window_used(cls, counts: _TenantCounts, policy: TenantPolicy, now: float) -> int:
        return counts.window_used if cls._window_open(counts, policy, now) else 0


def _normalized(policy: TenantPolicy) -> TenantPolicy:
    """The proto's zero values made explicit: weight 0 is 1, window 0 is the default, no
    priorities listed is all of them."""
    return replace(
        policy,
        weight=max(1, policy.weight),
        max_queue_depth=max(0, policy.max_queue_depth),
        max_concurrency=max(0, policy.max_concurrency),
        budget_units=max(0, policy.budget_units),
        budget_window_seconds=(
            policy.budget_window_seconds
            if policy.budget_window_seconds > 0
            else DEFAULT_BUDGET_WINDOW_SECONDS
        ),
        allowed_priorities=frozenset(policy.allowed_priorities) or ALL_PRIORITIES,
    )


def _budget_message(
    policy: TenantPolicy, counts: _TenantCounts, used: int, cost: int, now: float
) -> str:
    tenant_id = policy.tenant_id
    if cost > policy.budget_units:
        return (
            f"tenant {tenant_id}: a call costing {cost} units exceeds its whole budget of "
            f"{policy.budget_units} units per {policy.budget_window_seconds}s window"
        )
    assert counts.window_opened_at is not None  # used + cost > budget >= cost means used > 0
    resets_in = counts.window_opened_at + policy.budget_window_seconds - now
    return (
        f"tenant {tenant_id} used {used} of {policy.budget_units} budget units in this window "
        f"(this call costs {cost}); the window resets in {math.ceil(resets_in)}s"
    )
