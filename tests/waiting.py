"""Waiting on state another process or thread owns and that offers nothing to await (a child's
exit, a deployment's state, spans a service writes): ask again every `interval_s` until the answer
is truthy, up to a deadline, then raise `NotInTime` saying what never happened and, if asked, what
was seen last. The one loop behind the tests' waits (tests/integration/polling.py, which fails the
test instead) and the benchmarks' (which run without pytest)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

POLL_S = 0.02

_T = TypeVar("_T")


class NotInTime(TimeoutError):
    """What was waited for did not happen within the deadline; the message says what."""


def not_in_time(timeout_s: float, what: str, last: Callable[[], object] | None) -> NotInTime:
    seen = f"; last seen: {last()}" if last is not None else ""
    return NotInTime(f"timed out after {timeout_s:g}s waiting for {what}{seen}")


@overload
async def poll(
    probe: Callable[[], Awaitable[_T | None]],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = ...,
    last: Callable[[], object] | None = ...,
) -> _T: ...


@overload
async def poll(
    probe: Callable[[], _T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = ...,
    last: Callable[[], object] | None = ...,
) -> _T: ...


async def poll(
    probe: Callable[[], Any],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_S,
    last: Callable[[], object] | None = None,
) -> Any:
    """The first truthy answer of `probe()` (a function, or a coroutine function: an RPC that
    asks); `NotInTime` after `timeout_s` without one. `interval_s`: longer where each try costs
    something (a process spawned, a call served)."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = probe()
        if inspect.isawaitable(answer):
            answer = await answer
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise not_in_time(timeout_s, what, last)
        await asyncio.sleep(interval_s)


def poll_sync(
    probe: Callable[[], _T | None],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = POLL_S,
    last: Callable[[], object] | None = None,
) -> _T:
    """`poll` for code with no event loop: blocks."""
    deadline = time.monotonic() + timeout_s
    while not (answer := probe()):
        if time.monotonic() > deadline:
            raise not_in_time(timeout_s, what, last)
        time.sleep(interval_s)
    return answer
