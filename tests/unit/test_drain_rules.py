"""A draining residency's verdict (deployments/drain_rules.py), the reconciler's drain plan
(reconciler_plans.plan_finish_drains), one scenario per rule, and what a worker stream counts and
cuts for a drain (nodes/sessions.py)."""

from __future__ import annotations

import datetime as dt
import typing

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.deployments.drain_rules import (
    DEFAULT_DRAIN_DEADLINE_S,
    DRAIN_SETTLE_S,
    MAX_DRAIN_DEADLINE_S,
    DrainingResidency,
    DrainVerdict,
    drain_deadline_s,
    drain_verdict,
)
from gantry.controlplane.deployments.reconciler_plans import plan_finish_drains
from gantry.controlplane.jobs import actions as act
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform.state_machines import ResidencyState

T0 = dt.datetime(2026, 12, 5, 8, 0, tzinfo=dt.UTC)
DEADLINE = T0 + dt.timedelta(seconds=30)


def draining(**overrides: typing.Any) -> DrainingResidency:
    facts: dict[str, typing.Any] = dict(
        residency_id="r1",
        deployment_id="d1",
        node_id="n1",
        draining_since=T0,
        deadline_at=DEADLINE,
        in_flight=0,
        stream_open=True,
    )
    return DrainingResidency(**(facts | overrides))


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_a_call_in_flight_holds_the_drain_until_it_finishes():
    assert drain_verdict(draining(in_flight=2), now=at(10)) is DrainVerdict.WAIT
    assert drain_verdict(draining(in_flight=0), now=at(10)) is DrainVerdict.IDLE


def test_an_idle_residency_waits_out_the_settle_for_calls_dispatched_before_the_drain():
    # The scheduler may have dispatched a call before it heard of the drain: it is counted in
    # flight only once it reaches the control plane, a round trip later.
    assert drain_verdict(draining(), now=T0) is DrainVerdict.WAIT
    assert drain_verdict(draining(), now=at(DRAIN_SETTLE_S / 2)) is DrainVerdict.WAIT
    assert drain_verdict(draining(), now=at(DRAIN_SETTLE_S)) is DrainVerdict.IDLE


def test_the_deadline_cuts_calls_still_running():
    assert drain_verdict(draining(in_flight=1), now=DEADLINE) is DrainVerdict.DEADLINE
    assert drain_verdict(draining(in_flight=0), now=DEADLINE) is DrainVerdict.IDLE


def test_a_deadline_shorter_than_the_settle_still_bounds_the_drain():
    short = draining(deadline_at=at(DRAIN_SETTLE_S / 4))
    assert drain_verdict(short, now=at(DRAIN_SETTLE_S / 4)) is DrainVerdict.IDLE


def test_a_worker_gone_leaves_nothing_to_wait_for():
    # Its calls failed with its stream; its UNLOAD waits for the worker like any other.
    gone = draining(stream_open=False, in_flight=0)
    assert drain_verdict(gone, now=T0) is DrainVerdict.IDLE


def test_a_row_without_a_recorded_deadline_gets_the_default():
    legacy = draining(deadline_at=None, in_flight=1)
    assert drain_verdict(legacy, now=at(DEFAULT_DRAIN_DEADLINE_S - 1)) is DrainVerdict.WAIT
    assert drain_verdict(legacy, now=at(DEFAULT_DRAIN_DEADLINE_S)) is DrainVerdict.DEADLINE


def test_the_requested_deadline_is_bounded():
    assert drain_deadline_s(0) == DEFAULT_DRAIN_DEADLINE_S
    assert drain_deadline_s(5) == 5
    assert drain_deadline_s(MAX_DRAIN_DEADLINE_S) == MAX_DRAIN_DEADLINE_S
    with pytest.raises(GantryError) as refused:
        drain_deadline_s(MAX_DRAIN_DEADLINE_S + 1)
    assert refused.value.reason == "INVALID_ARGUMENT"
    assert refused.value.metadata["field"] == "deadline_seconds"
    assert refused.value.metadata["limit"] == str(MAX_DRAIN_DEADLINE_S)


def _ending(
    residency_id: str, node_id: str, verdict: str, calls_cut: int
) -> tuple[act.Action, ...]:
    return (
        act.MarkResidency(residency_id=residency_id, state=ResidencyState.UNLOADING),
        act.QueueUnload(residency_id=residency_id, node_id=node_id),
        act.Settle(deployment_id="d1"),
        act.Audit(
            actor="reconciler",
            action="residency.drained",
            subject_kind="residency",
            subject_id=residency_id,
            detail=(
                ("deployment_id", "d1"),
                ("verdict", verdict),
                ("calls_cut", str(calls_cut)),
            ),
        ),
    )


def test_the_plan_unloads_what_is_done_and_cuts_only_past_the_deadline():
    busy = draining(residency_id="busy", in_flight=1)
    idle = draining(residency_id="idle", node_id="n2")
    late = draining(residency_id="late", node_id="n3", in_flight=3, deadline_at=at(5))
    plan = plan_finish_drains([busy, idle, late], now=at(10))
    assert plan.actions == _ending("idle", "n2", "IDLE", 0) + _ending("late", "n3", "DEADLINE", 3)
    assert plan.ended == (idle, late)
    assert plan.cut == (late,)


def test_nothing_is_planned_while_every_drain_waits():
    plan = plan_finish_drains([draining(in_flight=1), draining(residency_id="r2")], now=T0)
    assert (plan.actions, plan.ended, plan.cut) == ((), (), ())


async def test_a_stream_counts_and_cuts_one_deployments_calls_only():
    hub = WorkerHub()
    stream = hub.open_stream(node_id="n1", generation=1)
    hub.attach(stream)
    drained = [stream.begin_invoke(f"d1-{i}", deployment_id="d1") for i in range(2)]
    other = stream.begin_invoke("d2-0", deployment_id="d2")
    assert (stream.in_flight("d1"), stream.in_flight("d2"), stream.in_flight("d3")) == (2, 1, 0)

    cut = GantryError("DRAIN_DEADLINE_EXCEEDED", "the drain's deadline passed")
    assert stream.cancel_deployment_invokes("d1", cut) == 2
    for pending in drained:
        with pytest.raises(GantryError) as failed:
            pending.result.result()
        assert failed.value.reason == "DRAIN_DEADLINE_EXCEEDED"
    assert not other.result.done() and stream.in_flight("d1") == 0
    # The worker is told to drop each cut call (and nothing of the other deployment's).
    dropped = []
    while not stream.outbox.empty():
        message = stream.outbox.get_nowait()
        assert message is not None
        dropped.append(message.cancel_invoke.request_id)
    assert dropped == ["d1-0", "d1-1"]
