"""Fleet bench: one control plane with N simulated workers connected and heartbeating.

PERFORMANCE.md: "1,000 simulated workers (light fake adapters, real streams) connected to one
control plane, heartbeating, with lost-worker detection <= 10 s and CPU to spare; report how CPU
and memory grow with the worker count." Issue 9 sets heartbeats of 1,000 workers at <= 5 % of a
core. The control plane and the scheduler run in this process (`running_gantry`, SQLite in a
temporary directory); the workers are real `WorkerGateway.Connect` streams opened by a separate
process (tests/bench/fleet_simulator.py), so the CPU read from /proc/self/stat over each window is
the control plane's (and the in-process scheduler's), never the simulator's.

Figures, each beside the baseline of the same run (the same process with no worker connected):
the time to connect the workers, the fraction of a core and the RSS at 0, 250 and N workers, and
the time until ListNodes says DISCONNECTED for workers that stop heartbeating (stream kept open:
the staleness grace decides) and for workers whose stream closes, and, last, for the whole fleet
when every stream closes at once (the simulator exits: their ends share transactions,
nodes/goodbyes.py).

Embed latency under that load (issue 9: p99 within 1.5x of idle): before the simulated workers
connect, one deployment is made READY on one more worker, a `ScriptedWorker` in this process that
heartbeats like the others and answers each Invoke at once with a fixed 384-float vector. A
client in this process (its own grpc.aio channel, the harness's client key) then calls Embed at
concurrency 1, after a warm-up, with the calls spread evenly over a span of several heartbeat
intervals (so that periodic work, reconciler passes and batched flushes, falls inside it): once
right after the idle window (no simulated worker connected) and once right after the window at N
workers, while they heartbeat. Neither sample overlaps a CPU window. Beside each: p50, p99 and
max, the same per stage of the call (the control plane's own stage timings, read in this
process: resolve, schedule = the scheduler's round trip, worker = the worker stream's round trip,
and the rest = the client's gRPC round trip to the control plane around them), and the event
loop's lag over the same span (a 10 ms sleep's overshoot), the stall a call waits behind.

Each worker beats at the interval the control plane tells its stream (heartbeat_pacing.py: the
base interval, grown with the streams the replica holds so they send at most
GANTRY_BENCH_FLEET_MAX_HEARTBEATS_PER_S in all; 100/s by default, as in production); a silent
worker's detection is judged against the bound that interval gives (the interval, the base
grace's slack of 2 base intervals, and a reconcile pass: `StaleGrace`).
GANTRY_BENCH_FLEET_MAX_HEARTBEATS_PER_S=inf keeps every stream at the base interval: the fleet's
figures before pacing.

The measured floor under the heartbeat target: the same simulator, with the same N workers and
CPU windows of the same length, against a bare `grpc.aio` server in this process (Gantry's server
options, no interceptor, no database) whose Connect answers the Hello with a Welcome naming the
interval Gantry tells N streams and then reads and drops every message. Its CPU over its own idle
(the same server with no worker connected) is what gRPC alone costs to receive those heartbeats.

GANTRY_BENCH_FLEET_WORKERS (default 1000; 0 skips), GANTRY_BENCH_FLEET_WINDOW_S (default 30),
GANTRY_BENCH_FLEET_HEARTBEAT_S (default: the production base heartbeat interval, 3 s),
GANTRY_BENCH_FLEET_MAX_HEARTBEATS_PER_S (default: the production bound, 100),
GANTRY_BENCH_FLEET_EMBED_CALLS (default 1000) spread over GANTRY_BENCH_FLEET_EMBED_S (default 20),
GANTRY_BENCH_FLEET_GPUS (default 0: empty heartbeats; G: each carries a G-GPU reading, or says
it is unchanged, as a worker agent's does), GANTRY_BENCH_FLEET_GPU_CHANGES (default 0: the chance
a worker's reading moved since its last beat), GANTRY_BENCH_FLEET_GPU_FULL=1 (the whole reading at
every beat, as before `gpus_unchanged`); tests/bench/fleet_simulator.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import duration_pb2

from gantry.common.grpc_server import CHANNEL_OPTIONS, SERVER_OPTIONS
from gantry.common.process import freeze_startup_heap
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.nodes.heartbeat_pacing import (
    DEFAULT_MAX_HEARTBEATS_PER_S,
    HeartbeatPacing,
)
from gantry.v1 import common_pb2, inference_pb2_grpc, worker_gateway_pb2_grpc
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.bench.fleet_embed import (
    Latency,
    measure_embed,
    print_embed,
    serving_deployment,
    summarise_embed,
)
from tests.bench.summary import Summary
from tests.integration.harness import Harness, running_gantry
from tests.waiting import NotInTime, poll

WORKERS = int(os.environ.get("GANTRY_BENCH_FLEET_WORKERS", "1000"))
WINDOW_S = float(os.environ.get("GANTRY_BENCH_FLEET_WINDOW_S", "30"))
HEARTBEAT_S = float(
    os.environ.get("GANTRY_BENCH_FLEET_HEARTBEAT_S", str(ReconcilerSettings().heartbeat_interval_s))
)
PACING = HeartbeatPacing(
    base_interval_s=HEARTBEAT_S,
    max_per_s=float(
        os.environ.get("GANTRY_BENCH_FLEET_MAX_HEARTBEATS_PER_S", str(DEFAULT_MAX_HEARTBEATS_PER_S))
    ),
)
GPUS = int(os.environ.get("GANTRY_BENCH_FLEET_GPUS", "0"))  # read by the simulator too
GPU_CHANGES = float(os.environ.get("GANTRY_BENCH_FLEET_GPU_CHANGES", "0"))  # the simulator's
GPU_FULL = os.environ.get("GANTRY_BENCH_FLEET_GPU_FULL", "") == "1"  # the simulator's
COMMAND = (
    "python -m tests.bench.fleet  (GANTRY_BENCH_FLEET_WORKERS, GANTRY_BENCH_FLEET_WINDOW_S, "
    "GANTRY_BENCH_FLEET_HEARTBEAT_S, GANTRY_BENCH_FLEET_MAX_HEARTBEATS_PER_S, "
    "GANTRY_BENCH_FLEET_EMBED_CALLS, GANTRY_BENCH_FLEET_EMBED_S, GANTRY_BENCH_FLEET_GPUS, "
    "GANTRY_BENCH_FLEET_GPU_CHANGES, GANTRY_BENCH_FLEET_GPU_FULL)"
)
# Workers the detection step loses: some fall silent, as many have their stream closed.
LOST_PER_KIND = 5
CPU_TARGET = 0.05  # of a core, for the heartbeats of 1,000 workers (issue 9)
# A worker whose stream closed (its process exited) is DISCONNECTED by the goodbye, at once.
CLOSED_DETECTION_TARGET_S = 10.0
DROP_TIMEOUT_S = 60.0  # the whole fleet's streams closed at once: how long the bench waits


def detection_bound_s(reconciler: ReconcilerSettings, interval_s: float) -> float:
    """How soon a silent worker told `interval_s` is found (heartbeat_pacing.py): its grace (the
    interval and the base grace's slack), and the reconciler's next pass."""
    multiple = round(interval_s / reconciler.heartbeat_interval_s)
    return reconciler.grace.seconds(multiple) + reconciler.interval_s


@dataclass(frozen=True)
class Window:
    workers: int
    core_fraction: float
    rss_mb: float
    simulator_core_fraction: float
    heartbeats_per_s: float
    core_fraction_by_thread_kind: dict[str, float]
    interval_s: float = 0.0  # the longest heartbeat interval a worker was told


def per_thousand_over_idle(idle: Window, full: Window) -> float:
    """The fraction of a core the workers of `full` add over `idle`, scaled to 1,000 workers."""
    return (full.core_fraction - idle.core_fraction) * 1000 / full.workers


@dataclass(frozen=True)
class Floor:
    """The bare gRPC server's windows: with no worker connected, then with every one of them."""

    idle: Window
    full: Window
    connect_s: float
    never_welcomed: int

    @property
    def per_thousand(self) -> float:
        return per_thousand_over_idle(self.idle, self.full)


def process_cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds_by_thread_kind() -> dict[str, float]:
    """CPU of this process's threads so far, grouped: the event loop (the main thread), the
    database threads (aiosqlite's, named like the process), and gRPC's own (event_engine ...)."""
    ticks = os.sysconf("SC_CLK_TCK")
    main_tid = str(os.getpid())
    kinds: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text(encoding="ascii").strip()
            stat = (task / "stat").read_text(encoding="ascii")
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2 :].split()
        kind = "event loop" if task.name == main_tid else name
        if kind == Path(sys.executable).name or kind.startswith("python"):
            kind = "other Python threads (aiosqlite, grpc.aio poller)"
        kinds[kind] = kinds.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return kinds


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Simulator:
    """The simulator process, driven one command line at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, address: str, credentials_file: Path) -> Simulator:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.bench.fleet_simulator",
            address,
            str(credentials_file),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        return cls(process)

    async def ask(self, command: str) -> list[str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()
        line = (await self.process.stdout.readline()).decode().strip()
        if not line or line.startswith("error"):
            raise RuntimeError(f"the simulator answered {line!r} to {command!r}")
        return line.split()

    async def heartbeats_and_cpu(self) -> tuple[int, float, float]:
        """Heartbeats sent, CPU seconds, and the longest interval a worker was told."""
        answer = await self.ask("stats")
        return int(answer[1]), float(answer[3]), float(answer[5])

    async def stop(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.process.stdin.write(b"quit\n")
            await self.process.stdin.drain()
        try:
            await asyncio.wait_for(self.process.wait(), 60)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


async def measure_window(simulator: Simulator, workers: int) -> Window:
    beats_before, simulator_before, _ = await simulator.heartbeats_and_cpu()
    threads_before = cpu_seconds_by_thread_kind()
    cpu_before, started = process_cpu_seconds(), time.perf_counter()
    await asyncio.sleep(WINDOW_S)
    cpu_after, ended = process_cpu_seconds(), time.perf_counter()
    threads_after = cpu_seconds_by_thread_kind()
    beats_after, simulator_after, interval_s = await simulator.heartbeats_and_cpu()
    wall = ended - started
    return Window(
        workers=workers,
        core_fraction=(cpu_after - cpu_before) / wall,
        rss_mb=rss_mb(),
        simulator_core_fraction=(simulator_after - simulator_before) / wall,
        heartbeats_per_s=(beats_after - beats_before) / wall,
        core_fraction_by_thread_kind={
            kind: (seconds - threads_before.get(kind, 0.0)) / wall
            for kind, seconds in sorted(threads_after.items())
        },
        interval_s=interval_s,
    )


async def time_until_disconnected(
    harness: Harness, node_ids: list[str], since: float, timeout_s: float
) -> list[float]:
    """Seconds from `since` until GetNode says DISCONNECTED, per node (inf past the timeout)."""
    seen: dict[str, float] = {}

    async def all_disconnected() -> bool:
        for node_id in node_ids:
            if node_id in seen:
                continue
            node = await harness.operator.GetNode(
                cp.GetNodeRequest(node_id=node_id), metadata=harness.op_md
            )
            if node.state == common_pb2.NODE_STATE_DISCONNECTED:
                seen[node_id] = time.perf_counter() - since
        return len(seen) == len(node_ids)

    left_s = since + timeout_s - time.perf_counter()
    with contextlib.suppress(NotInTime):  # those not seen by then read inf
        await poll(all_disconnected, left_s, "the nodes to read DISCONNECTED", interval_s=0.1)
    return [seen.get(node_id, float("inf")) for node_id in node_ids]


class BareGateway(worker_gateway_pb2_grpc.WorkerGatewayServicer):
    """WorkerGateway.Connect with no Gantry code at all: what a heartbeat costs gRPC alone.

    It reads the Hello, answers with a Welcome the scripted worker accepts (the interval Gantry
    tells as many streams as the bench connects, and that it takes `gpus_unchanged`, as Gantry's
    says: its workers send what they send Gantry), then reads and drops every message to the end."""

    def __init__(self, heartbeat_s: float) -> None:
        self.interval = duration_pb2.Duration()
        self.interval.FromNanoseconds(int(heartbeat_s * 1e9))

    async def Connect(
        self,
        request_iterator: AsyncIterator[wg.WorkerMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[wg.ControlMessage]:
        hello = await anext(aiter(request_iterator), None)
        if hello is None:
            return
        yield wg.ControlMessage(
            welcome=wg.Welcome(
                node_id="bare",
                accepted_generation=hello.generation,
                heartbeat_interval=self.interval,
                gpu_reading_unchanged_understood=True,
            )
        )
        async for _ in request_iterator:
            pass


@contextlib.asynccontextmanager
async def bare_server() -> AsyncIterator[str]:
    """A bare gRPC server on 127.0.0.1 (port 0) with Gantry's server options, nothing else."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    gateway = BareGateway(PACING.interval_s(WORKERS + 1))  # and the serving worker's
    worker_gateway_pb2_grpc.add_WorkerGatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


async def measure_grpc_floor(credentials_file: Path, workers: int) -> Floor:
    """The same workers and windows against the bare server: the floor Gantry's figure sits on.

    Its idle is the bare server's own with no worker connected, measured the same way, so the
    floor is what receiving the heartbeats adds, never what the process spends anyway."""
    async with bare_server() as address:
        simulator = await Simulator.start(address, credentials_file)
        try:
            idle = await measure_window(simulator, 0)
            answer = await simulator.ask(f"connect {workers}")
            # Every worker's heartbeat phase has started before the window opens.
            await asyncio.sleep(PACING.interval_s(workers + 1))
            full = await measure_window(simulator, workers)
        finally:
            await simulator.stop()
    return Floor(idle=idle, full=full, connect_s=float(answer[2]), never_welcomed=int(answer[4]))


def stages(workers: int) -> list[int]:
    return sorted({0, min(250, workers), workers})


async def bench_fleet(summary: Summary | None = None) -> int:
    if WORKERS <= 0:
        print("Fleet bench skipped (GANTRY_BENCH_FLEET_WORKERS=0)")
        return 0
    # A thousand worker connections need more descriptors than the usual soft limit of 1024.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    reconciler = ReconcilerSettings(interval_s=1.0, heartbeat_interval_s=HEARTBEAT_S)
    print(
        f"Fleet bench: {WORKERS} simulated workers, heartbeat every {HEARTBEAT_S:g}s grown to keep "
        f"under {PACING.max_per_s:g}/s ({PACING.interval_s(WORKERS + 1):g}s for {WORKERS} and "
        f"the serving worker), stale after that and 2 base intervals, CPU windows of "
        f"{WINDOW_S:g}s, "
        f"heartbeats {_heartbeats_described()}; "
        f"reproduce: {COMMAND}"
    )
    base = Path(tempfile.mkdtemp(prefix="gantry-fleet-"))
    (base / "artifacts").mkdir()
    async with (
        running_gantry(
            f"sqlite+aiosqlite:///{base / 'g.db'}", base / "artifacts", reconciler=reconciler
        ) as harness,
        serving_deployment(harness, base),
    ):
        harness.control_plane.gateway.pacing = PACING
        # The client dials its own connection (a local subchannel pool: gRPC would otherwise
        # share the harness channel's, which the serving worker's stream rides).
        client_channel = grpc.aio.insecure_channel(
            harness.address, options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        )
        client = inference_pb2_grpc.InferenceStub(client_channel)
        latencies: list[Latency] = []
        started = time.perf_counter()
        gate = asyncio.Semaphore(8)

        async def register(index: int) -> tuple[str, str]:
            async with gate:
                response = await harness.operator.RegisterNode(
                    cp.RegisterNodeRequest(name=f"fleet-{index:05d}"), metadata=harness.op_md
                )
                return response.node.node_id, response.credential

        registered = await asyncio.gather(*(register(i) for i in range(WORKERS)))
        node_ids = [node_id for node_id, _ in registered]
        print(f"  registered {WORKERS} nodes in {time.perf_counter() - started:.1f}s")
        credentials_file = base / "credentials.json"
        credentials_file.write_text(json.dumps([c for _, c in registered]), encoding="utf-8")
        simulator = await Simulator.start(harness.address, credentials_file)
        # The control plane's own process freezes its start-up heap (`run_until_signalled`); here
        # it shares this process with what the bench imported before it (under `make bench`
        # torch and a loaded model: 540,000 objects, a full collection 0.4 s, four of them in
        # one run of this bench), which a full collection inside a window would charge to the
        # heartbeats. Frozen as the control plane's process is, before the first window.
        freeze_startup_heap()
        windows: list[Window] = []
        connect_s = 0.0
        connect_failures = 0
        try:
            for target in stages(WORKERS):
                if target:
                    answer = await simulator.ask(f"connect {target}")
                    connect_s += float(answer[2])
                    connect_failures += int(answer[4])
                    print(
                        f"  connected {target} workers ({connect_s:.1f}s in all so far; "
                        f"{answer[6]} Hellos refused and tried again, "
                        f"{connect_failures} workers never welcomed)"
                    )
                    # Every worker's heartbeat phase has started before the window opens.
                    await asyncio.sleep(PACING.interval_s(target + 1))
                windows.append(await measure_window(simulator, target))
                if target in (0, WORKERS):  # right after the window: never inside one
                    latencies.append(await measure_embed(client, harness.client_md, target))
            detection = await _lose_workers(harness, simulator, node_ids, reconciler)
            dropped = await _drop_the_fleet(harness, simulator, node_ids)
        finally:
            await simulator.stop()
            await client_channel.close()
    # After the control plane has stopped: the bare server has the process to itself.
    floor = await measure_grpc_floor(credentials_file, WORKERS)
    shutil.rmtree(base, ignore_errors=True)
    _print_figures(windows, connect_s, detection, reconciler)
    print(
        f"  the whole fleet dropped at once ({WORKERS} streams closed together): every node "
        f"DISCONNECTED {dropped[0]:.1f}s after ({dropped[1]} not by {DROP_TIMEOUT_S:g}s; "
        f"target <= {CLOSED_DETECTION_TARGET_S:g}s, as for one closed stream)"
    )
    print_embed(latencies)
    _print_floor(floor, windows)
    if summary is not None:
        _summarise(summary, windows, detection, reconciler, floor)
        summary.add(
            f"{WORKERS} workers' streams closed at once",
            f"{dropped[0]:.1f} s",
            f"one closed stream {min(detection.get('closed') or [float('inf')]):.1f} s",
            f"<= {CLOSED_DETECTION_TARGET_S:g} s",
            dropped[1] == 0 and dropped[0] <= CLOSED_DETECTION_TARGET_S,
            f"{dropped[1]} nodes still not DISCONNECTED after {DROP_TIMEOUT_S:g} s; the ends "
            "that come together share their transactions (nodes/goodbyes.py)",
        )
        summarise_embed(
            summary, latencies, heartbeat_share=per_thousand_over_idle(windows[0], windows[-1])
        )
    return 0


def _heartbeats_described() -> str:
    if not GPUS:
        return "empty"
    if GPU_FULL:
        return f"each with a {GPUS}-GPU reading, whole at every beat (GANTRY_BENCH_FLEET_GPU_FULL)"
    return (
        f"each with a {GPUS}-GPU reading, said unchanged when it is (moved since the last beat: "
        f"{GPU_CHANGES:.0%} of beats)"
    )


def _summarise(
    summary: Summary,
    windows: list[Window],
    detection: dict[str, list[float]],
    reconciler: ReconcilerSettings,
    floor: Floor,
) -> None:
    idle, full = windows[0], windows[-1]
    if not full.workers:
        return
    per_thousand = (full.core_fraction - idle.core_fraction) * 1000 / full.workers
    python_kinds = ("event loop", "other Python threads (aiosqlite, grpc.aio poller)")

    def native(window: Window) -> float:  # gRPC's own threads (event_engine, ...)
        return sum(
            fraction
            for kind, fraction in window.core_fraction_by_thread_kind.items()
            if kind not in python_kinds
        )

    grpc_share = native(full) - native(idle)
    summary.add(
        "heartbeats of 1,000 workers, core over idle",
        f"{per_thousand:.1%}",
        f"idle control plane {idle.core_fraction:.1%}",
        f"<= {CPU_TARGET:.0%}",
        per_thousand <= CPU_TARGET,
        f"gRPC's own transport threads take {grpc_share:.1%} of it over idle with "
        f"{full.workers} open streams; no database write per heartbeat remains; measured floor: "
        f"a bare grpc.aio server receiving the same {floor.full.workers} streams' heartbeats "
        f"costs {floor.per_thousand:.1%} of a core per 1,000 workers over idle",
    )
    silent = [s for s in detection.get("silent", []) if s != float("inf")]
    worst = max(silent) if silent else float("inf")
    interval_s = full.interval_s
    bound_s = detection_bound_s(reconciler, interval_s)
    summary.add(
        "lost worker (silent) detected",
        f"{worst:.1f} s",
        f"grace {bound_s - reconciler.interval_s:g} s (its {interval_s:g} s interval and "
        f"{bound_s - reconciler.interval_s - interval_s:g} s of slack)",
        f"<= {bound_s:g} s",
        worst <= bound_s,
        f"the documented bound for {full.workers} streams (heartbeat_pacing.py): the "
        f"{interval_s:g} s interval they were told (base {HEARTBEAT_S:g} s, grown to keep under "
        f"{PACING.max_per_s:g}/s), the base grace's slack for a late beat, and a reconcile pass",
    )


async def _lose_workers(
    harness: Harness, simulator: Simulator, node_ids: list[str], reconciler: ReconcilerSettings
) -> dict[str, list[float]]:
    count = min(LOST_PER_KIND, len(node_ids) // 2)
    silent = list(range(count))
    closed = list(range(count, 2 * count))
    interval_s = PACING.interval_s(len(node_ids) + 1)  # and the serving worker's stream
    timeout_s = detection_bound_s(reconciler, interval_s) * 2 + 10
    since = time.perf_counter()
    await simulator.ask("silence " + " ".join(map(str, silent)))
    await simulator.ask("kill " + " ".join(map(str, closed)))
    silent_s, closed_s = await asyncio.gather(
        time_until_disconnected(harness, [node_ids[i] for i in silent], since, timeout_s),
        time_until_disconnected(harness, [node_ids[i] for i in closed], since, timeout_s),
    )
    return {"silent": silent_s, "closed": closed_s}


async def _drop_the_fleet(
    harness: Harness, simulator: Simulator, node_ids: list[str]
) -> tuple[float, int]:
    """Every simulated worker's stream closed at once (the simulator exits, as a network that
    drops a rack would): (seconds until ListNodes says every node DISCONNECTED, how many still
    did not by the timeout). A stream that ends is seen at once, however many end together
    (nodes/goodbyes.py), never left to the reconciler's staleness."""
    wanted = set(node_ids)
    left = len(wanted)

    async def all_disconnected() -> bool:
        nonlocal left
        states: dict[str, int] = {}
        token = ""
        while True:
            page = await harness.operator.ListNodes(
                cp.ListNodesRequest(page_size=500, page_token=token), metadata=harness.op_md
            )
            states.update((node.node_id, node.state) for node in page.nodes)
            if not (token := page.next_page_token):
                break
        left = sum(states.get(n) != common_pb2.NODE_STATE_DISCONNECTED for n in wanted)
        return left == 0

    since = time.perf_counter()
    await simulator.stop()
    with contextlib.suppress(NotInTime):
        await poll(
            all_disconnected, DROP_TIMEOUT_S, "the dropped fleet DISCONNECTED", interval_s=0.2
        )
    return time.perf_counter() - since, left


def _print_figures(
    windows: list[Window],
    connect_s: float,
    detection: dict[str, list[float]],
    reconciler: ReconcilerSettings,
) -> None:
    idle = windows[0]
    print(f"  time to connect {windows[-1].workers} workers: {connect_s:.1f}s")
    print(
        "  workers   CP core   over idle   RSS MB   over idle   heartbeats/s   interval   "
        "simulator core"
    )
    for window in windows:
        print(
            f"  {window.workers:7d}   {window.core_fraction:6.1%}   "
            f"{window.core_fraction - idle.core_fraction:+8.1%}   {window.rss_mb:6.0f}   "
            f"{window.rss_mb - idle.rss_mb:+8.0f}   {window.heartbeats_per_s:12.0f}   "
            f"{window.interval_s:7g}s   {window.simulator_core_fraction:13.1%}"
        )
    for window in windows:
        shares = ", ".join(
            f"{kind} {fraction:.1%}"
            for kind, fraction in window.core_fraction_by_thread_kind.items()
            if fraction >= 0.001
        )
        print(f"  {window.workers:7d} workers, CP core by thread: {shares}")
    full = windows[-1]
    if full.workers:
        per_thousand = (full.core_fraction - idle.core_fraction) * 1000 / full.workers
        mb_per_thousand = (full.rss_mb - idle.rss_mb) * 1000 / full.workers
        verdict = "meets" if per_thousand <= CPU_TARGET else "MISSES"
        print(
            f"  heartbeats cost {per_thousand:.1%} of a core per 1,000 workers over idle "
            f"({verdict} the {CPU_TARGET:.0%} target); {mb_per_thousand:.0f} MB per 1,000 workers"
            f" (scaled from {full.workers} workers heartbeating every {full.interval_s:g}s)"
        )
    for kind, seconds in detection.items():
        seen = [s for s in seconds if s != float("inf")]
        bound_s = detection_bound_s(reconciler, full.interval_s)
        target_s = bound_s if kind == "silent" else CLOSED_DETECTION_TARGET_S
        what = (
            f"stopped heartbeating (grace {bound_s - reconciler.interval_s:g}s)"
            if kind == "silent"
            else "stream closed"
        )
        missed = (
            f", {len(seconds) - len(seen)} never seen DISCONNECTED"
            if len(seen) < len(seconds)
            else ""
        )
        spread = f"min {min(seen):.1f}s, max {max(seen):.1f}s" if seen else "none seen"
        print(
            f"  lost-worker detection, {what}: {spread} over {len(seconds)} workers{missed} "
            f"(target <= {target_s:g}s)"
        )


def _print_floor(floor: Floor, windows: list[Window]) -> None:
    full = floor.full
    if not full.workers:
        return
    gantry = per_thousand_over_idle(windows[0], windows[-1])
    print(
        f"  gRPC floor: a bare grpc.aio server receiving the same {full.workers} streams' "
        f"heartbeats: {floor.per_thousand:.1%} of a core per 1,000 workers over idle "
        f"(Gantry: {gantry:.1%})"
    )
    # No database here: what runs on the other Python threads is grpc.aio's completion-queue
    # poller, which the control plane's figures count beside aiosqlite's threads.
    names = {
        "other Python threads (aiosqlite, grpc.aio poller)": "Python threads (grpc.aio poller)"
    }
    shares = ", ".join(
        f"{names.get(kind, kind)} "
        f"{fraction - floor.idle.core_fraction_by_thread_kind.get(kind, 0.0):+.1%}"
        for kind, fraction in full.core_fraction_by_thread_kind.items()
        if fraction >= 0.001
    )
    print(
        f"  gRPC floor: bare server idle {floor.idle.core_fraction:.1%}, "
        f"{full.heartbeats_per_s:.0f} heartbeats/s, {floor.connect_s:.1f}s to connect "
        f"({floor.never_welcomed} never welcomed); by thread over its idle: {shares}"
    )


if __name__ == "__main__":
    raise SystemExit(asyncio.run(bench_fleet()))
