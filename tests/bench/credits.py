"""Issue 29 item 1: Embed latency at concurrency 1 with scheduler credits on and off, in one run.

A script, not a test. It starts two `gantry up --device cpu` planes side by side
(tests/bench/served.py): one with credits on (the scheduler's default), one with them off
(GANTRY_SCHEDULER_CREDITS_PER_TENANT=0: every call asks the scheduler first); nothing else differs.
After WARM_UP Embeds of one sentence on each, it sends --calls pairs, one call at a time, the two
planes taking turns (which goes first alternates), so whatever else loads the machine meanwhile
weighs on both alike. It prints p50/p99 of the client's latency for each, the median of the
paired differences, and the scheduler's credited_total (calls dispatched on a credit).

    .venv/bin/python -m tests.bench.credits [--calls 500]

A busy machine moves the figures: compare the two sides of one run, and say how busy it was.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gantry.cli.connection import bearer
from gantry.cli.loadgen import percentile
from gantry.v1 import control_plane_pb2_grpc, inference_pb2, scheduler_pb2
from tests.bench.served import CAPABILITY, Served, gantry_up

WARM_UP = 30
SENTENCE = "A sentence for the credits bench: the plane should cost less than the model."
SETTINGS: dict[str, dict[str, str]] = {
    "on": {},
    "off": {"GANTRY_SCHEDULER_CREDITS_PER_TENANT": "0"},
}


def say(line: str) -> None:
    print(line, flush=True)


async def _credited(served: Served) -> int:
    """The scheduler's credited_total, read as an operator would (`gantry queue`)."""
    token = (served.log.parent / "state" / "operator.token").read_text(encoding="utf-8")
    stub = control_plane_pb2_grpc.ControlPlaneStub(served.channel)
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=bearer(token.strip()), timeout=10
    )
    return snapshot.credited_total


async def _call(served: Served) -> float:
    request = inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=[SENTENCE])
    started = time.perf_counter()
    await served.inference.Embed(request, metadata=served.client_md, timeout=30)
    return time.perf_counter() - started


async def _credited_or_none(served: Served) -> int | None:
    try:
        return await _credited(served)
    except Exception as error:  # a side note; the latencies are the point
        say(f"  (credited_total unread: {error})")
        return None


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="tests.bench.credits")
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gantry-credits-") as base:
        async with contextlib.AsyncExitStack() as stack:
            planes: dict[str, Served] = {}
            for name, env in SETTINGS.items():
                (Path(base) / name).mkdir()
                planes[name] = await stack.enter_async_context(
                    gantry_up(Path(base) / name, env=env, device="cpu", up_args=("--no-metrics",))
                )
                say(f"credits {name}: serving")
            for _ in range(WARM_UP):
                for served in planes.values():
                    await _call(served)
            seconds: dict[str, list[float]] = {name: [] for name in planes}
            for i in range(args.calls):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                for name in order:
                    seconds[name].append(await _call(planes[name]))
            for name, served in planes.items():
                values = seconds[name]
                say(
                    f"credits {name}: p50 {statistics.median(values) * 1e3:.2f} ms"
                    f"  p99 {percentile(values, 0.99) * 1e3:.2f} ms  ({len(values)} calls,"
                    f" credited_total {await _credited_or_none(served)})"
                )
    on, off = seconds["on"], seconds["off"]
    paired = statistics.median(b - a for a, b in zip(on, off, strict=True))
    say(
        f"on/off: p50 {statistics.median(on) / statistics.median(off):.2f},"
        f" p99 {percentile(on, 0.99) / percentile(off, 0.99):.2f};"
        f" median paired saving (off - on) {paired * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
