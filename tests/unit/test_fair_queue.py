"""The scheduler's fair queue: weighted shares, no starvation, no credit for idling, priorities."""

from __future__ import annotations

import itertools
from collections import Counter, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.common.errors import GantryError
from gantry.scheduler.policy.fair_queue import FairQueue, QueuedWork, bench_fair_queue
from gantry.scheduler.policy.types import Priority

NEVER_AGES = 1e12
_ids = itertools.count()


def _work(
    tenant_id: str,
    *,
    cost: int = 1,
    priority: Priority = Priority.INTERACTIVE,
    enqueued_at: float = 0.0,
    work_id: str | None = None,
) -> QueuedWork:
    return QueuedWork(
        work_id=work_id or f"w{next(_ids)}",
        tenant_id=tenant_id,
        deployment_id="d",
        priority=priority,
        cost=cost,
        enqueued_at=enqueued_at,
        deadline_at=None,
    )


def _saturated_run(
    weights: dict[str, int], costs: dict[str, int], pops: int, backlog: int = 4
) -> Counter[str]:
    """Keep every tenant backlogged; return the cost served to each."""
    queue = FairQueue(aging_seconds=NEVER_AGES)
    for tenant_id, weight in weights.items():
        for _ in range(backlog):
            queue.push(_work(tenant_id, cost=costs[tenant_id]), weight=weight)
    served: Counter[str] = Counter()
    for _ in range(pops):
        work = queue.pop(0.0)
        assert work is not None
        served[work.tenant_id] += work.cost
        queue.push(_work(work.tenant_id, cost=work.cost), weight=weights[work.tenant_id])
    return served


def _assert_shares_match_weights(served: Counter[str], weights: dict[str, int]) -> None:
    total_cost = sum(served.values())
    total_weight = sum(weights.values())
    for tenant_id, weight in weights.items():
        weight_share = weight / total_weight
        served_share = served[tenant_id] / total_cost
        assert abs(served_share - weight_share) <= 0.05 * weight_share, (tenant_id, served)


@pytest.mark.parametrize(
    ("weights", "costs"),
    [
        ({"a": 1, "b": 3}, {"a": 1, "b": 1}),
        ({"a": 1, "b": 2, "c": 5}, {"a": 1, "b": 1, "c": 1}),
        ({"a": 1, "b": 3}, {"a": 7, "b": 1}),
        ({"a": 1, "b": 2, "c": 5}, {"a": 3, "b": 10, "c": 1}),
    ],
)
def test_served_cost_converges_to_weight_shares_under_saturation(weights, costs):
    served = _saturated_run(weights, costs, pops=4000)
    _assert_shares_match_weights(served, weights)


@settings(max_examples=15, deadline=None)
@given(
    tenants=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 10)), min_size=2, max_size=5).map(
        lambda pairs: {f"t{i}": pair for i, pair in enumerate(pairs)}
    )
)
def test_any_saturated_mix_gets_its_weight_share(tenants):
    weights = {tenant_id: weight for tenant_id, (weight, _) in tenants.items()}
    costs = {tenant_id: cost for tenant_id, (_, cost) in tenants.items()}
    # Enough pops that the total served cost dwarfs the per-tenant lag of a few items.
    pops = 300 * len(tenants) * max(weights.values())
    _assert_shares_match_weights(_saturated_run(weights, costs, pops=pops), weights)


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(1, 6), min_size=2, max_size=6),
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 12)), min_size=1, max_size=300
    ),
)
def test_no_tenant_waits_more_than_a_bounded_number_of_pops(weights, steps):
    tenant_ids = [f"t{i}" for i in range(len(weights))]
    weight_of = dict(zip(tenant_ids, weights, strict=True))
    max_cost, max_weight = 12, max(weights)
    # A waiting tenant's front has finish <= V + 2*max_cost/w; each other tenant j fits at most
    # 2*max_cost*w_j/w + 1 items at or below that, and only its own items move V past it.
    bound = (len(tenant_ids) - 1) * (2 * max_cost * max_weight + 1) + 1
    queue = FairQueue(aging_seconds=NEVER_AGES)
    pops_waited: dict[str, int] = {}
    for is_push, tenant_index, cost in steps:
        tenant_id = tenant_ids[tenant_index % len(tenant_ids)]
        if is_push:
            queue.push(_work(tenant_id, cost=cost), weight=weight_of[tenant_id])
            pops_waited.setdefault(tenant_id, 0)
            continue
        work = queue.pop(0.0)
        if work is None:
            continue
        for waiting in pops_waited:
            pops_waited[waiting] += 1
        pops_waited[work.tenant_id] = 0
        for waiting, waited in pops_waited.items():
            if queue.depth_of(waiting):
                assert waited <= bound, (waiting, waited)
        pops_waited = {t: w for t, w in pops_waited.items() if queue.depth_of(t)}


@pytest.mark.parametrize(("newcomer_weight", "newcomer_share"), [(1, 0.5), (3, 0.75)])
def test_idle_tenant_gets_no_burst_when_it_returns(newcomer_weight, newcomer_share):
    queue = FairQueue(aging_seconds=NEVER_AGES)
    for _ in range(4):
        queue.push(_work("busy"), weight=1)
    for _ in range(5000):  # a long run of one tenant while the newcomer is away
        work = queue.pop(0.0)
        assert work is not None
        queue.push(_work("busy"), weight=1)
    for _ in range(400):
        queue.push(_work("newcomer"), weight=newcomer_weight)
    next_pops = 200
    served: Counter[str] = Counter()
    for _ in range(next_pops):
        work = queue.pop(0.0)
        assert work is not None
        served[work.tenant_id] += 1
        if work.tenant_id == "busy":
            queue.push(_work("busy"), weight=1)
    assert served["newcomer"] <= next_pops * newcomer_share + 1
    assert served["newcomer"] >= next_pops * newcomer_share - 1


def test_a_huge_item_costs_its_tenant_its_size_not_one_turn():
    queue = FairQueue(aging_seconds=NEVER_AGES)
    queue.push(_work("whale", cost=100_000), weight=1)
    queue.push(_work("whale", cost=100_000), weight=1)
    first = queue.pop(0.0)
    assert first is not None and first.tenant_id == "whale"
    for _ in range(1000):
        queue.push(_work("minnow"), weight=1)
    served = [queue.pop(0.0) for _ in range(1000)]
    assert all(work is not None and work.tenant_id == "minnow" for work in served)
    last = queue.pop(0.0)
    assert last is not None and last.tenant_id == "whale"


def test_a_tenants_own_items_are_served_in_order():
    queue = FairQueue(aging_seconds=NEVER_AGES)
    for index in range(10):
        queue.push(_work("a", cost=1 + index % 3, work_id=f"a{index}"), weight=2)
        queue.push(_work("b", work_id=f"b{index}"), weight=1)
    served = [queue.pop(0.0) for _ in range(20)]
    a_order = [work.work_id for work in served if work is not None and work.tenant_id == "a"]
    assert a_order == [f"a{index}" for index in range(10)]


def test_interactive_work_is_served_before_batch_work():
    queue = FairQueue(aging_seconds=60.0)
    queue.push(_work("a", priority=Priority.BATCH, work_id="batch"), weight=100)
    queue.push(_work("b", work_id="interactive-1"), weight=1)
    queue.push(_work("b", work_id="interactive-2"), weight=1)
    served = [queue.pop(1.0) for _ in range(3)]
    assert [work.work_id for work in served if work] == ["interactive-1", "interactive-2", "batch"]


def test_aged_batch_work_is_promoted_and_then_competes_as_interactive():
    queue = FairQueue(aging_seconds=10.0)
    queue.push(_work("batcher", priority=Priority.BATCH, work_id="old-batch"), weight=1)
    for _ in range(3):
        queue.push(_work("chatty", enqueued_at=1.0), weight=1)
    before_aging = queue.pop(9.9)
    assert before_aging is not None and before_aging.tenant_id == "chatty"
    queue.push(_work("chatty", enqueued_at=9.9), weight=1)
    # Promoted at 10 s, it joins the interactive class at V: served within its fair turn.
    served = [queue.pop(10.0), queue.pop(10.0)]
    assert "old-batch" in [work.work_id for work in served if work]


def test_promoted_work_joins_the_back_of_its_tenants_interactive_line():
    queue = FairQueue(aging_seconds=10.0)
    queue.push(_work("t", priority=Priority.BATCH, work_id="batch", enqueued_at=0.0), weight=1)
    queue.push(_work("t", work_id="interactive", enqueued_at=5.0), weight=1)
    served = [queue.pop(20.0), queue.pop(20.0)]
    assert [work.work_id for work in served if work] == ["interactive", "batch"]
    assert queue.pop(20.0) is None


def test_removed_work_leaves_no_trace_on_its_tenant():
    queue = FairQueue(aging_seconds=NEVER_AGES)
    queue.push(_work("a", cost=1000, work_id="big"), weight=1)
    queue.push(_work("a", work_id="small"), weight=1)
    queue.push(_work("b", work_id="b1"), weight=1)
    queue.push(_work("b", work_id="b2"), weight=1)
    removed = queue.remove("big")
    assert removed is not None and removed.work_id == "big"
    assert queue.remove("big") is None
    assert "big" not in queue and len(queue) == 3 and queue.depth_of("a") == 1
    # Had "big" kept its tag, "small" would wait behind 1000 units of b's work.
    served = [queue.pop(0.0) for _ in range(3)]
    assert [work.work_id for work in served if work] == ["small", "b1", "b2"]


def test_drain_returns_everything_in_serve_order_and_empties_the_queue():
    queue = FairQueue(aging_seconds=NEVER_AGES)
    queue.push(_work("a", priority=Priority.BATCH, work_id="batch"), weight=1)
    queue.push(_work("a", work_id="a1"), weight=1)
    queue.push(_work("b", work_id="b1"), weight=1)
    queue.push(_work("a", work_id="a2"), weight=1)
    assert [work.work_id for work in queue.drain()] == ["a1", "b1", "a2", "batch"]
    assert len(queue) == 0 and queue.depth_of("a") == 0 and queue.pop(0.0) is None


def test_duplicate_ids_and_nonpositive_cost_or_weight_are_refused():
    queue = FairQueue(aging_seconds=1.0)
    queue.push(_work("a", work_id="same"), weight=1)
    with pytest.raises(GantryError) as duplicate:
        queue.push(_work("a", work_id="same"), weight=1)
    assert duplicate.value.reason == "INVALID_ARGUMENT"
    with pytest.raises(GantryError):
        queue.push(_work("a", cost=0), weight=1)
    with pytest.raises(GantryError):
        queue.push(_work("a"), weight=0)
    assert len(queue) == 1


_operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.integers(0, 3),
            st.integers(1, 9),
            st.sampled_from(list(Priority)),
            st.integers(1, 4),
        ),
        st.tuples(st.just("pop")),
        st.tuples(st.just("remove"), st.integers(0, 10_000)),
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(operations=_operations)
def test_counts_order_and_drain_stay_exact_under_random_push_pop_remove(operations):
    queue = FairQueue(aging_seconds=NEVER_AGES)
    twin = FairQueue(aging_seconds=NEVER_AGES)  # fed the same, popped at the end
    # The model: each (tenant, class) line in arrival order.
    lines: dict[tuple[str, Priority], deque[str]] = {}
    tenant_of: dict[str, str] = {}
    pushed: list[str] = []
    for operation in operations:
        if operation[0] == "push":
            _, tenant_index, cost, priority, weight = operation
            tenant_id = f"t{tenant_index}"
            new_work = _work(tenant_id, cost=cost, priority=priority)
            queue.push(new_work, weight=weight)
            work_id = new_work.work_id
            twin.push(
                _work(tenant_id, cost=cost, priority=priority, work_id=work_id), weight=weight
            )
            lines.setdefault((tenant_id, priority), deque()).append(work_id)
            tenant_of[work_id] = tenant_id
            pushed.append(work_id)
        elif operation[0] == "pop":
            work = queue.pop(0.0)
            twin.pop(0.0)
            interactive_waiting = any(
                line for (_, priority), line in lines.items() if priority is Priority.INTERACTIVE
            )
            if work is None:
                assert not any(lines.values())
                continue
            assert work.priority is Priority.INTERACTIVE or not interactive_waiting
            assert lines[(work.tenant_id, work.priority)].popleft() == work.work_id
            del tenant_of[work.work_id]
        else:
            if not pushed:
                continue
            work_id = pushed[operation[1] % len(pushed)]
            removed = queue.remove(work_id)
            twin.remove(work_id)
            if work_id in tenant_of:
                assert removed is not None and removed.work_id == work_id
                lines[(removed.tenant_id, removed.priority)].remove(work_id)
                del tenant_of[work_id]
            else:
                assert removed is None
        assert len(queue) == len(tenant_of)
        for tenant_index in range(4):
            tenant_id = f"t{tenant_index}"
            assert queue.depth_of(tenant_id) == sum(t == tenant_id for t in tenant_of.values())
        assert all(work_id in queue for work_id in tenant_of)
    drained = [work.work_id for work in queue.drain()]
    popped = []
    while (next_work := twin.pop(0.0)) is not None:
        popped.append(next_work.work_id)
    assert drained == popped
    assert sorted(drained) == sorted(tenant_of)
    assert len(queue) == 0


def test_the_benchmark_runs():
    assert bench_fair_queue(tenants=10, operations=500) > 0
