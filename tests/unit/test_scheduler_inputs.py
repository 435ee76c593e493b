"""A residency's slots counted in inputs (issue 26): a call takes as many of them as it has inputs,
at most all of its residency's, so the host's batch size bounds what is dispatched to it, and
what does not fit waits here, where a tenant's max_queue_depth bounds it."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence

from gantry.controlplane.serving.invocation import work_inputs
from gantry.scheduler import wire
from gantry.scheduler.policy.core import SchedulerCore
from gantry.scheduler.policy.events import (
    Dispatched,
    NodeInfo,
    ResidencyInfo,
    WorkRejected,
    WorkRequest,
)
from gantry.scheduler.policy.types import Outcome, ResidencyPhase, TenantPolicy
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def _core(*residency_slots: int, policies: list[TenantPolicy] | None = None) -> SchedulerCore:
    core = SchedulerCore()
    core.load_cluster(
        nodes=[NodeInfo(node_id=f"n{i}", connected=True) for i in range(len(residency_slots))],
        residencies=[
            ResidencyInfo(f"r{i}", "d1", f"n{i}", phase=ResidencyPhase.RESIDENT, slots=slots)
            for i, slots in enumerate(residency_slots)
        ],
        deployments=[],
        policies=policies or [],
        now=0.0,
    )
    return core


def _call(work_id: str, inputs: int, tenant: str = "t1") -> WorkRequest:
    return WorkRequest(work_id, tenant, "d1", 0, cost=inputs * 40, inputs=inputs)


def _sent(decisions: Sequence[object]) -> list[str]:
    return [d.work_id for d in decisions if isinstance(d, Dispatched)]


def _held(core: SchedulerCore) -> dict[str, tuple[int, int]]:
    """Each residency's (slots held, slots)."""
    return {r.residency_id: (r.in_flight, r.slots) for r in core.snapshot(0.0).residencies}


def test_a_flood_of_eight_input_calls_past_max_queue_depth_is_refused_queue_full() -> None:
    # The case: 40 concurrent 8-text Embeds from a tenant whose max_queue_depth is 2, on
    # a deployment announcing 32 slots (its batch size). 4 calls fill the host; 2 wait here.
    core = _core(32, policies=[TenantPolicy(tenant_id="t1", max_queue_depth=2)])
    decisions = [d for i in range(40) for d in core.submit(_call(f"w{i}", 8), 0.0)]
    assert _sent(decisions) == ["w0", "w1", "w2", "w3"]
    refused = [d for d in decisions if isinstance(d, WorkRejected)]
    assert len(refused) == 34 and {r.reason for r in refused} == {"QUEUE_FULL"}
    assert (core.in_flight, core.queued) == (4, 2)
    assert _held(core) == {"r0": (32, 32)}
    # An answer frees its 8 slots: the next waiting call takes them.
    assert _sent(core.finish("w0", Outcome.SUCCESS, 1.0)) == ["w4"]


def test_one_input_calls_still_fill_every_slot() -> None:
    core = _core(32)
    decisions = [d for i in range(40) for d in core.submit(_call(f"w{i}", 1), 0.0)]
    assert len(_sent(decisions)) == 32
    assert (core.in_flight, core.queued) == (32, 8)


def test_a_call_bigger_than_its_residency_waits_for_it_to_empty_and_runs_there_alone() -> None:
    core = _core(32)
    assert _sent(core.submit(_call("small", 1), 0.0)) == ["small"]
    # 100 inputs on 32 slots: it fits nowhere while a call runs, and the calls behind it in fair
    # order wait with it rather than slip past it (it would wait for ever).
    assert _sent(core.submit(_call("big", 100), 0.0)) == []
    assert _sent(core.submit(_call("after", 1), 0.0)) == []
    assert _sent(core.finish("small", Outcome.SUCCESS, 1.0)) == ["big"]
    assert _held(core) == {"r0": (32, 32)}  # all of them, not 100
    assert _sent(core.submit(_call("more", 1), 1.0)) == []
    assert _sent(core.finish("big", Outcome.SUCCESS, 2.0)) == ["after", "more"]
    assert _held(core) == {"r0": (2, 32)}


def test_a_call_goes_to_a_residency_it_fits() -> None:
    core = _core(8, 8)
    assert _sent(core.submit(_call("a", 6), 0.0)) == ["a"]  # r0: 6 of 8
    assert _sent(core.submit(_call("b", 3), 0.0)) == ["b"]  # r1 (least held): 3 of 8
    assert _sent(core.submit(_call("c", 4), 0.0)) == ["c"]  # only r1 has 4 free
    assert _held(core) == {"r0": (6, 8), "r1": (7, 8)}
    assert _sent(core.submit(_call("d", 3), 0.0)) == []  # 2 and 1 free: it waits
    assert _sent(core.finish("b", Outcome.SUCCESS, 1.0)) == ["d"]
    assert _held(core) == {"r0": (6, 8), "r1": (7, 8)}


def test_a_cancelled_call_returns_its_slots() -> None:
    core = _core(16)
    assert _sent([d for i in range(3) for d in core.submit(_call(f"w{i}", 8), 0.0)]) == [
        "w0",
        "w1",
    ]
    assert _sent(core.finish("w1", Outcome.CANCELLED, 1.0)) == ["w2"]
    assert _held(core) == {"r0": (16, 16)}
    core.finish("w0", Outcome.INFRA_FAILURE, 2.0)
    core.finish("w2", Outcome.REQUEST_FAILURE, 2.0)
    assert _held(core) == {"r0": (0, 16)}


def test_zero_inputs_on_the_wire_take_one_slot_as_before() -> None:
    older = scheduler_pb2.WorkSubmitted(work_id="w", tenant_id="t", deployment_id="d1")
    assert wire.work(older).inputs == 1
    older.inputs = 8
    assert wire.work(older).inputs == 8


def _serve_inputs(
    calls: dict[str, tuple[int, int]], *, callers: int, slots: int, steps: int
) -> Counter[str]:
    """Closed-loop callers per tenant (tenant -> (weight, inputs per call)), one residency whose
    host works through the calls it holds in arrival order, one input per step; a caller answered
    calls again at once. Returns the inputs served per tenant."""
    core = _core(
        slots, policies=[TenantPolicy(tenant_id=t, weight=w) for t, (w, _) in calls.items()]
    )
    host: deque[str] = deque()
    left: dict[str, int] = {}
    served: Counter[str] = Counter()
    sequence = 0

    def submit(tenant: str, now: float) -> None:
        nonlocal sequence
        sequence += 1
        inputs = calls[tenant][1]
        request = WorkRequest(f"{tenant}-{sequence}", tenant, "d1", 0, cost=inputs, inputs=inputs)
        for work_id in _sent(core.submit(request, now)):
            host.append(work_id)
            left[work_id] = calls[work_id.split("-")[0]][1]

    def dispatched(decisions: Sequence[object]) -> None:
        for work_id in _sent(decisions):
            host.append(work_id)
            left[work_id] = calls[work_id.split("-")[0]][1]

    for tenant in calls:
        for _ in range(callers):
            submit(tenant, 0.0)
    for step in range(1, steps + 1):
        now = step * 0.001
        current = host[0]
        tenant = current.split("-")[0]
        served[tenant] += 1
        left[current] -= 1
        if left[current]:
            continue
        host.popleft()
        dispatched(core.finish(current, Outcome.SUCCESS, now))
        submit(tenant, now)
    return served


def test_saturating_tenants_are_served_inputs_by_weight_whatever_their_call_sizes() -> None:
    # The shape, 8-text Embeds from 24 callers each on 32 slots, then a tenant of
    # single-text calls beside one of 8-text calls.
    for calls in (
        {"a": (1, 8), "b": (3, 8)},
        {"a": (1, 8), "b": (3, 1)},
        {"a": (1, 1), "b": (3, 8)},
    ):
        served = _serve_inputs(calls, callers=24, slots=32, steps=12_000)
        ratio = served["b"] / served["a"]
        assert 3 * 0.9 <= ratio <= 3 * 1.1, (calls, served)


def test_the_control_plane_counts_a_calls_inputs_as_the_slots_it_asks_for() -> None:
    assert work_inputs(wg.EmbedPayload(inputs=[f"s{i}" for i in range(8)])) == 8
    assert work_inputs(wg.RerankPayload(query="q", documents=["a", "b", "c"])) == 3
    assert work_inputs(wg.EmbedImagePayload(images=[common_pb2.Image(), common_pb2.Image()])) == 2
    assert work_inputs(wg.GeneratePayload(prompt="hi")) == 1
    assert work_inputs(wg.EmbedPayload()) == 1  # refused later; never zero slots
