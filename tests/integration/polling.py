"""Waiting on state that another process or thread owns and that offers nothing to await (a
child's exit, a flag its thread sets): poll it every 20 ms, up to a deadline, then fail saying
what never happened. One helper instead of a copy per test file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

POLL_S = 0.02


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Return once `condition()` holds; fail the test after `timeout_s` seconds without it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_S)
