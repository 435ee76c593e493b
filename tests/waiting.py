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


class _Steadiness:
    """Successive readings of a value another process moves: steady once two in a row differ by
    at most `within`."""

    def __init__(self, read: Callable[[], float], within: float) -> None:
        self._read = read
        self._within = within
        self.last: float | None = None

    def steady(self) -> tuple[float] | None:
        """(the reading,) once steady (a tuple: a steady 0 is an answer too), else None."""
        reading, before = self._read(), self.last
        self.last = reading
        if before is not None and abs(reading - before) <= self._within:
            return (reading,)
        return None


def settled_sync(
    read: Callable[[], float], timeout_s: float, what: str, *, within: float, apart_s: float
) -> float:
    """`read()` once two readings `apart_s` apart differ by at most `within` (a process's memory
    after work, which it gives back when it gets to it): waited for, not a fixed sleep;
    `NotInTime` saying what, and the last reading, after `timeout_s`."""
    steadiness = _Steadiness(read, within)
    (reading,) = poll_sync(
        steadiness.steady, timeout_s, what, interval_s=apart_s, last=lambda: steadiness.last
    )
    return reading


async def settled(
    read: Callable[[], float], timeout_s: float, what: str, *, within: float, apart_s: float
) -> float:
    """`settled_sync` for code on an event loop."""
    steadiness = _Steadiness(read, within)
    (reading,) = await poll(
        steadiness.steady, timeout_s, what, interval_s=apart_s, last=lambda: steadiness.last
    )
    return reading
