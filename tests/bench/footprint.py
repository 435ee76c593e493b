"""Idle footprint: `gantry controlplane`, `gantry scheduler` and `gantry worker` as the separate
processes `gantry up` starts, no model loaded, against PERFORMANCE.md's target of <= 300 MB RSS
for the three together; then the memory of a further model host (`resident_memory`): what a
second MiniLM host forked from the warm pool beside a first adds to the PSS of the server and the
hosts, against <= its weights + 50 MiB (its own PSS beside it).

The processes are started exactly as `gantry up` starts them (its `child_specs`, `migrate`,
node credential and connection wait), only without the deployment: once the worker's stream is
connected and the services have settled, each process's RSS and PSS (/proc/<pid>/smaps_rollup)
is read, and any process the worker started is listed apart (it is not the worker parent).

The reading waits for the idle services to settle: for their RSS together to differ by at most
1 MB between two readings GANTRY_BENCH_FOOTPRINT_SETTLE_S apart (default 1).
GANTRY_BENCH_FOOTPRINT=0 skips it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gantry.cli import bootstrap
from gantry.cli.connection import bearer, open_channel
from gantry.cli.health import wait_until_serving
from gantry.cli.state import StatePaths, ensure_secret, read_secret
from gantry.cli.up import UpSettings, child_specs, migrate
from gantry.common.ids import new_id
from gantry.common.tokens import OPERATOR_TOKEN, SERVICE_TOKEN, mint_token
from gantry.v1 import control_plane_pb2_grpc
from tests.bench.resident_memory import COMMAND as RESIDENT_COMMAND
from tests.bench.resident_memory import ResidentMemory, measure_further_resident, report
from tests.bench.summary import Summary
from tests.waiting import settled_sync

ENABLED = os.environ.get("GANTRY_BENCH_FOOTPRINT", "1") != "0"
SETTLE_S = float(os.environ.get("GANTRY_BENCH_FOOTPRINT_SETTLE_S", "1"))  # between two readings
SETTLE_WITHIN_MB = 1.0
SETTLE_TIMEOUT_S = 60.0
TARGET_MB = 300.0
COMMAND = "python -m tests.bench.footprint  (GANTRY_BENCH_FOOTPRINT_SETTLE_S)"
ROLES = ("scheduler", "controlplane", "worker")  # the order `gantry up` starts them in


@dataclass(frozen=True)
class Footprint:
    role: str
    pid: int
    rss_mb: float
    pss_mb: float


def _rss_of_all(processes: Mapping[str, subprocess.Popen[bytes]]) -> float:
    """The services' RSS together with whatever the worker started (its warm pool's fork server,
    which imports torch for a while after the worker connects), MB."""
    pids = [p.pid for p in processes.values()] + descendants(processes["worker"].pid)
    total = 0.0
    for pid in pids:
        try:
            total += memory_mb(pid)[0]
        except OSError:  # gone between the listing and the reading
            continue
    return total


def memory_mb(pid: int) -> tuple[float, float]:
    """RSS and PSS of one process, from /proc/<pid>/smaps_rollup (kB there)."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text(encoding="ascii").splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key] = int(rest.split()[0]) / 1024
    return values["Rss"], values["Pss"]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (the worker's children, if it started any)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return sorted(found)


def _free_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _spawn(
    argv: Sequence[str], env: Mapping[str, str] | None, log_path: Path
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
        )


def _say(line: str) -> None:
    print(f"  {line}", flush=True)


def measure_idle_footprint() -> list[Footprint]:
    """Start the three services as `gantry up` does (no model), measure them, stop them."""
    root = Path(tempfile.mkdtemp(prefix="gantry-footprint-"))
    paths = StatePaths(root)
    paths.create()
    settings = UpSettings(
        paths=paths,
        address=_free_address(),
        scheduler_address=_free_address(),
        startup_timeout_s=60.0,
        ready_timeout_s=60.0,
    )
    ensure_secret(paths.scheduler_token, lambda: mint_token(SERVICE_TOKEN, "scheduler"))
    ensure_secret(paths.operator_token, lambda: mint_token(OPERATOR_TOKEN, new_id()))
    migrate(settings)
    specs = child_specs(settings)
    metadata = bearer(read_secret(paths.operator_token, what="operator token"))
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for role, address in (
            ("scheduler", settings.scheduler_address),
            ("controlplane", settings.address),
        ):
            processes[role] = _spawn(specs[role].argv, specs[role].env, specs[role].log_path)
            wait_until_serving(address, role=role, log_path=specs[role].log_path, timeout_s=60.0)
        with open_channel(settings.address, None) as channel:
            stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
            bootstrap.ensure_node_credential(stub, metadata, paths, _say)
            worker = specs["worker"]
            processes["worker"] = _spawn(worker.argv, worker.env, worker.log_path)
            bootstrap.wait_until_connected(
                stub, metadata, paths, timeout_s=60.0, say=_say, worker_log=worker.log_path
            )
        settled_sync(
            lambda: _rss_of_all(processes),
            SETTLE_TIMEOUT_S,
            "the idle services' RSS (the worker's children's too) to hold still",
            within=SETTLE_WITHIN_MB,
            apart_s=SETTLE_S,
        )
        readings = [Footprint(role, p.pid, *memory_mb(p.pid)) for role, p in processes.items()]
        for pid in descendants(processes["worker"].pid):
            try:
                readings.append(Footprint("worker child", pid, *memory_mb(pid)))
            except OSError:
                continue  # it exited between the listing and the reading
        return readings
    finally:
        for role in reversed(ROLES):  # the order `gantry up` stops them in
            process = processes.get(role)
            if process is None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)


def bench_footprint(summary: Summary | None = None) -> int:
    if not ENABLED:
        print("Idle footprint skipped (GANTRY_BENCH_FOOTPRINT=0)")
        return 0
    print(f"Idle footprint: the three services of `gantry up`, no model; reproduce: {COMMAND}")
    readings = measure_idle_footprint()
    for reading in readings:
        print(
            f"  {reading.role:<14} pid {reading.pid:>7}   RSS {reading.rss_mb:7.1f} MB   "
            f"PSS {reading.pss_mb:7.1f} MB"
        )
    parents = [r for r in readings if r.role in ROLES]
    rss = sum(r.rss_mb for r in parents)
    pss = sum(r.pss_mb for r in parents)
    verdict = "meets" if rss <= TARGET_MB else "MISSES"
    print(
        f"  total (control plane + scheduler + worker parent): RSS {rss:.1f} MB, PSS {pss:.1f} MB "
        f"({verdict} the {TARGET_MB:.0f} MB RSS target)"
    )
    children = [r for r in readings if r.role not in ROLES]
    if summary is not None:
        pool = sum(r.rss_mb for r in children)
        summary.add(
            "idle RSS, control plane + scheduler + worker",
            f"{rss:.0f} MB",
            f"+ warm pool {pool:.0f} MB apart" if children else "no worker child",
            f"<= {TARGET_MB:.0f} MB",
            rss <= TARGET_MB,
        )
    bench_further_resident(summary)
    return 0


def bench_further_resident(summary: Summary | None = None) -> ResidentMemory:
    print(f"Memory of a further resident (device cpu); reproduce: {RESIDENT_COMMAND}")
    # Its own loop on its own thread: `make bench` calls this from inside its running loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as thread:
        memory = thread.submit(asyncio.run, measure_further_resident()).result()
    for line in report(memory):
        print(f"  {line}")
    if summary is not None:
        summary.add(
            "memory a further resident adds, MiniLM",
            f"{memory.added_mib:.0f} MiB",
            f"weights {memory.weights_mib:.0f} MiB; its own PSS {memory.further_pss_mib:.0f} MiB "
            f"(an empty forked host's {memory.empty_host_pss_mib:.0f}), mostly its third of the "
            "fork server's heap, shared",
            f"<= weights + 50 MiB ({memory.target_mib:.0f})",
            memory.met,
            "the floor: an empty forked host (the tiny fixture model) holds "
            f"{memory.empty_host_pss_mib:.0f} MiB PSS, most of it its third of the fork "
            "server's heap (the imported ML stack, shared with the server and the other host) "
            "and the pages it writes after the fork (reference counts of the objects it runs)",
        )
    return memory


if __name__ == "__main__":
    sys.exit(bench_footprint())
