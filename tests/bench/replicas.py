"""Issue 28's figures for control-plane replicas: the plane's CPU per Embed with one replica and
with two, and the highest Embed rate one replica sustains against a scripted instant worker.

`.venv/bin/python -m tests.bench.replicas` (GANTRY_BENCH_REPLICAS_CALLS calls a run, default
3,000; GANTRY_TEST_POSTGRES_URL names the server, default postgres@127.0.0.1:5432). What runs:

- a fresh PostgreSQL database, migrated (`migrate_database`), dropped at the end;
- a real `gantry scheduler` and real `gantry controlplane` processes on it (the chaos cluster's
  argv, at the production intervals), first one, then a second beside it;
- in this process, the worker: a `ScriptedWorker` stream to each replica, all of one generation
  (the second presents the one the first was issued, as a real worker's links do) and one set of
  residents, answering each Embed at once with an all-MiniLM-sized vector; one deployment READY
  on it through every gate;
- in a process of its own (tests/bench/replicas_load.py), the client: `client_channel` over every
  replica's address, K callers making Embed calls of one short text back to back, K = 1, 4, 16,
  64, a fixed number of calls each after a warm-up.

Each process's CPU is read from /proc/PID/stat at the start and the end of each measured run
(the warm-up excluded), so a figure per 1,000 Embeds includes the little a process does idle over
the run (heartbeats, reconciler passes), which is printed beside it. On a 2-core machine every
process shares the cores: the table prints each process's share of a core, so whichever
saturates one (the bottleneck) is seen, and the cores the machine's other processes used over
the run (/proc/stat): on a shared machine a rate is bounded by what they leave, and the CPU per
Embed, each process's own, is the steadier figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from gantry.common.auth import auth_metadata
from gantry.common.grpc_server import insecure_channel
from gantry.controlplane.platform.database import migrate_database
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2, inference_pb2_grpc
from gantry.worker.model_host.cpu_calibration import machine_busy_s
from tests.bench.summary import cpu_seconds
from tests.chaos.cluster import Cluster, Service, wait_until, write_secret
from tests.integration.pipeline_support import make_model_dir
from tests.integration.scripted_worker import ScriptedWorker
from tests.ports import free_port

POSTGRES_URL = os.environ.get(
    "GANTRY_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
CALLS = int(os.environ.get("GANTRY_BENCH_REPLICAS_CALLS", "3000"))
WARMUP = 100
RAMP = (1, 4, 16, 64)
COMPARE_AT = 16  # the concurrency whose CPU per Embed compares one replica with two
IDLE_WINDOW_S = 3.0  # how long each process's idle CPU is read before a ramp
EMBED_DIM = 384  # all-MiniLM's: what the scripted worker answers with
CAPABILITY = "replicas-bench"
PLANE = "control planes"
SCHEDULER = "scheduler"
WORKER = "worker (bench)"
CLIENT = "client"
MACHINE = "machine"  # every process of the machine, ours and other people's


@contextlib.asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    """A new database on the PostgreSQL server, migrated as `gantry migrate` does, dropped
    after (connections still open on it included)."""
    admin = await asyncpg.connect(POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://"))
    name = f"gantry_bench_{secrets.token_hex(6)}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{POSTGRES_URL.rpartition('/')[0]}/{name}"
    try:
        await migrate_database(url)
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@dataclass
class Plane(Cluster):
    """The chaos cluster's token files, health waits, gates and teardown around processes of
    this bench's own: one scheduler and control-plane replicas at the control plane's default
    intervals (a bench measures what production runs, not the chaos tests' fast fault
    detection), and no worker process (this process is the worker)."""

    credential: str = ""
    planes: list[Service] = field(default_factory=list)  # every replica, the first first
    plane_ports: list[int] = field(default_factory=list)

    def _process(self, role: str, name: str, arguments: list[str]) -> Service:
        argv = [sys.executable, "-m", "gantry.cli.main", role, *arguments]
        return Service(role=name, argv=argv, log_path=self.logs / f"{name}.log", env=self.env)

    async def add_replica(self) -> str:
        """A control plane on the database and the scheduler, serving; its address."""
        port = free_port()
        replica = self._process(
            "controlplane",
            f"controlplane-{len(self.planes) + 1}",
            [
                "--listen", f"127.0.0.1:{port}",
                "--database-url", self.database_url,
                "--scheduler", f"127.0.0.1:{self.scheduler_port}",
                "--scheduler-token-file", str(self.scheduler_token_file),
                "--bootstrap-operator-token-file", str(self.operator_token_file),
            ],
        )  # fmt: skip
        self.planes.append(replica)
        self.plane_ports.append(port)
        replica.start()
        await self.wait_serving(replica, port)
        return f"127.0.0.1:{port}"

    async def start(self) -> None:
        """The scheduler and the first replica serving (the first bootstraps the operator
        token); a node registered for the worker, and a client key."""
        self.scheduler_port = free_port()
        self.scheduler = self._process(
            "scheduler",
            "scheduler",
            [
                "--listen", f"127.0.0.1:{self.scheduler_port}",
                "--service-token-file", str(self.scheduler_token_file),
            ],
        )  # fmt: skip
        self.scheduler.start()
        await self.wait_serving(self.scheduler, self.scheduler_port)
        await self.add_replica()
        self.control_plane, self.control_plane_port = self.planes[0], self.plane_ports[0]
        self.channel = insecure_channel(self.addresses[0])
        registered = await self.operator.RegisterNode(
            cp.RegisterNodeRequest(name="scripted-worker"), metadata=self.op_md, timeout=10
        )
        self.node_id, self.credential = registered.node.node_id, registered.credential
        key = await self.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="bench", name="bench"), metadata=self.op_md, timeout=10
        )
        self.api_key = key.api_key

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.plane_ports]

    def services(self) -> list[Service]:
        return [*self.planes, *([self.scheduler] if self.scheduler is not None else [])]

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        await super().stop()

    def pids(self) -> dict[str, list[int]]:
        assert self.scheduler is not None
        return {
            PLANE: [plane.pid for plane in self.planes],
            SCHEDULER: [self.scheduler.pid],
            WORKER: [os.getpid()],
        }


@dataclass
class ScriptedStreams:
    """One worker as a real one connects: a stream to each replica, every stream of the
    generation the first Welcome issued and reporting one set of residents. Each stream is a
    `ScriptedWorker` answering Embed at once."""

    credential: str
    streams: list[ScriptedWorker] = field(default_factory=list)
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    beating: asyncio.Task[None] | None = None

    async def connect(self, address: str) -> ScriptedWorker:
        first = self.streams[0] if self.streams else None
        stream = ScriptedWorker(generation=first.generation if first else 1)
        stream.answer_invokes = True
        stream.embed_dim = EMBED_DIM
        if first is not None:
            stream.residents = first.residents  # one worker's: its Hello reports what it holds
        channel = insecure_channel(address)
        self.channels.append(channel)
        await stream.start(channel, self.credential)
        if first is not None and stream.generation != first.generation:
            raise RuntimeError(
                f"{address} issued generation {stream.generation}, not the worker's "
                f"{first.generation}: a second stream must keep the generation"
            )
        self.streams.append(stream)
        if self.beating is None:
            self.beating = asyncio.create_task(self._beat())
        return stream

    async def _beat(self) -> None:
        """Every stream heartbeats at the interval its Welcome names, as a real worker's do."""
        welcome = self.streams[0].welcome
        assert welcome is not None
        interval = welcome.heartbeat_interval.ToNanoseconds() / 1e9
        while True:
            for stream in self.streams:
                stream.heartbeat()
            await asyncio.sleep(interval)

    def answered(self) -> list[int]:
        return [len(stream.answered_invokes) for stream in self.streams]

    async def stop(self) -> None:
        if self.beating is not None:
            self.beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.beating
        for stream in self.streams:
            await stream.stop()
        for channel in self.channels:
            await channel.close()


def cpu_of(pids: Mapping[str, list[int]]) -> dict[str, float]:
    """Each role's CPU seconds so far (user + system), summed over its processes, and the
    machine's: the machine is shared, and what others used beside a run is part of its figure."""
    used = {role: sum(cpu_seconds(pid) for pid in group) for role, group in pids.items()}
    busy = machine_busy_s()  # the worker's own reading of /proc/stat (cpu_calibration.py)
    if busy is None:
        raise RuntimeError("/proc/stat is unreadable: the machine's busy time is unknown")
    return {**used, MACHINE: busy}


@dataclass(frozen=True)
class Run:
    """One measured run: the load's figures and each role's CPU seconds over it."""

    replicas: int
    concurrency: int
    figures: dict[str, Any]  # LoadResult.summary()
    cpu_s: dict[str, float]
    answered: list[int]  # calls each replica's stream answered over the run

    @property
    def all_ok(self) -> bool:
        return bool(self.figures["ok"] == self.figures["requests"] and not self.figures["errors"])

    @property
    def rate(self) -> float:
        return float(self.figures["requests_per_s"])

    def per_thousand(self, role: str) -> float:
        return self.cpu_s[role] / self.figures["requests"] * 1000

    def core_share(self, role: str) -> float:
        return self.cpu_s[role] / self.figures["elapsed_s"]

    @property
    def others_share(self) -> float:
        """Cores used by processes not of this bench over the run."""
        ours = sum(seconds for role, seconds in self.cpu_s.items() if role != MACHINE)
        return max(0.0, self.cpu_s[MACHINE] - ours) / self.figures["elapsed_s"]


class LoadProcess:
    """The client process (tests/bench/replicas_load.py), given one run at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, addresses: list[str], key_file: Path) -> LoadProcess:
        process = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "tests.bench.replicas_load"],
            *["--addresses", ",".join(addresses), "--key-file", str(key_file)],
            *["--capability", CAPABILITY],
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def run(self, concurrency: int, on_measuring: Callable[[], None]) -> dict[str, Any]:
        """One run's figures; `on_measuring` is called when its warm-up has ended."""
        assert self.process.stdin is not None and self.process.stdout is not None
        plan = {"concurrency": concurrency, "calls": CALLS, "warmup": WARMUP}
        self.process.stdin.write(json.dumps(plan).encode() + b"\n")
        await self.process.stdin.drain()
        while line := (await self.process.stdout.readline()).decode():
            if not line.startswith("{"):
                print(line, end="", flush=True)  # its progress
                continue
            event = json.loads(line)
            if event.pop("event") == "measuring":
                on_measuring()
            else:
                return dict(event)
        raise RuntimeError(f"the load process ended (status {await self.process.wait()})")

    async def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await asyncio.wait_for(self.process.wait(), timeout=30)


async def idle_cpu_per_s(pids: Mapping[str, list[int]]) -> dict[str, float]:
    """Each role's CPU share of a core with no calls, over IDLE_WINDOW_S (a measured window,
    not a wait for anything)."""
    before = cpu_of(pids)
    await asyncio.sleep(IDLE_WINDOW_S)
    after = cpu_of(pids)
    return {role: (after[role] - before[role]) / IDLE_WINDOW_S for role in after}


async def measure(
    load: LoadProcess, pids: Mapping[str, list[int]], streams: ScriptedStreams, concurrency: int
) -> Run:
    """One run of the load process, each role's CPU and each stream's answers counted from the
    end of its warm-up to its last call."""
    marks: dict[str, Any] = {}

    def measuring() -> None:
        marks["cpu"], marks["answered"] = cpu_of(pids), streams.answered()

    figures = await load.run(concurrency, measuring)
    after, answered = cpu_of(pids), streams.answered()
    return Run(
        replicas=len(streams.streams),
        concurrency=concurrency,
        figures=figures,
        cpu_s={role: after[role] - marks["cpu"][role] for role in after},
        answered=[now - then for now, then in zip(answered, marks["answered"], strict=True)],
    )


async def ramp(
    plane: Plane, streams: ScriptedStreams, addresses: list[str], key_file: Path
) -> list[Run]:
    """A run at each concurrency of RAMP, on `addresses`, each role's CPU read around it."""
    load = await LoadProcess.start(addresses, key_file)
    pids = {**plane.pids(), CLIENT: [load.process.pid]}
    runs = []
    try:
        for concurrency in RAMP:
            print(f"  {len(addresses)} replica(s), K={concurrency}: {CALLS} calls ...", flush=True)
            runs.append(await measure(load, pids, streams, concurrency))
            print(f"    {row(runs[-1])}", flush=True)
    finally:
        await load.stop()
    return runs


async def serving_on(address: str, key: str) -> None:
    """Wait until `address` alone answers an Embed: its own stream of the worker is open and
    the scheduler knows it."""
    async with insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        async def answers() -> bool:
            try:
                await stub.Embed(
                    inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=["ready?"]),
                    metadata=auth_metadata(key),
                    timeout=5,
                )
            except grpc.aio.AioRpcError:
                return False
            return True

        await wait_until(answers, timeout_s=60, what=f"{address} serving", interval_s=0.2)


HEADER = (
    f"{'replicas':>8} {'K':>3} {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'errors':>6}  "
    f"CPU s per 1,000 Embeds (share of a core): {PLANE} | {SCHEDULER} | {WORKER} | {CLIENT}"
    f"  others  answered per stream"
)


def row(run: Run) -> str:
    latency = run.figures["latency_ms"]
    errors = run.figures["requests"] - run.figures["ok"]
    cpu = " | ".join(
        f"{run.per_thousand(role):.2f} ({run.core_share(role):.0%})"
        for role in (PLANE, SCHEDULER, WORKER, CLIENT)
    )
    split = "/".join(str(n) for n in run.answered)
    return (
        f"{run.replicas:>8} {run.concurrency:>3} {run.rate:>8.0f} {latency['p50']:>7.2f} "
        f"{latency['p99']:>7.2f} {errors:>6}  {cpu}  {run.others_share:>5.0%}  {split}"
    )


def print_report(runs: list[Run], idle: dict[int, dict[str, float]]) -> None:
    print(f"\nEmbed against a scripted instant worker ({CALLS} calls a run after {WARMUP} warm-up)")
    print(HEADER)
    for run in runs:
        print(row(run))
    for replicas, shares in idle.items():
        listed = ", ".join(
            f"{'the machine, all processes' if role == MACHINE else role} {share:.1%}"
            for role, share in shares.items()
        )
        print(f"idle with {replicas} replica(s), share of a core: {listed}")
    for replicas in sorted(idle):
        mine = [run for run in runs if run.replicas == replicas]
        sustained = [run for run in mine if run.all_ok]
        best = max(sustained, key=lambda run: run.rate, default=None)
        compare = next(run for run in mine if run.concurrency == COMPARE_AT)
        peak = f"{best.rate:.0f} calls/s at K={best.concurrency}" if best else "none all OK"
        print(
            f"{replicas} replica(s): highest rate with every call OK {peak}; at K={COMPARE_AT} "
            f"the control planes spend {compare.per_thousand(PLANE):.2f} CPU s per 1,000 "
            f"Embeds (all replicas), the scheduler {compare.per_thousand(SCHEDULER):.2f}; "
            f"so the plane's own CPU bounds it at {1000 / compare.per_thousand(PLANE):.0f} "
            f"calls/s for each core its replicas are given"
        )
    print(
        f"machine: {os.cpu_count()} cores shared by every process above and by others "
        "(the 'others' column: cores they used during the run)"
    )


async def deploy(plane: Plane, streams: ScriptedStreams, base: Path) -> None:
    await streams.connect(plane.addresses[0])
    print("  worker stream open on replica 1; deploying through every gate ...", flush=True)
    deployment_id = await plane.register_and_deploy(make_model_dir(base), CAPABILITY)
    await plane.wait_ready(deployment_id, timeout_s=60)


async def bench(base: Path) -> tuple[list[Run], dict[int, dict[str, float]]]:
    async with fresh_database() as url:
        print(f"database migrated; starting the scheduler and replica 1 (logs in {base})")
        plane = Plane(database_url=url, root=base)
        streams: ScriptedStreams | None = None
        try:
            await plane.start()
            streams = ScriptedStreams(plane.credential)
            await deploy(plane, streams, base)
            key_file = write_secret(base / "client.key", plane.api_key)
            idle = {1: await idle_cpu_per_s(plane.pids())}
            runs = await ramp(plane, streams, plane.addresses, key_file)
            print("starting replica 2 and the worker's stream to it ...", flush=True)
            second = await plane.add_replica()
            await streams.connect(second)
            await serving_on(second, plane.api_key)
            idle[2] = await idle_cpu_per_s(plane.pids())
            runs += await ramp(plane, streams, plane.addresses, key_file)
            return runs, idle
        except BaseException:
            plane.print_logs_on_failure()
            raise
        finally:
            if streams is not None:
                await streams.stop()
            await plane.stop()


async def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gantry-bench-replicas-") as directory:
        runs, idle = await bench(Path(directory))
    print_report(runs, idle)
    print(f"(whole run {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
