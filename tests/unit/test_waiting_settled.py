"""tests/waiting.py's `settled`: a value another process moves (its memory after work) is read
once two readings in a row agree, not after a fixed sleep; a value that never holds still is a
NotInTime that says what was waited for and what was seen last."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import NotInTime, settled, settled_sync


def test_the_first_reading_that_agrees_with_the_one_before_is_the_answer() -> None:
    readings = iter([100.0, 140.0, 150.0, 150.5, 900.0])
    assert settled_sync(lambda: next(readings), 5.0, "rss", within=1.0, apart_s=0.0) == 150.5
    assert next(readings) == 900.0  # no reading past the steady one


def test_a_steady_zero_is_an_answer() -> None:
    assert settled_sync(lambda: 0.0, 5.0, "nothing", within=0.0, apart_s=0.0) == 0.0


async def test_a_value_that_never_holds_still_says_what_and_the_last_reading() -> None:
    climbing = itertools.count(0, 10)
    with pytest.raises(NotInTime, match=r"the worker's RSS to hold still; last seen: \d+"):
        await settled(
            lambda: next(climbing), 0.05, "the worker's RSS to hold still", within=1, apart_s=0.001
        )
