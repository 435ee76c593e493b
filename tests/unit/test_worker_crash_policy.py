"""Crash-loop detection and restart backoff, on a clock moved by hand."""

from __future__ import annotations

import pytest

from gantry.common.clock import ManualClock
from gantry.worker.crash_policy import CrashHistory, RestartPolicy

POLICY = RestartPolicy(
    initial_backoff_s=0.5,
    max_backoff_s=4.0,
    crash_loop_threshold=3,
    crash_loop_window_s=300.0,
    crash_loop_backoff_s=60.0,
)


def test_backoff_doubles_per_crash_within_the_window_until_the_crash_loop() -> None:
    clock = ManualClock()
    history = CrashHistory(POLICY, clock)
    first = history.record_crash()
    clock.advance(10)
    second = history.record_crash()
    clock.advance(10)
    third = history.record_crash()
    assert (first.delay_s, first.crash_loop) == (0.5, False)
    assert (second.delay_s, second.crash_loop) == (1.0, False)
    assert (third.delay_s, third.crash_loop, third.crashes_in_window) == (60.0, True, 3)
    assert history.crash_loop


def test_crashes_further_apart_than_the_window_never_make_a_loop() -> None:
    clock = ManualClock()
    history = CrashHistory(POLICY, clock)
    for _ in range(5):
        decision = history.record_crash()
        assert (decision.delay_s, decision.crash_loop, decision.crashes_in_window) == (
            0.5,
            False,
            1,
        )
        clock.advance(300)


def test_crash_loop_ends_once_the_host_stays_up_past_the_window() -> None:
    clock = ManualClock()
    history = CrashHistory(POLICY, clock)
    for _ in range(3):
        history.record_crash()
    assert history.crash_loop
    clock.advance(299)
    assert history.crash_loop
    clock.advance(1)
    assert not history.crash_loop
    assert history.crashes_in_window == 0


def test_backoff_is_capped_when_the_threshold_is_high() -> None:
    clock = ManualClock()
    policy = RestartPolicy(initial_backoff_s=0.5, max_backoff_s=4.0, crash_loop_threshold=10)
    history = CrashHistory(policy, clock)
    delays = [history.record_crash().delay_s for _ in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize(
    "overrides",
    [
        {"initial_backoff_s": -1},
        {"initial_backoff_s": 5, "max_backoff_s": 1},
        {"crash_loop_threshold": 0},
        {"crash_loop_window_s": 0},
        {"crash_loop_backoff_s": -1},
    ],
)
def test_nonsensical_policies_are_refused(overrides: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**overrides)  # type: ignore[arg-type]
