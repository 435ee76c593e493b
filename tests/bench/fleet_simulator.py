"""The fleet bench's simulated workers: many real WorkerGateway.Connect streams on one event loop.

It runs as its own process (`python -m tests.bench.fleet_simulator ADDRESS CREDENTIALS_FILE`)
so that the control plane's CPU figures never include the simulator's. Each worker is a
`ScriptedWorker` (the named fake of the worker protocol, no models): a Hello, then a heartbeat
every interval its Welcome names (or a later HeartbeatInterval, as the fleet grows), starting at
a random phase so the fleet's heartbeats spread evenly instead of arriving in one burst. By default
a heartbeat is empty; GANTRY_BENCH_FLEET_GPUS=G makes each carry what a worker agent sends: the
time, and a reading of G GPUs with 3 processes each (2 of them its own, 1 external), decided as
the worker agent decides it (gantry.worker.gpu_reading, the same function): the whole reading on
the stream's first heartbeat and whenever it changed, else `gpus_unchanged` where the Welcome
says the control plane takes it. GANTRY_BENCH_FLEET_GPU_CHANGES=F (default 0) is the chance that
a worker's reading moved since its last beat: its memory then wobbles by a few MiB, under the
control plane's write step (gpu_rules.py); 0 is a fleet whose GPUs hold still between beats
(NVML then reads the same bytes), 1 one whose readings all move at every beat.
GANTRY_BENCH_FLEET_GPU_FULL=1 sends the whole reading at every beat whatever the Welcome says: a
worker from before `gpus_unchanged` (the figure before it). Each
worker dials its own connection, as a real fleet would (a local subchannel pool, so gRPC does not
share one TCP connection among them).

Commands, one a line on stdin, each answered by one line on stdout:
  connect K          connect workers until K are connected
                       -> `connected K <seconds> failed <workers never welcomed>
                           refused <Hellos that ended without a Welcome and were tried again>`
  silence I [I ...]  stop the heartbeats of those workers, keep their streams -> `ok`
  kill I [I ...]     close those workers' streams -> `ok`
  stats              -> `heartbeats <sent> cpu <seconds of CPU this process used>
                          interval <the longest heartbeat interval a worker was told, seconds>`
  quit               close every stream and exit
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import grpc

from gantry.common.grpc_server import CHANNEL_OPTIONS
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker import gpu_reading as readings
from tests.integration.scripted_worker import ScriptedWorker

# Connects in flight at once: enough to keep the control plane busy, few enough that a Hello
# never waits out the scripted worker's 10 s Welcome timeout behind the others.
CONNECT_CONCURRENCY = 16
CONNECT_ATTEMPTS = 5
GPUS = int(os.environ.get("GANTRY_BENCH_FLEET_GPUS", "0"))
GPU_CHANGES = float(os.environ.get("GANTRY_BENCH_FLEET_GPU_CHANGES", "0"))
GPU_FULL = os.environ.get("GANTRY_BENCH_FLEET_GPU_FULL", "") == "1"
GIB = 1 << 30


def gpu_reading(gpus: int) -> list[wg.GpuUsage]:
    """`gpus` devices of 80 GiB, each with 3 processes of about 6 GiB (the first 2 managed)."""
    reading = []
    for device in range(gpus):
        processes = [
            wg.GpuProcess(
                pid=1000 + 3 * device + index,
                managed=index < 2,
                used=common_pb2.Measurement(bytes=6 * GIB + random.randrange(16 << 20)),
            )
            for index in range(3)
        ]
        used = sum(process.used.bytes for process in processes)
        reading.append(
            wg.GpuUsage(
                device=device,
                total=common_pb2.Measurement(bytes=80 * GIB),
                used=common_pb2.Measurement(bytes=used),
                processes=processes,
            )
        )
    return reading


class PacedWorker(ScriptedWorker):
    """A scripted worker that beats at the interval it was told last (Welcome, then any
    HeartbeatInterval), as a worker agent does."""

    interval_s = 0.0
    reading: readings.GpuReading | None = None  # what NVML reads now
    sent: readings.GpuReading | None = None  # the reading last sent on this stream

    def heartbeat(self, active_job_ids: Iterable[str] = ()) -> None:
        if not GPUS:
            super().heartbeat(active_job_ids)
            return
        if self.reading is None or random.random() < GPU_CHANGES:
            self.reading = readings.GpuReading.of(gpu_reading(GPUS), "")
        welcome = self.welcome
        understood = (
            not GPU_FULL and welcome is not None and welcome.gpu_reading_unchanged_understood
        )
        heartbeat = readings.heartbeat(
            self.reading,
            self.sent,
            understood=understood,
            active_job_ids=list(active_job_ids),
            resident_count=2,
        )
        heartbeat.sent_at.GetCurrentTime()
        self.send(wg.WorkerMessage(heartbeat=heartbeat))  # its outbox is unbounded: never dropped
        self.sent = self.reading

    def _handle(self, message: wg.ControlMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "welcome":
            self.interval_s = message.welcome.heartbeat_interval.ToNanoseconds() / 1e9
        elif kind == "heartbeat_interval":
            told = message.heartbeat_interval.heartbeat_interval
            self.interval_s = told.ToNanoseconds() / 1e9
        super()._handle(message)


class SimulatedWorker:
    def __init__(self, address: str, credential: str) -> None:
        self.address = address
        self.credential = credential
        self.worker = PacedWorker()
        self.channel: grpc.aio.Channel | None = None
        self.beating: asyncio.Task[None] | None = None
        self.heartbeats = 0
        self.refused_hellos = 0  # connects that ended without a Welcome, then tried again

    async def connect(self) -> None:
        """Dial until welcomed, as a worker agent does: a refused Hello is tried again."""
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            self.channel = grpc.aio.insecure_channel(
                self.address, options=[*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
            )
            await self.worker.start(self.channel, self.credential, wait=False)
            welcomed = asyncio.ensure_future(self.worker.welcomed.wait())
            ended = asyncio.ensure_future(self.worker.ended.wait())
            await asyncio.wait({welcomed, ended}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            welcomed.cancel()
            ended.cancel()
            if self.worker.welcome is not None and not self.worker.ended.is_set():
                self.beating = asyncio.create_task(self._beat())
                return
            self.refused_hellos += 1
            await self.worker.stop()
            await self.channel.close()
            self.worker = PacedWorker()
            await asyncio.sleep(random.uniform(0.5, 1.0) * attempt)
        raise RuntimeError(f"no Welcome after {CONNECT_ATTEMPTS} attempts")

    async def _beat(self) -> None:
        interval = self.worker.interval_s
        await asyncio.sleep(random.uniform(0, interval))
        while not self.worker.ended.is_set():
            self.worker.heartbeat()
            self.heartbeats += 1
            if self.worker.interval_s == interval:
                await asyncio.sleep(interval)
                continue
            # Told a longer interval: a fleet connected within one base interval would otherwise
            # keep its phases within that, and beat in bursts with silent gaps between them.
            interval = self.worker.interval_s
            await asyncio.sleep(random.uniform(0, interval))

    def silence(self) -> None:
        if self.beating is not None:
            self.beating.cancel()

    async def close(self) -> None:
        self.silence()
        await self.worker.stop()
        if self.channel is not None:
            await self.channel.close()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def serve(address: str, credentials: list[str]) -> None:
    workers = [SimulatedWorker(address, credential) for credential in credentials]
    connected = 0
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def answer(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def connect_one(worker: SimulatedWorker) -> None:
        async with gate:
            await worker.connect()

    while line := (await reader.readline()).decode().strip():
        command, *arguments = line.split()
        if command == "connect":
            target = min(int(arguments[0]), len(workers))
            started = time.perf_counter()
            outcomes = await asyncio.gather(
                *(connect_one(w) for w in workers[connected:target]), return_exceptions=True
            )
            failed = sum(isinstance(outcome, BaseException) for outcome in outcomes)
            refused = sum(w.refused_hellos for w in workers[:target])
            connected = max(connected, target)
            answer(
                f"connected {connected} {time.perf_counter() - started:.3f} failed {failed} "
                f"refused {refused}"
            )
        elif command == "silence":
            for index in arguments:
                workers[int(index)].silence()
            answer("ok")
        elif command == "kill":
            await asyncio.gather(*(workers[int(index)].close() for index in arguments))
            answer("ok")
        elif command == "stats":
            interval = max((w.worker.interval_s for w in workers[:connected]), default=0.0)
            answer(
                f"heartbeats {sum(w.heartbeats for w in workers)} cpu {_cpu_seconds():.3f} "
                f"interval {interval:g}"
            )
        elif command == "quit":
            break
        else:
            answer(f"error unknown command {command!r}")
    for worker in workers[:connected]:
        worker.silence()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            asyncio.gather(*(w.close() for w in workers[:connected]), return_exceptions=True), 30
        )


def main() -> None:
    address, credentials_file = sys.argv[1], sys.argv[2]
    credentials = json.loads(Path(credentials_file).read_text(encoding="utf-8"))
    # One connection per worker: a thousand of them need more descriptors than the usual 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    asyncio.run(serve(address, credentials))


if __name__ == "__main__":
    main()
