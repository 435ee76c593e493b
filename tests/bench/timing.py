"""How `make bench` times calls against each other on one shared machine: in turns, so a noisy
stretch weighs on all alike. No side effects at import (tests/bench/run.py sets the bench's
OpenMP variables when imported; this does not)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

# A timed call: what it returns is its own measure in ms when a float (the untuned child times
# its encode itself), else the call is timed here.
Call = Callable[[], Awaitable[object]]


async def timed_turns(calls: list[Call], n: int) -> list[list[float]]:
    """The calls timed in turns, so a noisy stretch of this shared machine weighs on all alike
    rather than on whichever happened to run then."""
    for _ in range(max(5, n // 10)):  # warm-up
        for call in calls:
            await call()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(n):
        for call, measured in zip(calls, samples, strict=True):
            start = time.perf_counter()
            own = await call()
            wall = (time.perf_counter() - start) * 1000
            measured.append(own if isinstance(own, float) else wall)
    return samples


async def timed_blocks(calls: list[Call], n: int, block: int = 10) -> list[list[float]]:
    """The calls timed in blocks of `block` back-to-back calls each, the blocks in turns, each
    block's first call untimed: every timed call follows one of its own kind, as a steady caller's
    does, never the other's. Interleaving call by call (`timed_turns`) starts each call while the
    one before it, of the other kind, may still hold a core: the untuned encode's libgomp threads
    spin after it returns (its default spin; `spin_tail_ms` measures it), which a call of Gantry's
    timed next pays for, and the host's shorter spin the untuned encode. Blocks in turns still
    spread a noisy stretch of this shared machine over all alike."""
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(max(5, n // 10)):  # warm-up
        for call in calls:
            await call()
    while len(samples[0]) < n:
        for call, measured in zip(calls, samples, strict=True):
            await call()  # after the other kind's block: not timed
            for _ in range(min(block, n - len(measured))):
                start = time.perf_counter()
                own = await call()
                wall = (time.perf_counter() - start) * 1000
                measured.append(own if isinstance(own, float) else wall)
    return samples


async def timed(call: Call, n: int) -> list[float]:
    return (await timed_turns([call], n))[0]


async def timed_pair(a: Call, b: Call, n: int) -> tuple[list[float], list[float]]:
    samples_a, samples_b = await timed_turns([a, b], n)
    return samples_a, samples_b
