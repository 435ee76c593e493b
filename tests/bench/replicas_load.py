"""The load process of tests/bench/replicas.py: Embed calls from K concurrent callers on one
`client_channel` over every control-plane replica, in a process of its own so that the client's
CPU is neither the scripted worker's nor the plane's.

`python -m tests.bench.replicas_load --addresses A,B --key-file F --capability C` reads one JSON
object a line on stdin (`{"concurrency": K, "calls": N, "warmup": W}`); for each it makes W calls
and discards them, prints `{"event": "measuring"}`, makes N calls, and prints
`{"event": "result", ...}` with `LoadResult.summary()`'s figures. Progress lines (not JSON) come
every PROGRESS_EVERY_S while a run lasts. Each call carries one short text of its own
(`bench_text`), as `gantry bench` sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from gantry.cli.bench_command import bench_text
from gantry.cli.loadgen import LoadPlan, LoadProgress, run_load
from gantry.common.auth import auth_metadata
from gantry.common.client_config import client_channel, split_addresses
from gantry.v1 import inference_pb2, inference_pb2_grpc

INPUT_CHARS = 24  # "one short input"
CALL_TIMEOUT_S = 30.0
PROGRESS_EVERY_S = 5.0


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Progress:
    """A line every PROGRESS_EVERY_S of a run, so a long ramp step is seen to move."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.last = time.monotonic()

    def __call__(self, progress: LoadProgress) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            print(
                f"    K={self.concurrency}: {progress.done}/{progress.total} calls in "
                f"{progress.elapsed_s:.0f} s",
                flush=True,
            )


async def serve_runs(addresses: str, key: str, capability: str) -> None:
    channel = client_channel(split_addresses(addresses), asynchronous=True)
    stub = inference_pb2_grpc.InferenceStub(channel)
    metadata = auth_metadata(key)
    offset = 0  # every call of the process gets a text of its own

    def call(index: int) -> Awaitable[object]:
        request = inference_pb2.EmbedRequest(
            capability=capability, inputs=[bench_text(offset + index, 0, INPUT_CHARS)]
        )
        return stub.Embed(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            plan = json.loads(line)
            concurrency = int(plan["concurrency"])
            if plan["warmup"]:
                await run_load(call, LoadPlan(concurrency=concurrency, requests=plan["warmup"]))
                offset += plan["warmup"]
            emit("measuring")
            result = await run_load(
                call,
                LoadPlan(concurrency=concurrency, requests=plan["calls"]),
                on_progress=Progress(concurrency),
            )
            offset += plan["calls"]
            emit("result", **result.summary())
    finally:
        await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addresses", required=True)
    parser.add_argument("--key-file", required=True, type=Path)
    parser.add_argument("--capability", required=True)
    args = parser.parse_args()
    key = args.key_file.read_text(encoding="utf-8").strip()
    asyncio.run(serve_runs(args.addresses, key, args.capability))


if __name__ == "__main__":
    main()
