"""The load generator behind `gantry bench`: `concurrency` workers issue calls back to back, for a
count of calls or until a deadline, and every call lands in exactly one outcome.

It knows nothing of what a call does (it is handed a factory of awaitables), so `make bench` and the
CLI share it. What it owns: the pacing (exactly `requests` calls, or every call started before the
deadline, each then finished), the accounting (`OK`, or `CODE/REASON` from the gRPC status and its
ErrorInfo), and the one percentile rule Gantry's figures use.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from gantry.cli.errors import error_reason

OK = "OK"
MAX_CONCURRENCY = 1024
PROGRESS_EVERY_S = 0.2

# A call factory gets the call's sequence number (warm-up calls first), so each call can carry
# different inputs and no cache along the path can answer from memory.
CallFactory = Callable[[int], Awaitable[object]]
Clock = Callable[[], float]


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest sample with at least a share q of the samples at or below it
    (rank ceil(q * n), counted from 1). The p99 of 200 calls is their third-slowest, not the
    second: the rank int(q * n) + 1 that this took before overshot by one when q * n is whole."""
    if not samples:
        raise ValueError("a percentile of no samples")
    return _nearest_rank(sorted(samples), q)


def _nearest_rank(ordered: Sequence[float], q: float) -> float:
    # The epsilon keeps a product that floating point puts a hair above a whole number (0.07 *
    # 100 is 7.000000000000001) on that number's rank.
    rank = math.ceil(q * len(ordered) - 1e-9)
    return ordered[min(len(ordered), max(1, rank)) - 1]


def outcome_of(error: grpc.RpcError) -> str:
    """`CODE/REASON` for a failed call, or `CODE` alone when the server attached no ErrorInfo
    (e.g. nothing listening: UNAVAILABLE)."""
    code = error.code() if isinstance(error, grpc.Call | grpc.aio.AioRpcError) else None
    name = code.name if code is not None else "UNKNOWN"
    reason = error_reason(error)
    return f"{name}/{reason}" if reason else name


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPlan:
    """How much load: `concurrency` workers, and either `requests` calls or `duration_s` seconds."""

    concurrency: int
    requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0  # calls made (concurrently) and discarded before the measured run
    inputs_per_call: int = 1  # for inputs/s only

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be 1..{MAX_CONCURRENCY}, not {self.concurrency}")
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give either a request count or a duration")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be at least 1, not {self.requests}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"duration must be more than 0 s, not {self.duration_s}")
        if self.warmup < 0:
            raise ValueError(f"warm-up must be 0 or more calls, not {self.warmup}")
        if self.inputs_per_call < 1:
            raise ValueError(f"inputs per call must be at least 1, not {self.inputs_per_call}")


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """Where a run stands: calls done of `total` (count mode) or seconds of `duration_s`."""

    done: int
    elapsed_s: float
    total: int | None = None
    duration_s: float | None = None

    @property
    def fraction(self) -> float:
        if self.total is not None:
            return min(self.done / self.total, 1.0)
        if self.duration_s:
            return min(self.elapsed_s / self.duration_s, 1.0)
        return 0.0


ProgressCallback = Callable[[LoadProgress], None]


@dataclass(slots=True)
class LoadResult:
    """What a run measured. Latencies are of OK calls only: a refusal returned in microseconds
    would otherwise flatter every percentile."""

    latencies_s: list[float]
    outcomes: Counter[str]
    elapsed_s: float
    inputs_per_call: int = 1

    @property
    def calls(self) -> int:
        return sum(self.outcomes.values())

    @property
    def ok(self) -> int:
        return self.outcomes[OK]

    @property
    def errors(self) -> dict[str, int]:
        """Failed calls by `CODE/REASON`, most frequent first."""
        failed = [(outcome, count) for outcome, count in self.outcomes.items() if outcome != OK]
        return dict(sorted(failed, key=lambda item: (-item[1], item[0])))

    def latency_ms(self, q: float) -> float | None:
        return percentile(self.latencies_s, q) * 1000 if self.latencies_s else None

    @property
    def requests_per_s(self) -> float:
        return self.calls / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def inputs_per_s(self) -> float:
        """Inputs actually served (OK calls only) per second."""
        return self.ok * self.inputs_per_call / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures as plain values (what `gantry bench --json` prints)."""
        ordered = sorted(self.latencies_s)  # once: a long run holds millions of samples

        def at(q: float) -> float | None:
            return round(_nearest_rank(ordered, q) * 1000, 3) if ordered else None

        return {
            "requests": self.calls,
            "ok": self.ok,
            "errors": self.errors,
            "elapsed_s": round(self.elapsed_s, 6),
            "requests_per_s": round(self.requests_per_s, 3),
            "inputs_per_s": round(self.inputs_per_s, 3),
            "latency_ms": {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)},
        }


@dataclass(slots=True)
class _Phase:
    """One pass of workers over a shared claim counter (single event loop: no locks needed)."""

    call: CallFactory
    clock: Clock
    first_index: int
    requests: int | None
    deadline: float | None
    started: float
    on_progress: ProgressCallback | None = None
    duration_s: float | None = None
    claimed: int = 0
    latencies_s: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    last_report: float = float("-inf")

    def claim(self) -> int | None:
        if self.requests is not None and self.claimed >= self.requests:
            return None
        if self.deadline is not None and self.clock() >= self.deadline:
            return None
        self.claimed += 1
        return self.first_index + self.claimed - 1

    async def worker(self) -> None:
        while (index := self.claim()) is not None:
            begun = self.clock()
            try:
                await self.call(index)
            except grpc.RpcError as error:
                # A failed call is a measurement, not a failure of the run; anything else is a
                # bug in the caller's factory and ends the run (the task group cancels the rest).
                self.outcomes[outcome_of(error)] += 1
            else:
                self.latencies_s.append(self.clock() - begun)
                self.outcomes[OK] += 1
            self.report(final=False)

    def report(self, *, final: bool) -> None:
        if self.on_progress is None:
            return
        now = self.clock()
        if not final and now - self.last_report < PROGRESS_EVERY_S:
            return
        self.last_report = now
        self.on_progress(
            LoadProgress(
                done=sum(self.outcomes.values()),
                elapsed_s=now - self.started,
                total=self.requests,
                duration_s=self.duration_s,
            )
        )

    async def run(self, concurrency: int) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(concurrency):
                    group.create_task(self.worker())
        except ExceptionGroup as failed:
            # The first worker's error cancelled the others: it is the one worth reporting.
            raise failed.exceptions[0] from None


async def run_load(
    call: CallFactory,
    plan: LoadPlan,
    *,
    on_progress: ProgressCallback | None = None,
    clock: Clock = time.perf_counter,
) -> LoadResult:
    """Warm up, then run the plan; `on_progress` hears at most every 0.2 s, and at the end."""
    if plan.warmup:
        warmup = _Phase(
            call=call,
            clock=clock,
            first_index=0,
            requests=plan.warmup,
            deadline=None,
            started=clock(),
        )
        await warmup.run(min(plan.concurrency, plan.warmup))
    started = clock()
    measured = _Phase(
        call=call,
        clock=clock,
        first_index=plan.warmup,
        requests=plan.requests,
        deadline=None if plan.duration_s is None else started + plan.duration_s,
        started=started,
        on_progress=on_progress,
        duration_s=plan.duration_s,
    )
    # No idle workers: a count below the concurrency runs that many calls at once.
    await measured.run(min(plan.concurrency, plan.requests or plan.concurrency))
    elapsed = clock() - started
    measured.report(final=True)
    return LoadResult(
        latencies_s=measured.latencies_s,
        outcomes=measured.outcomes,
        elapsed_s=elapsed,
        inputs_per_call=plan.inputs_per_call,
    )
