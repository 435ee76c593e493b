"""Autoscale advice: replicas from load and queue wait, clamped, with hysteresis, on a fake time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gantry.common.errors import GantryError
from gantry.scheduler.policy.autoscale import Autoscaler, ScaleAdviceValue, ScaleSignal


def _signal(**changes: object) -> ScaleSignal:
    base = ScaleSignal(
        deployment_id="d",
        replicas=2,
        min_replicas=1,
        max_replicas=10,
        queued=0,
        in_flight=0,
        slots_per_replica=4,
        queue_wait_p50=0.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def _advice(value: ScaleAdviceValue | None) -> ScaleAdviceValue:
    assert value is not None
    return value


def _needing(replicas_needed: int, **changes: object) -> ScaleSignal:
    """A signal whose load needs exactly that many replicas at 4 slots and 80 %."""
    outstanding = int(replicas_needed * 4 * 0.8)
    return _signal(queued=0, in_flight=outstanding, **changes)


def test_scales_up_at_once_to_what_the_load_needs():
    autoscaler = Autoscaler()
    # 10 waiting + 4 running over 4 slots at 80 % = 4.375: five replicas.
    advice = _advice(autoscaler.advise(_signal(queued=10, in_flight=4), 0.0))
    assert (advice.desired_replicas, advice.current_replicas) == (5, 2)
    assert "10 waiting + 4 running" in advice.reason


def test_a_slow_queue_asks_for_one_more_replica_than_now():
    autoscaler = Autoscaler(latency_target_seconds=1.0)
    advice = _advice(autoscaler.advise(_signal(queued=1, in_flight=4, queue_wait_p50=2.5), 0.0))
    assert advice.desired_replicas == 3 and "queue wait p50 2.50s" in advice.reason


def test_a_slow_p50_with_nothing_waiting_asks_for_nothing():
    autoscaler = Autoscaler(latency_target_seconds=1.0)
    assert autoscaler.advise(_needing(2, queue_wait_p50=9.0), 0.0) is None


def test_advice_is_clamped_to_the_replica_bounds():
    autoscaler = Autoscaler()
    advice = _advice(autoscaler.advise(_signal(queued=1000, max_replicas=6), 0.0))
    assert advice.desired_replicas == 6 and "clamped to 6" in advice.reason


def test_replicas_outside_the_bounds_are_corrected_at_once():
    autoscaler = Autoscaler(scale_down_after_seconds=60.0)
    advice = _advice(autoscaler.advise(_needing(1, replicas=8, max_replicas=5), 0.0))
    assert advice.desired_replicas == 5 and "outside [1, 5]" in advice.reason
    below = _advice(Autoscaler().advise(_signal(replicas=0, min_replicas=2), 0.0))
    assert below.desired_replicas == 2


def test_scale_down_waits_for_a_quiet_spell_and_keeps_its_peak():
    autoscaler = Autoscaler(scale_down_after_seconds=60.0)
    assert autoscaler.advise(_needing(2, replicas=5), 0.0) is None
    assert autoscaler.advise(_needing(3, replicas=5), 30.0) is None
    assert autoscaler.advise(_needing(1, replicas=5), 59.9) is None
    advice = _advice(autoscaler.advise(_needing(1, replicas=5), 60.0))
    assert (advice.desired_replicas, advice.current_replicas) == (3, 5)


def test_a_busy_sample_restarts_the_quiet_spell():
    autoscaler = Autoscaler(scale_down_after_seconds=60.0)
    assert autoscaler.advise(_needing(1, replicas=5), 0.0) is None
    assert autoscaler.advise(_needing(5, replicas=5), 50.0) is None  # load back: spell broken
    assert autoscaler.advise(_needing(1, replicas=5), 55.0) is None
    assert autoscaler.advise(_needing(1, replicas=5), 114.9) is None
    assert _advice(autoscaler.advise(_needing(1, replicas=5), 115.0)).desired_replicas == 1


def test_the_same_advice_is_given_once():
    autoscaler = Autoscaler()
    assert _advice(autoscaler.advise(_signal(queued=10, in_flight=4), 0.0)).desired_replicas == 5
    assert autoscaler.advise(_signal(queued=10, in_flight=4), 1.0) is None
    assert autoscaler.advise(_signal(queued=10, in_flight=4, replicas=5), 2.0) is None
    assert _advice(autoscaler.advise(_signal(queued=20, in_flight=4), 3.0)).desired_replicas == 8


def test_load_returning_before_a_scale_down_is_applied_withdraws_it():
    autoscaler = Autoscaler(scale_down_after_seconds=10.0)
    autoscaler.advise(_needing(1, replicas=4), 0.0)
    assert _advice(autoscaler.advise(_needing(1, replicas=4), 10.0)).desired_replicas == 1
    # Not applied yet, and the load is back: the advice turns to keeping four.
    assert _advice(autoscaler.advise(_needing(4, replicas=4), 11.0)).desired_replicas == 4


def test_no_advice_when_min_equals_max():
    autoscaler = Autoscaler()
    signal = _signal(queued=100, min_replicas=3, max_replicas=3, replicas=1)
    assert autoscaler.advise(signal, 0.0) is None


def test_forget_clears_what_was_last_advised():
    autoscaler = Autoscaler()
    assert autoscaler.advise(_signal(queued=10, in_flight=4), 0.0) is not None
    autoscaler.forget("d")
    assert autoscaler.advise(_signal(queued=10, in_flight=4), 1.0) is not None


def test_float_noise_does_not_add_a_replica():
    autoscaler = Autoscaler(target_utilization=0.7)
    # 49 / (7 * 0.7) is 10.000000000000002 in floats: still ten replicas.
    signal = _signal(in_flight=49, slots_per_replica=7, replicas=2, max_replicas=20)
    assert _advice(autoscaler.advise(signal, 0.0)).desired_replicas == 10


def test_a_target_utilization_outside_zero_to_one_is_refused():
    with pytest.raises(GantryError):
        Autoscaler(target_utilization=0.0)
    with pytest.raises(GantryError):
        Autoscaler(target_utilization=1.5)
