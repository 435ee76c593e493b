"""Scale advice as a decision: clamped to the deployment's bounds, only for a serving deployment,
and a scale down that drains the right residencies, deterministically."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gantry.controlplane.deployments.autoscale_rules import (
    Advice,
    DeploymentScale,
    ReplicaBounds,
    ScaleKind,
    ServingReplica,
    decide_scale,
    surplus_replicas,
)
from gantry.controlplane.deployments.autoscaler import ScaleAdviceInbox
from gantry.controlplane.platform.state_machines import DeploymentState
from gantry.v1 import scheduler_pb2

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _deployment(
    *, state: str = "READY", replicas: int = 1, minimum: int = 1, maximum: int = 3
) -> DeploymentScale:
    return DeploymentScale(
        deployment_id="d1",
        state=state,
        replicas=replicas,
        min_replicas=minimum,
        max_replicas=maximum,
    )


def _advice(desired: int) -> Advice:
    return Advice(deployment_id="d1", desired_replicas=desired, reason="queue depth 40")


def test_advice_above_the_current_replicas_scales_up():
    action = decide_scale(_deployment(replicas=1), _advice(2))
    assert (action.kind, action.from_replicas, action.to_replicas) == (ScaleKind.UP, 1, 2)
    assert action.reason == "queue depth 40"
    assert action.why == ""


def test_advice_below_the_current_replicas_scales_down():
    action = decide_scale(_deployment(replicas=3), _advice(1))
    assert (action.kind, action.to_replicas) == (ScaleKind.DOWN, 1)


def test_advice_past_the_maximum_is_clamped_and_says_so():
    action = decide_scale(_deployment(replicas=1, maximum=2), _advice(9))
    assert (action.kind, action.to_replicas) == (ScaleKind.UP, 2)
    assert "clamped to [1, 2]" in action.why


def test_advice_under_the_minimum_never_drops_below_it():
    action = decide_scale(_deployment(replicas=3, minimum=2), _advice(0))
    assert (action.kind, action.to_replicas) == (ScaleKind.DOWN, 2)


def test_advice_equal_to_what_is_wanted_holds():
    assert decide_scale(_deployment(replicas=2), _advice(2)).kind is ScaleKind.HOLD


def test_a_deployment_without_bounds_never_moves():
    fixed = _deployment(replicas=2, minimum=2, maximum=2)
    assert not fixed.bounds.autoscaled
    for desired in (0, 1, 2, 5):
        assert decide_scale(fixed, _advice(desired)).kind is ScaleKind.HOLD


def test_a_legacy_zero_bound_reads_as_the_replicas():
    legacy = _deployment(replicas=2, minimum=0, maximum=0)
    assert legacy.bounds == ReplicaBounds(minimum=2, maximum=2)
    assert decide_scale(legacy, _advice(4)).kind is ScaleKind.HOLD


@pytest.mark.parametrize(
    "state",
    [s for s in DeploymentState if s not in (DeploymentState.READY, DeploymentState.DEGRADED)],
)
def test_only_a_ready_or_degraded_deployment_is_scaled(state: DeploymentState):
    action = decide_scale(_deployment(state=state, replicas=1), _advice(3))
    assert action.kind is ScaleKind.IGNORED
    assert action.to_replicas == 1
    assert state in action.why


@settings(max_examples=200, deadline=None)
@given(
    replicas=st.integers(min_value=1, max_value=64),
    low=st.integers(min_value=0, max_value=64),
    high=st.integers(min_value=0, max_value=64),
    desired=st.integers(min_value=0, max_value=1000),
    degraded=st.booleans(),
)
def test_the_target_always_lies_within_the_bounds(
    replicas: int, low: int, high: int, desired: int, degraded: bool
):
    minimum, maximum = min(low or replicas, replicas), max(high or replicas, replicas)
    deployment = _deployment(
        state="DEGRADED" if degraded else "READY",
        replicas=replicas,
        minimum=minimum,
        maximum=maximum,
    )
    action = decide_scale(deployment, _advice(desired))
    assert minimum <= action.to_replicas <= maximum
    assert action.from_replicas == replicas
    expected = {True: ScaleKind.UP, False: ScaleKind.DOWN}
    if action.to_replicas != replicas:
        assert action.kind is expected[action.to_replicas > replicas]
    else:
        assert action.kind is ScaleKind.HOLD


def _replica(residency_id: str, state: str, seconds: int) -> ServingReplica:
    return ServingReplica(
        residency_id=residency_id, state=state, updated_at=T0 + dt.timedelta(seconds=seconds)
    )


def test_a_scale_down_drains_the_most_recently_loaded_first():
    replicas = [
        _replica("r-old", "RESIDENT", 0),
        _replica("r-new", "RESIDENT", 60),
        _replica("r-mid", "RESIDENT", 30),
    ]
    assert surplus_replicas(replicas, keep=1) == ["r-new", "r-mid"]


def test_a_load_still_under_way_is_drained_before_a_serving_replica():
    replicas = [_replica("r-serving", "RESIDENT", 60), _replica("r-loading", "LOADING", 0)]
    assert surplus_replicas(replicas, keep=1) == ["r-loading"]


def test_replicas_already_leaving_or_uncertain_are_not_counted_or_drained():
    replicas = [
        _replica("r1", "RESIDENT", 0),
        _replica("r2", "UNLOADING", 10),
        _replica("r3", "UNCERTAIN", 20),
        _replica("r4", "COLD", 30),
    ]
    assert surplus_replicas(replicas, keep=1) == []


def test_ties_in_age_break_by_residency_id_whatever_the_input_order():
    replicas = [_replica(f"r{i}", "RESIDENT", 0) for i in (2, 4, 1, 3)]
    assert surplus_replicas(replicas, keep=2) == ["r4", "r3"]
    assert surplus_replicas(list(reversed(replicas)), keep=2) == ["r4", "r3"]


def _wire(deployment_id: str, desired: int) -> scheduler_pb2.ScaleAdvice:
    return scheduler_pb2.ScaleAdvice(deployment_id=deployment_id, desired_replicas=desired)


def test_the_inbox_keeps_only_the_latest_advice_per_deployment_and_wakes_its_reader():
    wakes: list[None] = []
    inbox = ScaleAdviceInbox()
    inbox.on_offer = lambda: wakes.append(None)
    inbox.offer(_wire("d1", 2))
    inbox.offer(_wire("d2", 3))
    inbox.offer(_wire("d1", 4))
    taken = inbox.take()
    assert [(a.deployment_id, a.desired_replicas) for a in taken] == [("d2", 3), ("d1", 4)]
    assert len(wakes) == 3
    assert inbox.take() == []


def test_a_full_inbox_gives_way_to_new_advice_by_dropping_the_oldest():
    inbox = ScaleAdviceInbox(limit=2)
    for deployment_id in ("d1", "d2", "d3"):
        inbox.offer(_wire(deployment_id, 2))
    assert len(inbox) == 2
    assert inbox.dropped == 1
    assert [a.deployment_id for a in inbox.take()] == ["d2", "d3"]
