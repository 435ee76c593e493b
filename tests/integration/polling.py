"""Waiting on state that another process or thread owns and that offers nothing to await (a
child's exit, a flag its thread sets): poll it every 20 ms, up to a deadline, then fail saying
what never happened. One helper instead of a copy per test file."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

POLL_S = 0.02


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Return once `condition()` holds; fail the test after `timeout_s` seconds without it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_S)


def wait_for_file(
    path: Path, process: subprocess.Popen[bytes], timeout_s: float, what: str
) -> None:
    """Return once `process` (a child that says it is ready by writing `path`) has written it;
    fail the test, saying `what` never happened, if the child exits first or `timeout_s` passes.
    A file is all such a child offers to wait on."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if process.poll() is not None:
            pytest.fail(f"{what}: the process exited ({process.returncode}) before writing {path}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what} ({path})")
        time.sleep(POLL_S)
