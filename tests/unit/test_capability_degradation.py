"""The degradation policy on a ManualClock: windows, thresholds, crash loops, bounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gantry.common.clock import ManualClock
from gantry.controlplane.serving.capability_degradation import (
    CRASH_LOOP,
    SUCCESS_RATE_LOW,
    CapabilityDegradation,
    Condition,
    DegradationSettings,
)
from gantry.v1 import control_plane_pb2 as cp

SETTINGS = DegradationSettings(window_s=60, min_outcomes=4, min_success_rate=0.75)


def _policy() -> tuple[CapabilityDegradation, ManualClock]:
    clock = ManualClock()
    return CapabilityDegradation(clock, SETTINGS), clock


def test_conditions_are_twins_of_the_wire_enum():
    wire = {
        name.removeprefix("CAPABILITY_CONDITION_")
        for name in cp.CapabilityCondition.keys()
        if name != "CAPABILITY_CONDITION_UNSPECIFIED"
    }
    assert wire == {c.value for c in Condition}


def test_a_low_success_rate_degrades_once_and_recovers_once_the_failures_age_out():
    policy, clock = _policy()
    for ok in (True, False, False, True):
        policy.record("embed", succeeded=ok)
    [degraded] = policy.evaluate()
    assert (degraded.condition, degraded.reason) == (Condition.DEGRADED, SUCCESS_RATE_LOW)
    assert (degraded.success_rate, degraded.outcomes) == (0.5, 4)
    assert policy.evaluate() == []  # no change, no new transition
    clock.advance(61)  # the failures leave the window
    for _ in range(4):
        policy.record("embed", succeeded=True)
    [recovered] = policy.evaluate()
    assert (recovered.condition, recovered.reason) == (Condition.HEALTHY, "")
    assert recovered.since == clock.now()


def test_too_few_outcomes_decide_nothing_and_the_threshold_itself_is_healthy():
    policy, _ = _policy()
    for ok in (False, False, False):
        policy.record("rare", succeeded=ok)
    for ok in (True, True, True, False):
        policy.record("edge", succeeded=ok)  # exactly 0.75
    assert policy.evaluate() == []
    assert {s.capability: s.condition for s in policy.states()} == {
        "rare": Condition.HEALTHY,
        "edge": Condition.HEALTHY,
    }


def test_a_crash_loop_degrades_without_outcomes_and_recovers_when_it_ends():
    policy, _ = _policy()
    [degraded] = policy.evaluate(crash_looping={"loopy"})
    assert (degraded.capability, degraded.reason) == ("loopy", CRASH_LOOP)
    [recovered] = policy.evaluate(crash_looping=set())
    assert recovered.condition is Condition.HEALTHY
    assert policy.states() == []  # healthy and nothing in its window: forgotten


def test_capabilities_and_outcomes_are_bounded():
    clock = ManualClock()
    policy = CapabilityDegradation(
        clock, DegradationSettings(max_capabilities=2, max_outcomes_per_capability=3)
    )
    for name in ("a", "b", "c"):
        policy.record(name, succeeded=True)
    assert [s.capability for s in policy.states()] == ["a", "b"]
    assert policy.dropped == 1
    for _ in range(10):
        policy.record("a", succeeded=False)
    assert {s.capability: s.outcomes for s in policy.states()}["a"] == 3


def test_the_degraded_gauge_is_published_from_the_evaluated_states():
    from gantry.controlplane.serving.degradation_signals import _degraded, publish_degradation

    policy, _ = _policy()
    policy.evaluate(crash_looping={"loopy"})
    for _ in range(4):
        policy.record("fine", succeeded=True)
    policy.evaluate(crash_looping={"loopy"})
    publish_degradation(policy)
    observed = {
        (o.attributes["capability"], o.attributes["reason"]): o.value
        for o in _degraded.observe(None)  # type: ignore[arg-type]
    }
    assert observed == {("loopy", CRASH_LOOP): 1.0, ("fine", ""): 0.0}


def test_a_capability_no_deployment_serves_is_forgotten_without_a_recovery():
    policy, clock = _policy()
    for ok in (False, False, False, False):
        policy.record("gone", succeeded=ok)
    policy.record("kept", succeeded=True)
    [degraded] = policy.evaluate()
    assert degraded.capability == "gone"
    policy.retain({"kept"})
    assert [s.capability for s in policy.states()] == ["kept"]
    clock.advance(61)
    assert policy.evaluate() == []  # no capability.recovered for one that was deleted


@given(
    steps=st.lists(
        st.one_of(
            st.booleans(),  # an outcome: succeeded or not
            st.floats(min_value=0, max_value=40),  # time passes, then a pass evaluates
        ),
        max_size=120,
    )
)
def test_the_kept_success_count_is_the_windows_own_through_evictions_and_age(
    steps: list[bool | float],
):
    """The rate comes from a count kept as outcomes arrive, fall off the bounded window and age
    out; whatever the order, it is the window's own count (the sum it replaced)."""
    clock = ManualClock()
    settings = DegradationSettings(
        window_s=60, min_outcomes=4, min_success_rate=0.75, max_outcomes_per_capability=7
    )
    policy = CapabilityDegradation(clock, settings)
    for step in steps:
        if isinstance(step, bool):
            policy.record("embed", succeeded=step)
        else:
            clock.advance(step)
            policy.evaluate()
        window = policy._windows.get("embed")
        if window is not None:
            assert window.successes == sum(ok for _, ok in window.outcomes)
            [state] = policy.states()
            assert state.outcomes == len(window.outcomes) <= 7
