"""Worker leak bench: the RSS of a real `gantry worker` process over many load/unload cycles.

PERFORMANCE.md target: "Leaks: worker parent RSS grows <= 10 MB over 100 load/unload cycles".
An in-process scheduler and control plane (the integration harness) serve a `gantry worker`
started as its own process; each cycle deploys the tiny random BERT of tests/fixtures as a new
deployment, waits for READY, unloads it and waits for UNLOADED. Each load spawns a model host
child that imports torch, so a cycle takes seconds.

GANTRY_BENCH_LEAK_CYCLES (default 100; 0 skips) sets the measured cycles, after 3 warm-up ones.
The figure never changes the exit status; errors (a worker that dies, a load that fails) do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.waiting import NotInTime, poll, settled

if TYPE_CHECKING:
    from tests.integration.harness import Harness

CYCLES_ENV = "GANTRY_BENCH_LEAK_CYCLES"
DEFAULT_CYCLES = 100
WARMUP_CYCLES = 3
SAMPLE_EVERY = 10
TARGET_MB_PER_100 = 10.0
LOAD_TIMEOUT_S = 180.0
UNLOAD_TIMEOUT_S = 60.0
# After UNLOADED, before reading /proc, the worker finishes its bookkeeping: its RSS is read once
# two readings SETTLE_APART_S apart differ by at most SETTLE_WITHIN_KB (within SETTLE_TIMEOUT_S).
SETTLE_APART_S = 0.25
SETTLE_WITHIN_KB = 256
SETTLE_TIMEOUT_S = 30.0
COMMAND = f"{CYCLES_ENV}=100 .venv/bin/python -m tests.bench.leak  (or: make bench)"
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}
for _name, _value in WORKER_ENV.items():
    if _name != "OMP_NUM_THREADS":
        os.environ.setdefault(_name, _value)


class BenchError(Exception):
    """The bench could not measure (as opposed to a figure over target)."""


@dataclass
class Sample:
    cycle: int
    rss_kb: int
    threads: int
    fds: int
    children: int


def configured_cycles() -> int:
    raw = os.environ.get(CYCLES_ENV, str(DEFAULT_CYCLES)).strip() or str(DEFAULT_CYCLES)
    try:
        cycles = int(raw)
    except ValueError:
        raise BenchError(f"{CYCLES_ENV}={raw!r} is not an integer") from None
    if cycles < 0:
        raise BenchError(f"{CYCLES_ENV}={raw!r} is negative")
    return cycles


# -- /proc ------------------------------------------------------------------------------------


def _status_field(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{name}:"):
                return int(line.split()[1])
    raise BenchError(f"no {name} in /proc/{pid}/status")


def children_of(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command line) of each process whose parent is `pid`, or that names it as
    the model host's --parent-pid (a host that outlived or escaped its worker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline_file:
                cmdline = cmdline_file.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited while we looked
        # The command name is in parentheses and may hold spaces; the fields follow the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid or f"--parent-pid {pid} " in f"{cmdline} ":
            found.append((int(entry), fields[0], cmdline.strip()))
    return found


def model_hosts_of(pid: int) -> list[tuple[int, str, str]]:
    """The worker's children but its warm pool's fork server, which stays by design."""
    return [child for child in children_of(pid) if not child[2].startswith("gantry fork-server")]


def sample(pid: int, cycle: int) -> Sample:
    try:
        return Sample(
            cycle=cycle,
            rss_kb=_status_field(pid, "VmRSS"),
            threads=_status_field(pid, "Threads"),
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            children=len(children_of(pid)),
        )
    except FileNotFoundError:
        raise BenchError(f"the worker (pid {pid}) is gone") from None


# -- the worker process -----------------------------------------------------------------------


def start_worker(
    address: str, credential_file: Path, artifact_root: Path, log: Path
) -> subprocess.Popen[bytes]:
    gantry = Path(sys.executable).with_name("gantry")
    if not gantry.exists():
        raise BenchError(f"{gantry} not found; run `make venv` first")
    with open(log, "wb") as log_file:
        return subprocess.Popen(
            [
                str(gantry),
                "worker",
                "--control-plane",
                address,
                "--credential-file",
                str(credential_file),
                "--artifact-root",
                str(artifact_root),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **WORKER_ENV},
            start_new_session=True,  # its own process group, so the finally can end it whole
        )


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker's process group (worker and any model host), SIGKILL what stays."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)  # the leader if it hung, or a child it left
    worker.wait(timeout=5)


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no worker log)"


# -- the bench --------------------------------------------------------------------------------


async def _wait_state(h: Harness, deployment_id: str, want: int, timeout: float) -> None:
    from gantry.v1 import control_plane_pb2 as cp

    deployment = cp.Deployment()

    async def reached() -> bool:
        nonlocal deployment
        deployment = await h.deployment(deployment_id)
        if deployment.state == cp.DEPLOYMENT_STATE_FAILED and want != cp.DEPLOYMENT_STATE_FAILED:
            raise BenchError(
                f"deployment {deployment_id} FAILED: {deployment.last_failure.code} "
                f"{deployment.last_failure.message}"
            )
        return deployment.state == want

    try:
        await poll(reached, timeout, "the deployment's state", interval_s=0.1)
    except NotInTime:
        raise BenchError(
            f"deployment {deployment_id} not in state {cp.DeploymentState.Name(want)} after "
            f"{timeout:g}s; last {cp.DeploymentState.Name(deployment.state)}"
        ) from None


async def measure(cycles: int) -> int:
    from gantry.v1 import common_pb2
    from gantry.v1 import control_plane_pb2 as cp
    from tests.fixtures.tiny_model import build_tiny_sentence_transformer
    from tests.integration.harness import running_gantry

    base = Path(tempfile.mkdtemp(prefix="gantry-leak-"))
    artifacts = base / "artifacts"
    artifacts.mkdir()
    log = base / "worker.log"
    print(
        f"Gantry leak bench: real `gantry worker` process, tiny random BERT, {WARMUP_CYCLES} "
        f"warm-up + {cycles} load/unload cycles; reproduce: {COMMAND}"
    )
    model_dir = build_tiny_sentence_transformer(base / "tiny-model")
    worker: subprocess.Popen[bytes] | None = None
    ok = False
    try:
        async with running_gantry(f"sqlite+aiosqlite:///{base / 'g.db'}", artifacts) as h:
            registered = await h.operator.RegisterNode(
                cp.RegisterNodeRequest(name="leak-bench"), metadata=h.op_md
            )
            node_id = registered.node.node_id
            credential_file = base / "node.credential"
            credential_file.write_text(registered.credential + "\n")
            credential_file.chmod(0o600)
            worker = start_worker(h.address, credential_file, artifacts, log)
            pid = worker.pid

            async def connected() -> bool:
                if worker.poll() is not None:
                    raise BenchError(
                        f"the worker exited with {worker.returncode} before connecting"
                    )
                nodes = (await h.operator.ListNodes(cp.ListNodesRequest(), metadata=h.op_md)).nodes
                return any(
                    n.node_id == node_id and n.state == common_pb2.NODE_STATE_CONNECTED
                    for n in nodes
                )

            try:
                await poll(connected, 60, "the worker to connect", interval_s=0.1)
            except NotInTime:
                raise BenchError("the worker did not connect within 60s") from None

            artifact = await h.register_model(model_dir, "tiny-leak")
            loads: list[float] = []
            unloads: list[float] = []

            async def cycle() -> None:
                if worker.poll() is not None:
                    raise BenchError(f"the worker exited with {worker.returncode}")
                started = time.perf_counter()
                deployment = await h.deploy(artifact.artifact_set_id, "leak")
                await _wait_state(
                    h, deployment.deployment_id, cp.DEPLOYMENT_STATE_READY, LOAD_TIMEOUT_S
                )
                ready = time.perf_counter()
                await h.operator.UnloadDeployment(
                    cp.UnloadDeploymentRequest(deployment_id=deployment.deployment_id),
                    metadata=h.op_md,
                )
                await _wait_state(
                    h, deployment.deployment_id, cp.DEPLOYMENT_STATE_UNLOADED, UNLOAD_TIMEOUT_S
                )
                loads.append(ready - started)
                unloads.append(time.perf_counter() - ready)

            async def settle() -> float:
                """Seconds until the worker's RSS held still."""
                started = time.perf_counter()
                await settled(
                    lambda: _status_field(pid, "VmRSS"),
                    SETTLE_TIMEOUT_S,
                    "the worker's RSS to hold still after an unload",
                    within=SETTLE_WITHIN_KB,
                    apart_s=SETTLE_APART_S,
                )
                return time.perf_counter() - started

            for _ in range(WARMUP_CYCLES):
                await cycle()
            await settle()
            print("  samples (cycle: worker RSS, threads, fds, children; s/cycle since the last):")
            samples = [show(sample(pid, 0), None)]
            loads.clear()
            unloads.clear()
            measured_started = last = time.perf_counter()
            settling = 0.0
            for index in range(1, cycles + 1):
                await cycle()
                if index % SAMPLE_EVERY == 0 or index == cycles:
                    pace = (time.perf_counter() - last) / (index - samples[-1].cycle)
                    settling += await settle()
                    samples.append(show(sample(pid, index), pace))
                    last = time.perf_counter()
            elapsed = time.perf_counter() - measured_started - settling

            leftover = model_hosts_of(pid)

            def settled_hosts() -> bool:
                nonlocal leftover
                leftover = model_hosts_of(pid)
                return not leftover

            # What is still there after 10 s is reported as left over.
            with contextlib.suppress(NotInTime):
                await poll(settled_hosts, 10, "the model hosts to exit", interval_s=0.2)
            report(cycles, samples, loads, unloads, elapsed, leftover, log)
        ok = True
    except BenchError as exc:
        print(f"  error: {exc}", file=sys.stderr)
        print(f"  worker log tail ({log}):\n{log_tail(log)}", file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        print(f"  worker log tail ({log}):\n{log_tail(log)}", file=sys.stderr)
        return 1
    finally:
        if worker is not None:
            stop_worker(worker)
        if ok:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"  kept {base} for inspection", file=sys.stderr)
    return 0


def show(s: Sample, pace: float | None) -> Sample:
    per_cycle = f"  {pace:6.2f} s/cycle" if pace is not None else ""
    print(
        f"    {s.cycle:5d}: {s.rss_kb / 1024:8.1f} MB  {s.threads:3d} threads  {s.fds:4d} fds"
        f"  {s.children} children{per_cycle}",
        flush=True,
    )
    return s


def report(
    cycles: int,
    samples: list[Sample],
    loads: list[float],
    unloads: list[float],
    elapsed: float,
    leftover: list[tuple[int, str, str]],
    log: Path,
) -> None:
    before, after = samples[0], samples[-1]
    growth_mb = (after.rss_kb - before.rss_kb) / 1024
    per_cycle_kb = (after.rss_kb - before.rss_kb) / cycles
    allowed_mb = TARGET_MB_PER_100 * cycles / 100
    verdict = "PASS" if growth_mb <= allowed_mb else "OVER"
    print(f"  cycles measured: {cycles} (after {WARMUP_CYCLES} warm-up)")
    print(
        f"  worker RSS: before {before.rss_kb / 1024:.1f} MB, after {after.rss_kb / 1024:.1f} MB,"
        f" growth {growth_mb:+.2f} MB = {per_cycle_kb:+.1f} kB/cycle"
    )
    scaled = f" (scaled: <= {allowed_mb:.2f} MB over {cycles})" if cycles != 100 else ""
    print(f"  target: <= {TARGET_MB_PER_100:g} MB over 100 cycles{scaled} -> {verdict}")
    print(
        f"  time per cycle: {elapsed / cycles:.2f} s (load to READY p50 "
        f"{statistics.median(loads):.2f} s, max {max(loads):.2f} s; unload to UNLOADED p50 "
        f"{statistics.median(unloads):.2f} s, max {max(unloads):.2f} s)"
    )
    if leftover:
        print(f"  LEFTOVER children of the worker after the run ({len(leftover)}):")
        for child_pid, state, cmdline in leftover:
            print(f"    pid {child_pid} state {state}: {cmdline}")
    else:
        print("  no model host left under the worker (its warm pool's fork server stays)")
    text = log.read_text(errors="replace") if log.exists() else ""
    errors = sum(1 for line in text.splitlines() if " ERROR " in line or " CRITICAL " in line)
    tracebacks = text.count("Traceback (most recent call last)")
    if errors or tracebacks:
        print(f"  worker log: {errors} ERROR lines, {tracebacks} tracebacks")


async def bench_from_env() -> int:
    """The leak bench as `make bench` runs it: GANTRY_BENCH_LEAK_CYCLES cycles, 0 skips."""
    try:
        cycles = configured_cycles()
    except BenchError as exc:
        print(f"leak bench: {exc}", file=sys.stderr)
        return 1
    if cycles == 0:
        print(f"leak bench skipped ({CYCLES_ENV}=0)")
        return 0
    return await measure(cycles)


if __name__ == "__main__":
    sys.exit(asyncio.run(bench_from_env()))
