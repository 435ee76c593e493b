"""What each heartbeat says of the node's GPUs: memory used and total, and every process NVML
lists on each, marked managed (this worker started it) or external.

Placement charges residencies by their envelopes; a process Gantry did not start (a notebook, a
training job, another server) holds memory no envelope accounts for, so the control plane charges
the external processes' memory on its own (scheduler ledger). A process is managed when its pid is
a model host or managed server this worker holds, a probe's host, or a process under one of them
(a managed server's engine may run its GPU work in a child). Everything else NVML lists is
external, including a process another Gantry worker on the same machine runs: to this node its
memory is simply taken.

NVML names processes by their pid in the host's pid namespace: a worker in a container with its
own pid namespace cannot match its children's pids, so its own hosts would read as external and be
charged twice. There the processes are not listed: each device says why (`processes_unavailable`)
and nothing is charged as external (run the worker in the host's pid namespace to see them).

`classify` is pure; `managed_pids` reads the process tree (psutil) and `GpuUsageReader` reads NVML
on its own thread, within a deadline: a driver that hangs costs the heartbeat its GPU reading, never
the heartbeat itself (a lost heartbeat would cost the node its liveness).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import psutil

from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.nvml_readings import SOURCE, ListedProcess, Nvml
from gantry.worker.resource_domains import gpu_count

log = logging.getLogger(__name__)

# The processes one GPU's report carries at most (the protocol's bound, wire_bounds.py); past it
# the largest are kept, so what is left out is the least memory.
MAX_PROCESSES_PER_GPU = 256
# How long a heartbeat waits for its GPU reading (NVML answers in milliseconds).
READ_TIMEOUT_S = 2.0
_PROCESS_SOURCE = f"{SOURCE} nvmlDeviceGetComputeRunningProcesses"


def classify(listed: Sequence[ListedProcess], managed: Collection[int]) -> list[wg.GpuProcess]:
    """Each listed process as the heartbeat carries it, largest first (then by pid), at most
    `MAX_PROCESSES_PER_GPU`; a process listed without a per-process reading says so."""
    ordered = sorted(listed, key=lambda p: (-(p.used or 0), p.pid))[:MAX_PROCESSES_PER_GPU]
    return [
        wg.GpuProcess(
            pid=process.pid,
            used=(
                common_pb2.Measurement(bytes=process.used, source=_PROCESS_SOURCE)
                if process.used is not None
                else common_pb2.Measurement(
                    unavailable="NVML lists it but reports no per-process usage",
                    source=_PROCESS_SOURCE,
                )
            ),
            managed=process.pid in managed,
        )
        for process in ordered
    ]


NESTED_PID_NAMESPACE = (
    "this worker runs in a pid namespace of its own: NVML names processes by the host's pids, "
    "which cannot be told managed or external here, so none is listed or charged as external"
)


def in_nested_pid_namespace(proc_status: str) -> bool:
    """Whether /proc/self/status says this process has a pid in more than one namespace."""
    for line in proc_status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) > 2
    return False  # a kernel without NSpid (before 4.1): no way to tell, read as the host's


def managed_pids(roots: Iterable[int]) -> frozenset[int]:
    """The roots (the pids of the hosts this worker holds) and every process under each."""
    pids: set[int] = set()
    for root in roots:
        if root <= 0:
            continue
        pids.add(root)
        try:
            pids.update(child.pid for child in psutil.Process(root).children(recursive=True))
        except psutil.Error:
            continue  # gone meanwhile: its pid is still ours until it is reaped
    return frozenset(pids)


class GpuUsageReader:
    """One NVML for the worker's life (opened at the first reading, closed at shutdown)."""

    def __init__(
        self,
        *,
        visible_devices: str | None,
        open_nvml: Callable[[], Nvml] = Nvml.open,
        nested_pid_namespace: bool | None = None,
    ) -> None:
        self._visible = visible_devices
        self._open_nvml = open_nvml
        # None: read from /proc/self/status at the first reading.
        self._nested = nested_pid_namespace
        self._nvml: Nvml | None = None
        # Readings run on this one thread, never the loop's default executor (which a busy worker
        # may fill); close() may come from another thread meanwhile.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-usage")
        self._lock = threading.Lock()

    async def read_within(
        self, roots: Iterable[int], timeout_s: float = READ_TIMEOUT_S
    ) -> tuple[list[wg.GpuUsage], str]:
        """`read` on the reader's thread, or ([], why) once `timeout_s` passed."""
        reading = asyncio.get_running_loop().run_in_executor(self._thread, self.read, list(roots))
        try:
            return await asyncio.wait_for(reading, timeout_s)
        except TimeoutError:
            return [], f"NVML did not answer within {timeout_s:g} s"

    def read(self, roots: Iterable[int]) -> tuple[list[wg.GpuUsage], str]:
        """(each GPU a CUDA process started here sees, "") or ([], why there is no reading).
        Never raises: a reading that fails is said in the heartbeat, which still goes out (a
        lost heartbeat would cost the node its liveness)."""
        try:
            return self._read(roots)
        except Exception as exc:
            log.warning("reading the GPUs failed: %s", exc)
            return [], f"reading the GPUs failed: {type(exc).__name__}: {exc}"

    def _read(self, roots: Iterable[int]) -> tuple[list[wg.GpuUsage], str]:
        with self._lock:
            if self._nvml is None:
                self._nvml = self._open_nvml()
            if self._nested is None:
                with open("/proc/self/status", encoding="ascii", errors="replace") as status:
                    self._nested = in_nested_pid_namespace(status.read())
            nvml = self._nvml
            count, why_none = gpu_count(nvml, self._visible)
            if why_none:
                return [], why_none
            managed = managed_pids(roots)
            return [self._device(nvml, index, managed) for index in range(count)], ""

    def _device(self, nvml: Nvml, index: int, managed: frozenset[int]) -> wg.GpuUsage:
        device = f"cuda:{index}"
        total, used = nvml.device_memory(device, self._visible)
        listed, why_not = nvml.device_processes(device, self._visible)
        if self._nested and not why_not:
            listed, why_not = [], NESTED_PID_NAMESPACE
        return wg.GpuUsage(
            device=index,
            total=total,
            used=used,
            processes=classify(listed, managed),
            processes_unavailable=why_not,
        )

    def close(self) -> None:
        """Shut NVML down once no reading runs (a hung one keeps it: the process is ending)."""
        self._thread.shutdown(wait=False, cancel_futures=True)
        if not self._lock.acquire(timeout=READ_TIMEOUT_S):
            return
        try:
            if self._nvml is not None:
                self._nvml.close()
                self._nvml = None
        finally:
            self._lock.release()
