"""The load generator's own rules: percentiles, outcomes by reason, count and duration modes,
concurrency, progress pacing, and the bench command's argument bounds.

The calls here are fakes on purpose: what is under test is the generator's pacing and accounting
(tests/integration/test_cli_bench.py runs it against a real Gantry)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Awaitable, Callable

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from gantry.cli import bench_command
from gantry.cli.loadgen import (
    OK,
    LoadPlan,
    LoadProgress,
    LoadResult,
    outcome_of,
    percentile,
    run_load,
)
from gantry.cli.main import main


class SteppedClock:
    """Time that moves only when a fake call says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rpc_error(code: grpc.StatusCode, reason: str | None) -> grpc.aio.AioRpcError:
    """The error grpc.aio raises, with the trailer a Gantry server attaches."""
    details = []
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="gantry.dev"))
        details.append(detail)
    status = rpc_status.to_status(
        status_pb2.Status(code=getattr(code_pb2, code.name), message="no", details=details)
    )
    return grpc.aio.AioRpcError(
        code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        details="no",
    )


# --- percentiles ---------------------------------------------------------------------------------


def test_percentile_is_the_nearest_rank_of_the_sorted_samples() -> None:
    samples = [float(value) for value in range(100, 0, -1)]  # 100 .. 1, unsorted on purpose
    # The smallest sample with at least a share q at or below it: rank ceil(q * n).
    assert percentile(samples, 0.5) == 50.0
    assert percentile(samples, 0.9) == 90.0
    assert percentile(samples, 0.99) == 99.0
    assert percentile(samples, 0.07) == 7.0  # 0.07 * 100 is 7.000000000000001 in floating point
    assert percentile(samples, 0.995) == 100.0
    assert percentile(samples, 1.0) == 100.0
    assert percentile(samples, 0.0) == 1.0  # clamped to the first sample
    assert percentile([float(v) for v in range(1, 201)], 0.99) == 198.0  # 200 calls: third-slowest
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0


def test_percentile_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 0.5)


def test_summary_reports_ok_latencies_throughput_and_errors_by_reason() -> None:
    result = LoadResult(
        latencies_s=[0.001 * value for value in range(1, 11)],  # 1 .. 10 ms
        outcomes=Counter({OK: 10, "NOT_FOUND/NOT_FOUND": 2, "RESOURCE_EXHAUSTED/QUEUE_FULL": 3}),
        elapsed_s=2.0,
        inputs_per_call=4,
    )
    summary = result.summary()
    assert summary["requests"] == 15
    assert summary["ok"] == 10
    assert summary["errors"] == {"RESOURCE_EXHAUSTED/QUEUE_FULL": 3, "NOT_FOUND/NOT_FOUND": 2}
    assert list(summary["errors"]) == ["RESOURCE_EXHAUSTED/QUEUE_FULL", "NOT_FOUND/NOT_FOUND"]
    assert summary["requests_per_s"] == 7.5
    assert summary["inputs_per_s"] == 20.0  # OK calls only: 10 calls x 4 inputs / 2 s
    assert summary["latency_ms"] == {"p50": 5.0, "p90": 9.0, "p99": 10.0, "max": 10.0}
    json.dumps(summary)  # plain values only


def test_summary_of_a_run_without_one_ok_call_has_no_latencies() -> None:
    result = LoadResult(latencies_s=[], outcomes=Counter({"UNAVAILABLE": 3}), elapsed_s=0.5)
    assert result.summary()["latency_ms"] == {"p50": None, "p90": None, "p99": None, "max": None}
    assert result.inputs_per_s == 0.0


# --- outcomes ------------------------------------------------------------------------------------


def test_outcome_is_code_and_gantry_reason_or_code_alone() -> None:
    assert outcome_of(rpc_error(grpc.StatusCode.NOT_FOUND, "NOT_FOUND")) == "NOT_FOUND/NOT_FOUND"
    assert (
        outcome_of(rpc_error(grpc.StatusCode.UNAVAILABLE, "DEPLOYMENT_NOT_READY"))
        == "UNAVAILABLE/DEPLOYMENT_NOT_READY"
    )
    assert outcome_of(rpc_error(grpc.StatusCode.UNAVAILABLE, None)) == "UNAVAILABLE"


async def test_every_call_counts_once_by_its_outcome() -> None:
    script = {
        1: rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"),
        4: rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"),
        5: rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, None),
    }

    async def call(index: int) -> None:
        if index in script:
            raise script[index]

    result = await run_load(call, LoadPlan(concurrency=2, requests=8))
    assert result.outcomes == Counter(
        {OK: 5, "RESOURCE_EXHAUSTED/QUEUE_FULL": 2, "DEADLINE_EXCEEDED": 1}
    )
    assert len(result.latencies_s) == 5  # failed calls carry no latency sample


async def test_an_error_that_is_no_rpc_failure_ends_the_run() -> None:
    async def call(index: int) -> None:
        if index == 3:
            raise KeyError("a bug in the call factory")

    with pytest.raises(KeyError, match="a bug"):
        await run_load(call, LoadPlan(concurrency=4, requests=50))


# --- count and duration --------------------------------------------------------------------------


async def test_count_mode_makes_exactly_the_requests_after_the_warmup() -> None:
    seen: list[int] = []

    async def call(index: int) -> None:
        seen.append(index)
        await asyncio.sleep(0)

    result = await run_load(call, LoadPlan(concurrency=3, requests=10, warmup=4))
    assert sorted(seen) == list(range(14))  # warm-up calls 0..3 first, then 4..13, each once
    assert sorted(seen[:4]) == [0, 1, 2, 3]
    assert result.calls == result.ok == 10  # the warm-up is not counted


async def test_duration_mode_starts_calls_until_the_deadline_and_lets_them_finish() -> None:
    clock = SteppedClock()
    started_at: list[float] = []

    async def call(index: int) -> None:
        started_at.append(clock.now)
        await asyncio.sleep(0)
        clock.now += 1.0

    result = await run_load(call, LoadPlan(concurrency=1, duration_s=10.0), clock=clock)
    assert result.calls == 10  # started at 0, 1, ..., 9 s; none at 10 s
    assert result.elapsed_s == 10.0
    assert result.requests_per_s == 1.0
    assert result.latencies_s == [1.0] * 10


async def test_duration_mode_finishes_every_call_in_flight_at_the_deadline() -> None:
    clock = SteppedClock()
    deadline = clock.now + 5.0
    started_at: list[float] = []

    async def call(index: int) -> None:
        started_at.append(clock.now)
        await asyncio.sleep(0)
        clock.now += 0.5

    result = await run_load(call, LoadPlan(concurrency=4, duration_s=5.0), clock=clock)
    assert all(moment < deadline for moment in started_at)
    assert result.calls == len(started_at)
    assert result.elapsed_s >= 5.0


# --- concurrency ---------------------------------------------------------------------------------


def in_flight_recorder(expected: int) -> tuple[Callable[[int], Awaitable[None]], list[int]]:
    """A call that records how many are in flight as it starts, and, until `expected` have been
    in flight at once, waits for them (at most 5 s: fewer never reach it, and the test fails)."""
    in_flight = [0]
    peaks: list[int] = []
    reached = asyncio.Event()

    async def call(index: int) -> None:
        in_flight[0] += 1
        peaks.append(in_flight[0])
        if in_flight[0] >= expected:
            reached.set()
        try:
            async with asyncio.timeout(5):
                await reached.wait()
        finally:
            in_flight[0] -= 1

    return call, peaks


@pytest.mark.parametrize("concurrency", [1, 8, 64])
async def test_concurrency_is_reached_and_never_exceeded(concurrency: int) -> None:
    call, peaks = in_flight_recorder(concurrency)
    result = await run_load(call, LoadPlan(concurrency=concurrency, requests=5 * concurrency))
    assert max(peaks) == concurrency
    assert result.ok == 5 * concurrency


async def test_fewer_requests_than_workers_run_all_at_once() -> None:
    call, peaks = in_flight_recorder(3)
    result = await run_load(call, LoadPlan(concurrency=16, requests=3))
    assert max(peaks) == 3
    assert result.ok == 3


# --- progress ------------------------------------------------------------------------------------


async def test_progress_is_reported_at_most_every_fifth_of_a_second_and_at_the_end() -> None:
    clock = SteppedClock()
    reports: list[LoadProgress] = []

    async def call(index: int) -> None:
        clock.now += 0.05

    await run_load(
        call, LoadPlan(concurrency=1, requests=100), on_progress=reports.append, clock=clock
    )
    gaps = [later.elapsed_s - earlier.elapsed_s for earlier, later in itertools.pairwise(reports)]
    assert all(gap >= 0.2 - 1e-9 for gap in gaps[:-1])  # the final report comes whenever it ends
    assert 20 <= len(reports) <= 27  # 5 s of calls: about every 0.2 s, plus the last
    final = reports[-1]
    assert (final.done, final.total, final.duration_s) == (100, 100, None)
    assert final.elapsed_s == pytest.approx(5.0)
    assert reports[-1].fraction == 1.0


def test_progress_line_shows_calls_done_or_seconds_passed() -> None:
    counted = bench_command.render_bench_progress(
        LoadProgress(done=25, elapsed_s=0.5, total=100), width=4
    )
    assert counted == "bench [#...] 25/100 calls  25% 50.0 calls/s"
    timed = bench_command.render_bench_progress(
        LoadProgress(done=40, elapsed_s=2.0, duration_s=4.0), width=4
    )
    assert timed == "bench [##..] 2.0/4.0 s 40 calls  50% 20.0 calls/s"


# --- plan bounds and the command's arguments ------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"concurrency": 0, "requests": 1}, "concurrency must be 1..1024"),
        ({"concurrency": 1025, "requests": 1}, "concurrency must be 1..1024"),
        ({"concurrency": 1}, "either a request count or a duration"),
        ({"concurrency": 1, "requests": 1, "duration_s": 1.0}, "either"),
        ({"concurrency": 1, "requests": 0}, "at least 1"),
        ({"concurrency": 1, "duration_s": 0.0}, "more than 0"),
        ({"concurrency": 1, "duration_s": float("nan")}, "more than 0"),
        ({"concurrency": 1, "requests": 1, "warmup": -1}, "warm-up"),
    ],
)
def test_a_plan_out_of_bounds_is_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadPlan(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--concurrency", "0"], "Invalid value for '--concurrency': must be 1..1024, not 0"),
        (["--concurrency", "1025"], "Invalid value for '--concurrency': must be 1..1024, not 1025"),
        (["--concurrency", "many"], "'many' is not a whole number"),
        (["--requests", "0"], "Invalid value for '--requests': must be 1..10000000"),
        (["--duration", "0"], "Invalid value for '--duration': must be more than 0"),
        (["--duration", "-3"], "Invalid value for '--duration': must be more than 0"),
        (["--duration", "nan"], "Invalid value for '--duration': must be more than 0"),
        (["--requests", "5", "--duration", "1"], "cannot be used with"),
        (
            ["--inputs-per-request", "1025"],
            "Invalid value for '--inputs-per-request': must be 1..1024",
        ),
        (["--input-chars", "100001"], "Invalid value for '--input-chars': must be 1..100000"),
        (["--input-chars", "0"], "Invalid value for '--input-chars': must be 1..100000"),
        (
            ["--inputs-per-request", "1024", "--input-chars", "100000"],
            "the control plane takes at most 8388608",
        ),
        (["--rerank", "--encoding", "bytes"], "--encoding applies to Embed"),
        (["--priority", "urgent"], "invalid choice: 'urgent'"),
        (["--warmup", "-1"], "Invalid value for '--warmup': must be 0..100000"),
    ],
)
def test_bad_arguments_exit_2_with_one_clear_line(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--capability", "tiny", *arguments])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    assert "Traceback" not in error


def test_a_target_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--requests", "3"])
    assert exited.value.code == 2
    assert "one of the options --capability --deployment" in capsys.readouterr().err


# --- generated inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("chars", [1, 5, 64, 1000, 100_000])
def test_generated_texts_have_exactly_the_asked_length(chars: int) -> None:
    for text in bench_command.bench_texts(7, 3, chars):
        assert len(text) == len(text.encode()) == chars  # ASCII: characters are bytes


def test_generated_texts_differ_per_call_and_position_and_repeat_per_run() -> None:
    texts = [text for call in range(50) for text in bench_command.bench_texts(call, 4, 64)]
    assert len(set(texts)) == len(texts)
    assert bench_command.bench_texts(3, 2, 64) == bench_command.bench_texts(3, 2, 64)
