"""Waiting on state that another process or thread owns and that offers nothing to await (a
child's exit, a flag its thread sets, what an RPC reports): poll it, every 20 ms unless each try
costs more, up to a deadline, then fail saying what never happened. One helper (and its blocking
twin, for code with no event loop) instead of a copy per test file."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.waiting import POLL_S, NotInTime, poll, poll_sync


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
    try:
        await poll(condition, timeout_s, what, interval_s=interval_s, last=last)
    except NotInTime as late:
        pytest.fail(str(late))


def wait_until_sync(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_S,
    last: Callable[[], object] | None = None,
) -> None:
    """`wait_until` for a test (or a test's child process) with no event loop: blocks."""
    try:
        poll_sync(condition, timeout_s, what, interval_s=interval_s, last=last)
    except NotInTime as late:
        pytest.fail(str(late))


def wait_for_file(
    path: Path, process: subprocess.Popen[bytes], timeout_s: float, what: str
) -> None:
    """Return once `process` (a child that says it is ready by writing `path`) has written it;
    fail the test, saying `what` never happened, if the child exits first or `timeout_s` passes.
    A file is all such a child offers to wait on."""

    def written() -> bool:
        if not path.exists() and process.poll() is not None:
            pytest.fail(f"{what}: the process exited ({process.returncode}) before writing {path}")
        return path.exists()

    try:
        poll_sync(written, timeout_s, f"{what} ({path})")
    except NotInTime as late:
        pytest.fail(str(late))
