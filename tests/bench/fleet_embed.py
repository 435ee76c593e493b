"""The fleet bench's Embed under load: one deployment serving beside the simulated fleet.

A deployment READY on one `ScriptedWorker` (the named fake of the worker protocol: it answers
each Embed at once with an all-MiniLM-sized vector) in the same control plane the simulated
workers connect to; Embed at concurrency 1 from a client in this process, measured with no
worker connected and with the fleet heartbeating, with each call's stages and the event loop's
lag over the same span. Used by tests/bench/fleet.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from gantry.cli.loadgen import percentile
from gantry.controlplane.platform import metrics as controlplane_metrics
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import inference_pb2_grpc
from tests.bench.summary import Summary
from tests.integration.harness import Harness
from tests.integration.pipeline_support import Pipeline, make_model_dir
from tests.integration.scripted_worker import ScriptedWorker

EMBED_CALLS = int(os.environ.get("GANTRY_BENCH_FLEET_EMBED_CALLS", "1000"))
EMBED_SPREAD_S = float(os.environ.get("GANTRY_BENCH_FLEET_EMBED_S", "20"))
P99_TARGET_RATIO = 1.5  # Embed p99 with the fleet heartbeating, over idle (issue 9)
EMBED_WARMUP_CALLS = 30
EMBED_DIM = 384  # all-MiniLM's: the vector the serving worker answers with
CAPABILITY = "fleet-embed"
LOOP_LAG_PERIOD_S = 0.01
# An Embed call's stages as the control plane times them, then what the client sees around them.
STAGES = (
    controlplane_metrics.STAGE_RESOLVE,
    controlplane_metrics.STAGE_SCHEDULE,
    controlplane_metrics.STAGE_WORKER,
)
REST = "client round trip"


@dataclass(frozen=True)
class Latency:
    """Embed at concurrency 1 over one span, and the event loop's lag over the same span."""

    workers: int
    seconds: list[float]
    loop_lag_s: list[float]
    stage_s: dict[str, list[float]]  # STAGES and REST, one value per call

    @property
    def p50(self) -> float:
        return percentile(self.seconds, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.seconds, 0.99)

    @property
    def lag_p99(self) -> float:
        return percentile(self.loop_lag_s, 0.99)


@contextlib.asynccontextmanager
async def serving_deployment(harness: Harness, base: Path) -> AsyncIterator[ScriptedWorker]:
    """A deployment READY on one scripted worker that heartbeats at the interval its Welcome
    names and answers each Embed invocation at once with an EMBED_DIM-float vector."""
    pipeline = Pipeline(harness=harness, model_dir=make_model_dir(base))
    worker = await pipeline.worker("fleet-serving")
    worker.answer_invokes = True
    worker.embed_dim = EMBED_DIM
    assert worker.welcome is not None
    interval = worker.welcome.heartbeat_interval.ToNanoseconds() / 1e9

    async def beat() -> None:
        while not worker.ended.is_set():
            worker.heartbeat()
            await asyncio.sleep(interval)

    beating = asyncio.create_task(beat())
    try:
        approval = await pipeline.approved()
        deployment = await pipeline.deploy(approval.approval_id, CAPABILITY)
        await harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
        yield worker
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        await worker.stop()


@contextlib.contextmanager
def stage_timings() -> Iterator[dict[str, float]]:
    """The control plane's stage timings of the call in flight, as it records them for its
    `gantry_invocation_stage_duration_seconds` (the metric itself still gets every one)."""
    current: dict[str, float] = {}
    original = controlplane_metrics.stage_finished

    def record(operation: str, stage: str, seconds: float) -> None:
        current[stage] = current.get(stage, 0.0) + seconds
        original(operation, stage, seconds)

    controlplane_metrics.stage_finished = record
    try:
        yield current
    finally:
        controlplane_metrics.stage_finished = original


async def measure_embed(
    client: inference_pb2_grpc.InferenceStub, metadata: tuple[tuple[str, str], ...], workers: int
) -> Latency:
    """EMBED_CALLS Embed calls, one at a time, started evenly over EMBED_SPREAD_S (a call that
    ends late starts the next at once), after EMBED_WARMUP_CALLS back to back."""
    request = inf.EmbedRequest(capability=CAPABILITY, inputs=["fleet bench"])
    for _ in range(EMBED_WARMUP_CALLS):
        answer = await client.Embed(request, metadata=metadata, timeout=30)
    if (len(answer.vectors), answer.dim) != (1, EMBED_DIM):
        raise RuntimeError(
            f"Embed answered {len(answer.vectors)} x {answer.dim}, not 1 x {EMBED_DIM}"
        )
    lags: list[float] = []

    async def sample_lag() -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(LOOP_LAG_PERIOD_S)
            lags.append(time.perf_counter() - before - LOOP_LAG_PERIOD_S)

    sampler = asyncio.create_task(sample_lag())
    seconds: list[float] = []
    stage_s: dict[str, list[float]] = {stage: [] for stage in (*STAGES, REST)}
    step = EMBED_SPREAD_S / EMBED_CALLS
    started = time.perf_counter()
    try:
        with stage_timings() as timings:
            for index in range(EMBED_CALLS):
                wait = started + index * step - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                timings.clear()
                before = time.perf_counter()
                await client.Embed(request, metadata=metadata, timeout=30)
                seconds.append(time.perf_counter() - before)
                for stage in STAGES:
                    stage_s[stage].append(timings.get(stage, 0.0))
                stage_s[REST].append(seconds[-1] - sum(timings.get(s, 0.0) for s in STAGES))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    return Latency(workers=workers, seconds=seconds, loop_lag_s=lags, stage_s=stage_s)


def summarise_embed(summary: Summary, latencies: list[Latency], *, heartbeat_share: float) -> None:
    idle, loaded = latencies[0], latencies[-1]
    if not loaded.workers:
        return
    ratio = loaded.p99 / idle.p99
    grown = sorted(
        loaded.stage_s,
        key=lambda stage: (
            percentile(loaded.stage_s[stage], 0.99) - percentile(idle.stage_s[stage], 0.99)
        ),
        reverse=True,
    )
    stages_p99 = "; ".join(
        f"{stage} p99 {percentile(loaded.stage_s[stage], 0.99) * 1000:.1f} ms "
        f"(idle {percentile(idle.stage_s[stage], 0.99) * 1000:.1f})"
        for stage in grown
    )
    summary.add(
        f"Embed p99 with {loaded.workers:,} workers heartbeating",
        f"{loaded.p99 * 1000:.1f} ms = {ratio:.2f}x idle",
        f"idle p99 {idle.p99 * 1000:.1f} ms",
        f"<= {P99_TARGET_RATIO:g}x idle",
        ratio <= P99_TARGET_RATIO,
        f"by stage, most grown first: {stages_p99}; the event loop lags "
        f"{loaded.lag_p99 * 1000:.1f} ms at p99, {max(loaded.loop_lag_s) * 1000:.0f} ms at worst "
        f"(idle {idle.lag_p99 * 1000:.1f}, {max(idle.loop_lag_s) * 1000:.0f}); the heartbeats "
        f"take {heartbeat_share:.1%} of a core per 1,000 "
        f"workers; p50 {loaded.p50 * 1000:.1f} ms (idle {idle.p50 * 1000:.1f})",
    )


def print_embed(latencies: list[Latency]) -> None:
    print(
        f"  Embed at concurrency 1 ({EMBED_CALLS} calls spread over {EMBED_SPREAD_S:g}s after "
        f"{EMBED_WARMUP_CALLS} warm-up, {EMBED_DIM}-float answers), right after each window:"
    )
    for latency in latencies:
        print(
            f"  {latency.workers:7d} workers: p50 {latency.p50 * 1000:.1f} ms, p99 "
            f"{latency.p99 * 1000:.1f} ms, max {max(latency.seconds) * 1000:.1f} ms; event-loop "
            f"lag p99 {latency.lag_p99 * 1000:.1f} ms, max {max(latency.loop_lag_s) * 1000:.1f} ms"
        )
        by_stage = ", ".join(
            f"{stage} {percentile(values, 0.5) * 1000:.1f}/{percentile(values, 0.99) * 1000:.1f}"
            for stage, values in latency.stage_s.items()
        )
        print(f"  {latency.workers:7d} workers, Embed by stage, p50/p99 ms: {by_stage}")
    idle, loaded = latencies[0], latencies[-1]
    if loaded.workers:
        ratio = loaded.p99 / idle.p99
        verdict = "meets" if ratio <= P99_TARGET_RATIO else "MISSES"
        print(
            f"  Embed p99 with {loaded.workers} workers heartbeating: {loaded.p99 * 1000:.1f} ms "
            f"= {ratio:.2f}x idle ({verdict} the <= {P99_TARGET_RATIO:g}x target)"
        )
