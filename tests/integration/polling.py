"""Waiting on state that another process or thread owns and that offers nothing to await (a
child's exit, a flag its thread sets, what an RPC reports): poll it, every 20 ms unless each try
costs more, up to a deadline, then fail saying what never happened. One helper (and its blocking
twin, for code with no event loop) instead of a copy per test file."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

POLL_S = 0.02


def _timed_out(timeout_s: float, what: str, last: Callable[[], object] | None) -> str:
    seen = f"; last seen: {last()}" if last is not None else ""
    return f"timed out after {timeout_s}s waiting for {what}{seen}"


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_S,
    last: Callable[[], object] | None = None,
) -> None:
    """Return once `condition()` holds (it may be a coroutine function: an RPC that asks); fail
    the test after `timeout_s` seconds without it, naming `what` and, if given, `last()`.
    `interval_s`: longer where each try costs something (a process spawned, a call served)."""
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            pytest.fail(_timed_out(timeout_s, what, last))
        await asyncio.sleep(interval_s)


def wait_until_sync(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_S,
    last: Callable[[], object] | None = None,
) -> None:
    """`wait_until` for a test (or a test's child process) with no event loop: blocks."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(_timed_out(timeout_s, what, last))
        time.sleep(interval_s)


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
