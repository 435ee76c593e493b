"""`gantry up` as an operator runs it (`make run`), in its own processes, for a client in this one.

The serving figures of `make bench` are measured the way the issue measured them: a separate client
against the scheduler, control plane and worker processes `gantry up` starts (SQLite, one local
worker, the bundled all-MiniLM-L6-v2 deployed through every gate). The bench process then holds
only the client and the direct baseline, and each process's CPU can be read on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from gantry.common.auth import auth_metadata
from gantry.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from tests.bench.device import bench_device
from tests.bench.summary import cpu_seconds
from tests.waiting import NotInTime, poll

CAPABILITY = "minilm"  # what `gantry up` deploys (gantry/cli/bootstrap.py)
ROLES = ("scheduler", "controlplane", "worker")
READY_TIMEOUT_S = 600.0
SETTLE_TIMEOUT_S = 60.0
PROGRESS_EVERY_S = 10.0


class ServedError(Exception):
    """`gantry up` did not come up serving; the message holds its log's tail."""


@dataclass(frozen=True)
class Served:
    address: str
    client_md: tuple[tuple[str, str], ...]
    channel: grpc.aio.Channel
    pids: dict[str, int]  # role -> pid: scheduler, controlplane, worker, model-host
    log: Path
    root_pid: int  # `gantry up` itself
    http_address: str = ""  # the OpenAI-compatible HTTP API (a free port of its own)
    scheduler_address: str = ""
    state: Path | None = None  # `gantry up`'s state directory (its keys and tokens)

    @property
    def inference(self) -> inference_pb2_grpc.InferenceStub:
        return inference_pb2_grpc.InferenceStub(self.channel)


async def queue_snapshot(h: Served) -> scheduler_pb2.QueueSnapshot:
    """The scheduler's queue snapshot now (`gantry queue`'s)."""
    assert h.state is not None
    token = (h.state / "scheduler.token").read_text().strip()
    async with grpc.aio.insecure_channel(h.scheduler_address) as channel:
        return await scheduler_pb2_grpc.SchedulerStub(channel).GetQueueSnapshot(
            scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(token), timeout=10
        )


async def calls_on_credits(h: Served) -> tuple[int, int]:
    """(calls dispatched, of them on credits) so far, from the scheduler's queue snapshot: what
    share of a window's calls went without a scheduler round trip."""
    snapshot = await queue_snapshot(h)
    return snapshot.dispatched_total, snapshot.credited_total


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat_file:
                    stat = stat_file.read()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def _roles(root: int) -> dict[str, int]:
    """The services by their process titles (`gantry <role>`, `gantry model-host <id>`)."""
    pids: dict[str, int] = {}
    for pid in _descendants(root):
        title = _title(pid)
        for role in (*ROLES, "model-host"):
            if title.startswith(f"gantry {role}"):
                pids.setdefault(role, pid)
    return pids


def _group_cpu_seconds(root: int) -> float:
    total = 0.0
    for pid in (root, *_descendants(root)):
        with contextlib.suppress(OSError, ValueError):
            total += cpu_seconds(pid)
    return total


async def settle(root: int, *, idle_share: float = 0.05, window_s: float = 1.0) -> float:
    """Wait until `gantry up`'s processes (`root` and all below it) use less than `idle_share` of
    a core over two windows in a row, at most SETTLE_TIMEOUT_S; the seconds waited.

    The first answered Embed comes before `gantry up` has finished its background work (the warm
    pool's fork server importing the ML stack, the first health checks): measured over it, a
    concurrency-1 figure carries a few ms that are start-up, not serving."""
    started = time.monotonic()
    quiet = 0
    while quiet < 2 and time.monotonic() - started < SETTLE_TIMEOUT_S:
        before = _group_cpu_seconds(root)
        await asyncio.sleep(window_s)
        quiet = quiet + 1 if _group_cpu_seconds(root) - before < idle_share * window_s else 0
    return time.monotonic() - started


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.asynccontextmanager
async def gantry_up(
    base: Path,
    *,
    env: dict[str, str] | None = None,
    device: str | None = None,
    progress: Callable[[str], None] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    up_args: tuple[str, ...] = (),
    unset: tuple[str, ...] = (),
) -> AsyncIterator[Served]:
    """Start `gantry up` under `base` and yield once an Embed of the bundled model answers.

    `device`: `gantry up --device` (default: the bench's device, tests/bench/device.py), so the
    served model runs where the direct baseline does. `progress`, when given, is handed the latest
    line of `gantry up`'s log every PROGRESS_EVERY_S while it comes up, so a long first start
    (a cold disk, a slow probe) is never silent. `up_args`: more of `gantry up`'s flags.
    `unset`: variables of this process `gantry up` must not inherit (the bench's own tuning)."""
    address, scheduler_address, http_address = _free_address(), _free_address(), _free_address()
    device = device or bench_device()
    state = base / "state"
    log = base / "gantry-up.log"
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gantry.cli.main", "--state-dir", str(state),
            "--address", address, "up", "--scheduler-address", scheduler_address,
            "--http-address", http_address, "--device", device, *up_args,
            stdin=asyncio.subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
            start_new_session=True,  # its own group: the finally ends everything it started
        )  # fmt: skip
    finally:
        os.close(log_fd)  # the child holds its own copy
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            client_md = await _wait_serving(
                process,
                channel,
                state / "client.key",
                log,
                progress=progress,
                timeout_s=ready_timeout_s,
            )
            yield Served(
                address,
                client_md,
                channel,
                _roles(process.pid),
                log,
                process.pid,
                http_address,
                scheduler_address,
                state,
            )
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)  # `gantry up` stops its children in order
        try:
            await asyncio.wait_for(process.wait(), 60)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def _wait_serving(
    process: asyncio.subprocess.Process,
    channel: grpc.aio.Channel,
    key_file: Path,
    log: Path,
    *,
    progress: Callable[[str], None] | None,
    timeout_s: float,
) -> tuple[tuple[str, str], ...]:
    stub = inference_pb2_grpc.InferenceStub(channel)
    request = inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=["ready?"])
    said = time.monotonic()

    async def serving() -> tuple[tuple[str, str], ...] | None:
        nonlocal said
        if progress is not None and time.monotonic() - said >= PROGRESS_EVERY_S:
            progress(_tail(log, 1))
            said = time.monotonic()
        if process.returncode is not None:
            raise ServedError(f"`gantry up` exited with {process.returncode}:\n{_tail(log)}")
        if not key_file.exists():
            return None
        client_md = auth_metadata(key_file.read_text().strip())
        try:
            await stub.Embed(request, metadata=client_md, timeout=30)
        except grpc.aio.AioRpcError:
            return None  # not deployed yet
        return client_md

    try:
        return await poll(serving, timeout_s, "`gantry up` to serve", interval_s=0.5)
    except NotInTime:
        raise ServedError(
            f"`gantry up` did not serve within {timeout_s:g}s:\n{_tail(log)}"
        ) from None
