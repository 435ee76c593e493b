"""The floor under the invoke overhead: each hop of an Embed's path measured alone.

An Embed crosses one unary call (client -> control plane), two stream round trips (control plane
<-> scheduler, control plane <-> worker) and one pipe round trip (worker <-> model host). Here each
of those mechanisms runs with nothing else: a grpc.aio server in its own process answering at once,
and a child that answers frames on a socketpair through a reader thread and a queue, the way the
model host does. Their sum is what the path would cost if Gantry itself did nothing; the distance
from it to the measured overhead is Gantry's own work.

Run alone: `.venv/bin/python -m tests.bench.floor` (GANTRY_BENCH_ITERATIONS).
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

VECTOR = bytes(384 * 4)  # one all-MiniLM vector as float32 bytes: the answer every hop carries
REQUEST = b"x" * 64  # a one-sentence request, about what an Embed's text and ids weigh
_UNARY = "/floor.Floor/Unary"
_STREAM = "/floor.Floor/Stream"


@dataclass(frozen=True)
class Hop:
    name: str
    p50_ms: float
    p99_ms: float


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _timed(call: Callable[[], Awaitable[object]], n: int) -> tuple[float, float]:
    for _ in range(max(5, n // 10)):
        await call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), _percentile(samples, 0.99)


# -- the server side, in a process of its own ------------------------------------------------------


async def _serve_grpc() -> None:
    import grpc

    async def unary(request: bytes, context: object) -> bytes:
        return VECTOR

    async def stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for _ in requests:
            yield VECTOR

    handler = grpc.method_handlers_generic_handler(
        "floor.Floor",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def _serve_pipe(fd: int) -> None:
    """The model host's shape: a reader thread queues frames, the main thread answers them."""
    channel = socket.socket(fileno=fd)
    reader, writer = channel.makefile("rb"), channel.makefile("wb")
    inbox: queue.Queue[bytes | None] = queue.Queue()

    def read() -> None:
        while header := reader.read(4):
            inbox.put(reader.read(int.from_bytes(header, "big")))
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    while inbox.get() is not None:
        writer.write(len(VECTOR).to_bytes(4, "big") + VECTOR)
        writer.flush()


# -- the client side -------------------------------------------------------------------------------


async def _grpc_hops(iterations: int) -> list[Hop]:
    import grpc

    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.bench.floor", "--serve-grpc", stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        port = int(await server.stdout.readline())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary(_UNARY)
            unary_p50, unary_p99 = await _timed(lambda: unary(REQUEST), iterations)
            call = channel.stream_stream(_STREAM)()

            async def round_trip() -> None:
                await call.write(REQUEST)
                await call.read()

            stream_p50, stream_p99 = await _timed(round_trip, iterations)
            await call.done_writing()
    finally:
        server.terminate()
        await server.wait()
    return [
        Hop("grpc.aio unary call (client -> control plane)", unary_p50, unary_p99),
        Hop("bidi stream round trip (-> scheduler, -> worker)", stream_p50, stream_p99),
    ]


async def _pipe_hop(iterations: int) -> Hop:
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.bench.floor",
        "--serve-pipe",
        str(child_end.fileno()),
        pass_fds=(child_end.fileno(),),
    )
    child_end.close()
    try:
        reader, writer = await asyncio.open_unix_connection(sock=parent_end)

        async def round_trip() -> None:
            writer.write(len(REQUEST).to_bytes(4, "big") + REQUEST)
            await writer.drain()
            header = await reader.readexactly(4)
            await reader.readexactly(int.from_bytes(header, "big"))

        p50, p99 = await _timed(round_trip, iterations)
        writer.close()
        await writer.wait_closed()  # the child ends on EOF
    finally:
        await child.wait()
    return Hop("pipe round trip via a reader thread (-> model host)", p50, p99)


async def measure(iterations: int) -> list[Hop]:
    """The hops of one Embed, each alone: one unary call, two stream round trips, one pipe."""
    grpc_hops = await _grpc_hops(iterations)
    return [*grpc_hops, await _pipe_hop(iterations)]


def floor_of(hops: list[Hop]) -> tuple[float, float]:
    """(p50, p99) of an Embed's hops summed: the unary call, two stream round trips, the pipe."""
    unary, stream, pipe = hops
    return (
        unary.p50_ms + 2 * stream.p50_ms + pipe.p50_ms,
        unary.p99_ms + 2 * stream.p99_ms + pipe.p99_ms,
    )


def show(hops: list[Hop]) -> tuple[float, float]:
    for hop in hops:
        print(f"  {hop.name:<52} p50 {hop.p50_ms:6.3f} ms   p99 {hop.p99_ms:6.3f} ms")
    p50, p99 = floor_of(hops)
    print(
        f"  {'floor of one Embed (unary + 2 x stream + pipe)':<52} p50 {p50:6.3f} ms   "
        f"p99 {p99:6.3f} ms"
    )
    return p50, p99


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-grpc"]:
        asyncio.run(_serve_grpc())
    elif sys.argv[1:2] == ["--serve-pipe"]:
        _serve_pipe(int(sys.argv[2]))
    else:
        print("The floor: each hop of an Embed measured alone")
        show(asyncio.run(measure(int(os.environ.get("GANTRY_BENCH_ITERATIONS", "500")))))
