"""Pure pieces the reconciler composes: per-key backoff and transition paths."""

from __future__ import annotations

import pytest

from gantry.common.clock import ManualClock
from gantry.common.errors import GantryError
from gantry.controlplane.platform.backoff import Backoff
from gantry.controlplane.platform.state_machines import shortest_path
from tests.waiting import poll


def test_backoff_doubles_to_its_cap_and_resets_on_success():
    clock = ManualClock()
    backoff = Backoff(clock, initial_s=1.0, max_s=4.0)
    assert backoff.due("d")
    assert [backoff.failed("d") for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert not backoff.due("d")
    clock.advance(3.9)
    assert not backoff.due("d")
    clock.advance(0.1)
    assert backoff.due("d")
    backoff.succeeded("d")
    assert backoff.failed("d") == 1.0


def test_backoff_forgets_keys_no_longer_of_interest():
    backoff = Backoff(ManualClock(), initial_s=1.0, max_s=4.0)
    backoff.failed("a")
    backoff.failed("b")
    backoff.forget_except({"b"})
    assert backoff.due("a") and not backoff.due("b")


def test_shortest_path_walks_the_table():
    assert shortest_path("deployment", "READY", "LOADING") == ["PENDING", "LOADING"]
    assert shortest_path("deployment", "PENDING", "READY") == ["LOADING", "READY"]
    assert shortest_path("residency", "COLD", "RESIDENT") == ["LOADING", "RESIDENT"]


def test_shortest_path_refuses_an_unreachable_state():
    with pytest.raises(GantryError) as caught:
        shortest_path("deployment", "UNLOADED", "READY")
    assert caught.value.reason == "INVALID_STATE_TRANSITION"


async def test_manual_clock_sleep_returns_only_when_time_is_advanced():
    import asyncio

    clock = ManualClock()
    sleeper = asyncio.ensure_future(clock.sleep(5))
    await poll(lambda: clock.sleepers == 1, 5, "the sleep registered with the clock")
    clock.advance(4)
    assert clock.sleepers == 1  # not due: advance resolved nothing
    assert not sleeper.done()
    clock.advance(1)
    await asyncio.wait_for(sleeper, 1)
