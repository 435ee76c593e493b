"""The floor under the invoke overhead: each hop of an Embed's path alone, then the chain.

An Embed crosses one unary call (client -> control plane), two stream round trips (control plane
<-> scheduler, control plane <-> worker) and one pipe round trip (worker <-> model host). Here each
of those mechanisms runs with nothing else: a grpc.aio server in its own process answering at once,
and a child that answers frames on a socketpair through a reader thread and a queue, the way the
model host does. Their sum is what the path would cost if Gantry itself did nothing; the distance
from it to the measured overhead is Gantry's own work.

That sum misses two costs: a chain of processes, each woken from epoll in turn, is slower than its
hops timed apart, and every process spends CPU on every request, which is what bounds throughput
on a small machine. So the chain is also built whole, with no Gantry code: `front` (a unary server
that, per call, asks `sched` on one bidi stream and then `work` on another, matching replies to
calls by request id as the control plane does), `sched` (a stream that answers each message with a
few bytes), `work` (a stream that does one frame round trip per message with its own child `host`,
answering concurrent messages) and `host` (the model host's shape above). The bench process is the
client: it times calls one at a time, then 32 at once, and reads from /proc the CPU each process
spent per call.

Run alone: `.venv/bin/python -m tests.bench.floor` (GANTRY_BENCH_ITERATIONS).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tests.waiting import NotInTime, poll

if TYPE_CHECKING:
    import grpc

VECTOR = bytes(384 * 4)  # one all-MiniLM vector as float32 bytes: the answer every hop carries
REQUEST = b"x" * 64  # a one-sentence request, about what an Embed's text and ids weigh
_UNARY = "/floor.Floor/Unary"
_STREAM = "/floor.Floor/Stream"


@dataclass(frozen=True)
class Hop:
    name: str
    p50_ms: float
    p99_ms: float


async def _timed(call: Callable[[], Awaitable[object]], n: int) -> tuple[float, float]:
    # Imported here, not at the top: this module's children (the chain's servers) stay free of
    # Gantry's modules.
    from gantry.cli.loadgen import percentile

    for _ in range(max(5, n // 10)):
        await call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), percentile(samples, 0.99)


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


async def _start_host() -> tuple[asyncio.subprocess.Process, socket.socket]:
    """A model host child on a socketpair; returns it and the parent's end (it ends on EOF)."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.bench.floor",
            "--serve-pipe",
            str(child_end.fileno()),
            pass_fds=(child_end.fileno(),),
        )
    except BaseException:
        parent_end.close()
        raise
    finally:
        child_end.close()
    return child, parent_end


async def _pipe_hop(iterations: int) -> Hop:
    child, parent_end = await _start_host()
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


# -- the chain: front -> sched, then front -> work -> host, each a process of its own --------------

_ID = 8  # bytes of request id in front of every stream message: how replies find their call
_PLACEMENT = b"w" * 16  # sched's answer, about what a worker address weighs
_CONCURRENCY = 32
_CONCURRENT_CALLS = 3000  # enough for /proc's 10 ms CPU ticks to read to a few us per call


@dataclass(frozen=True)
class Chain:
    p50_ms: float  # one call at a time, client to front and back through the whole chain
    p99_ms: float
    calls_per_s_c32: float
    cpu_ms_per_call: dict[str, float]  # client, front, sched, work, host; at concurrency 32


async def _start_server(methods: dict[str, grpc.RpcMethodHandler]) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server of raw-bytes methods (no protos) on a free port: (server, port)."""
    import grpc

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Floor", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _serve_sched() -> None:
    """The scheduler's shape: one stream, each message answered at once with a placement."""
    import grpc

    async def place(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message[:_ID] + _PLACEMENT

    server, port = await _start_server({"Stream": grpc.stream_stream_rpc_method_handler(place)})
    print(port, flush=True)
    await server.wait_for_termination()


class _HostPipe:
    """The worker's end of the socketpair to its model host. The host answers frames in the order
    they came (one main thread), so answers are matched first in, first out: many requests can be
    in flight to one host, as with the real worker, without an id in the frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()

    async def round_trip(self, frame: bytes) -> bytes:
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting.append(answer)  # no await until the write: the deque keeps the pipe's order
        self._writer.write(len(frame).to_bytes(4, "big") + frame)
        await self._writer.drain()
        return await answer

    async def read_answers(self) -> None:
        """The one reader of the pipe: resolve the oldest waiting request with each answer."""
        try:
            while True:
                header = await self._reader.readexactly(4)
                answer = await self._reader.readexactly(int.from_bytes(header, "big"))
                waiting = self._waiting.popleft()
                if not waiting.done():
                    waiting.set_result(answer)
        except asyncio.IncompleteReadError:
            for waiting in self._waiting:
                if not waiting.done():
                    waiting.set_exception(ConnectionError("the model host closed the pipe"))

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def _answer_concurrently(
    pipe: _HostPipe,
) -> Callable[[AsyncIterator[bytes], object], AsyncIterator[bytes]]:
    """The worker's stream handler: every message gets its own task, so a slow answer does not
    hold the ones behind it; one generator writes the replies, as a stream takes one write at a
    time."""

    async def serve(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        replies: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def answer(message: bytes) -> None:
            replies.put_nowait(message[:_ID] + await pipe.round_trip(message[_ID:]))

        async def take() -> None:
            try:
                async with asyncio.TaskGroup() as tasks:
                    async for message in requests:
                        tasks.create_task(answer(message))
            finally:
                replies.put_nowait(None)

        taking = asyncio.create_task(take())
        try:
            while (reply := await replies.get()) is not None:
                yield reply
        finally:
            taking.cancel()

    return serve


async def _serve_work() -> None:
    """The worker's shape: a stream whose messages each cost one frame round trip to its own
    model host child. On SIGTERM it closes the pipe and waits for the host, leaving nothing."""
    import grpc

    host, parent_end = await _start_host()
    try:
        pipe = _HostPipe(*await asyncio.open_unix_connection(sock=parent_end))
        reading = asyncio.create_task(pipe.read_answers())
        handler = grpc.stream_stream_rpc_method_handler(_answer_concurrently(pipe))
        server, port = await _start_server({"Stream": handler})
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(port, host.pid, flush=True)
        await stop.wait()
        await server.stop(None)
        await pipe.close()  # the host ends on EOF
        await reading
    finally:
        parent_end.close()
        await host.wait()


class _Link:
    """One bidi stream shared by every call, as the control plane holds one to the scheduler and
    one to each worker: messages leave through an outbox the stream reads, and one reader task
    resolves each waiting call by its request id."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count()
        self._call = channel.stream_stream(_STREAM)(self._outgoing())
        self._reading = asyncio.create_task(self._read())

    async def ask(self, payload: bytes) -> bytes:
        request_id = next(self._ids)
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        self._outbox.put_nowait(request_id.to_bytes(_ID, "big") + payload)
        try:
            return await answer
        finally:
            self._waiting.pop(request_id, None)

    async def _outgoing(self) -> AsyncIterator[bytes]:
        while True:
            yield await self._outbox.get()

    async def _read(self) -> None:
        try:
            async for message in self._call:
                answer = self._waiting.pop(int.from_bytes(message[:_ID], "big"), None)
                if answer is not None and not answer.done():
                    answer.set_result(message[_ID:])
        finally:
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(ConnectionError("the stream ended"))


async def _serve_front(sched_port: int, work_port: int) -> None:
    """The control plane's shape: a unary Embed that asks sched where, then work for the answer."""
    import grpc

    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{sched_port}") as to_sched,
        grpc.aio.insecure_channel(f"127.0.0.1:{work_port}") as to_work,
    ):
        sched, work = _Link(to_sched), _Link(to_work)

        async def embed(request: bytes, context: object) -> bytes:
            await sched.ask(request)
            return await work.ask(request)

        server, port = await _start_server({"Unary": grpc.unary_unary_rpc_method_handler(embed)})
        print(port, flush=True)
        await server.wait_for_termination()


# -- the chain, measured from the client -----------------------------------------------------------


def _cpu_ms(pid: int) -> float:
    """utime + stime of a process, all its threads together, from /proc: its CPU spent so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # the name may hold spaces; skip past it
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def _reap(pid: int) -> None:
    """Make sure a grandchild (the host, whose parent waits for it) is gone; kill it if stuck."""
    try:
        await poll(lambda: _gone(pid), 5.0, f"process {pid} to exit", interval_s=0.05)
    except NotInTime:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Terminate a child and wait for it; kill it if it does not end within 5 s."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
    try:
        await asyncio.wait_for(process.wait(), 5)
    except TimeoutError:
        process.kill()
        await process.wait()


async def _start_role(stack: contextlib.AsyncExitStack, *args: str) -> tuple[int, list[int]]:
    """Start one process of the chain, stopped when the stack closes: (its pid, its first line:
    the port it serves, and for work the host's pid)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.bench.floor", *args, stdout=subprocess.PIPE
    )
    stack.push_async_callback(_stop, process)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    if not line:
        raise RuntimeError(f"floor {args[0]} exited before it served (rc {await process.wait()})")
    return process.pid, [int(field) for field in line.split()]


async def _start_chain(stack: contextlib.AsyncExitStack) -> tuple[int, dict[str, int]]:
    """sched, work (with its host), then front: (front's port, pid of each role)."""
    sched_pid, (sched_port,) = await _start_role(stack, "--serve-sched")
    work_pid, (work_port, host_pid) = await _start_role(stack, "--serve-work")
    stack.push_async_callback(_reap, host_pid)  # runs after work is stopped
    front_pid, (front_port,) = await _start_role(
        stack, "--serve-front", str(sched_port), str(work_port)
    )
    pids = {"client": os.getpid(), "front": front_pid, "sched": sched_pid}
    return front_port, {**pids, "work": work_pid, "host": host_pid}


async def _concurrently(call: Callable[[], Awaitable[object]], calls: int) -> None:
    """`calls` calls made by _CONCURRENCY clients, each starting its next as its last returns."""
    remaining = iter(range(calls))

    async def client() -> None:
        for _ in remaining:
            await call()

    await asyncio.gather(*(client() for _ in range(_CONCURRENCY)))


async def _throughput(
    call: Callable[[], Awaitable[object]], pids: dict[str, int]
) -> tuple[float, dict[str, float]]:
    """(calls/s, CPU ms per call of each role) at _CONCURRENCY, after a warm-up."""
    await _concurrently(call, 10 * _CONCURRENCY)
    before = {role: _cpu_ms(pid) for role, pid in pids.items()}
    start = time.perf_counter()
    await _concurrently(call, _CONCURRENT_CALLS)
    elapsed = time.perf_counter() - start
    after = {role: _cpu_ms(pid) for role, pid in pids.items()}
    cpu = {role: (after[role] - before[role]) / _CONCURRENT_CALLS for role in pids}
    return _CONCURRENT_CALLS / elapsed, cpu


async def measure_chain(iterations: int) -> Chain:
    """An Embed's whole path with no Gantry code: one call at a time, then 32 at once."""
    import grpc

    async with contextlib.AsyncExitStack() as stack:
        port, pids = await _start_chain(stack)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary(_UNARY)
            p50, p99 = await _timed(lambda: unary(REQUEST), iterations)
            calls_per_s, cpu = await _throughput(lambda: unary(REQUEST), pids)
    return Chain(p50, p99, calls_per_s, cpu)


def show_chain(chain: Chain) -> None:
    """Print the chain as `show` prints hops, and the calls/s its CPU per call allows here."""
    print(
        f"  {'chain of 4 processes, 1 call at a time':<52} p50 {chain.p50_ms:6.3f} ms   "
        f"p99 {chain.p99_ms:6.3f} ms"
    )
    print(f"  {f'chain, {_CONCURRENCY} calls at a time':<52} {chain.calls_per_s_c32:7.0f} calls/s")
    each = "  ".join(f"{role} {ms:.3f}" for role, ms in chain.cpu_ms_per_call.items())
    total = sum(chain.cpu_ms_per_call.values())
    print(f"  {'CPU per call at 32, ms':<52} {each}  total {total:.3f}")
    cores = len(os.sched_getaffinity(0))
    if total > 0:
        allowed = f"calls/s {cores} cores allow at that CPU per call"
        print(f"  {allowed:<52} {cores * 1000 / total:7.0f} calls/s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-grpc"]:
        asyncio.run(_serve_grpc())
    elif sys.argv[1:2] == ["--serve-pipe"]:
        _serve_pipe(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--serve-sched"]:
        asyncio.run(_serve_sched())
    elif sys.argv[1:2] == ["--serve-work"]:
        asyncio.run(_serve_work())
    elif sys.argv[1:2] == ["--serve-front"]:
        asyncio.run(_serve_front(int(sys.argv[2]), int(sys.argv[3])))
    else:
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the children on TERM too
        iterations = int(os.environ.get("GANTRY_BENCH_ITERATIONS", "500"))
        print("The floor: each hop of an Embed measured alone")
        show(asyncio.run(measure(iterations)))
        print(
            "The floor: the chain client -> front -> sched, front -> work -> host, no Gantry code"
        )
        show_chain(asyncio.run(measure_chain(iterations)))
