"""Issue 26's first "done when": with thousands of idle or slow-header connections held on the HTTP
door, how long a new client's Embed takes on each door. A measurement, not a test (the hostile
suite asserts that both doors answer; this prints how fast).

    .venv/bin/python -m tests.bench.held_connections [--held 5000] [--calls 20]

It starts the hostile suite's stack of real processes (scheduler, control plane with the HTTP
door, one worker, on a fresh PostgreSQL database, serving the tiny test embedder), times the
victim tenant's Embed on gRPC and on HTTP with nothing held, then again with `--held` connections
held (half idle, half having sent an unfinished header), and prints p50 and max for each.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tests.fixtures.tiny_model import build_tiny_sentence_transformer
from tests.hostile.stack import (
    CAPABILITY,
    HostileStack,
    close_all,
    open_descriptors,
    open_held,
)
from tests.integration.module_databases import module_database

SLOW_HEADER = b"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\n"  # never finished


async def _timed(call: Callable[[], Awaitable[object]], calls: int) -> list[float]:
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        seconds.append(time.perf_counter() - started)
    return seconds


def _line(label: str, seconds: list[float]) -> str:
    return (
        f"{label:<34} p50 {statistics.median(seconds) * 1000:7.1f} ms"
        f"   max {max(seconds) * 1000:7.1f} ms   ({len(seconds)} calls)"
    )


async def _measure(stack: HostileStack, held_count: int, calls: int) -> None:
    pid = stack.control_plane_pid
    await stack.both_doors_serve_the_victim()  # what opens lazily is in the baseline
    print(_line("gRPC Embed, nothing held", await _timed(stack.victim_embed, calls)))
    print(_line("HTTP Embed, nothing held", await _timed(stack.victim_http_embed, calls)))
    baseline = open_descriptors(pid)
    half = held_count // 2
    print(f"holding {half} idle and {held_count - half} slow-header connections ...", flush=True)
    held = await asyncio.to_thread(open_held, stack.http_port, half, b"")
    try:
        held += await asyncio.to_thread(open_held, stack.http_port, held_count - half, SLOW_HEADER)
        print(f"control plane descriptors: {baseline} -> {open_descriptors(pid)}")
        print(_line(f"gRPC Embed, {held_count} held", await _timed(stack.victim_embed, calls)))
        print(_line(f"HTTP Embed, {held_count} held", await _timed(stack.victim_http_embed, calls)))
    finally:
        close_all(held)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, args.held + 1024)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    with tempfile.TemporaryDirectory(prefix="gantry-held-") as scratch:
        root = Path(scratch)
        model = build_tiny_sentence_transformer(root / "tiny-model")
        async with module_database("postgres", root) as database_url:
            stack = HostileStack(database_url=database_url, root=root)
            try:
                await stack.start()
                deployment_id = await stack.deploy_chunked(model, CAPABILITY)
                await stack.wait_ready(deployment_id, timeout_s=120)
                await _measure(stack, args.held, args.calls)
            except BaseException:
                stack.print_logs_on_failure()
                raise
            finally:
                await stack.stop()


if __name__ == "__main__":
    asyncio.run(main())
