"""A unit of work that lost a compare-and-set race runs again; anything else is raised."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.platform.transitions import lost_a_race, retry_on_conflict


def _conflict() -> GantryError:
    return GantryError("INVALID_STATE_TRANSITION", "lost", conflict="true")


async def test_a_lost_race_is_retried_until_it_wins():
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _conflict()
        return "won"

    assert await retry_on_conflict(attempt) == "won"
    assert len(calls) == 3


async def test_retries_are_bounded():
    calls: list[int] = []

    async def attempt() -> None:
        calls.append(1)
        raise _conflict()

    with pytest.raises(GantryError):
        await retry_on_conflict(attempt, attempts=2)
    assert len(calls) == 2


async def test_an_illegal_transition_is_not_retried():
    calls: list[int] = []

    async def attempt() -> None:
        calls.append(1)
        raise GantryError("INVALID_STATE_TRANSITION", "deployment cannot go from A to B")

    with pytest.raises(GantryError) as caught:
        await retry_on_conflict(attempt)
    assert len(calls) == 1 and not lost_a_race(caught.value)
