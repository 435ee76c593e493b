"""What a worker's heartbeat says of its GPUs (gantry.worker.gpu_usage): each process NVML lists,
marked managed or external by pid, read through the NVML seam (its named fake), and why there is
no reading where there is none, never a GPU of zero bytes."""

from __future__ import annotations

import os
import threading

from gantry.controlplane.nodes.wire_bounds import FIELD_BOUNDS
from gantry.worker.gpu_usage import (
    MAX_PROCESSES_PER_GPU,
    NESTED_PID_NAMESPACE,
    GpuUsageReader,
    classify,
    in_nested_pid_namespace,
)
from gantry.worker.nvml_readings import ListedProcess, Nvml
from tests.unit.test_probe_evidence_sources import TWO_GPUS, FakeNvml, NVMLError_LibraryNotFound

GIB = 1 << 30


def test_a_process_is_managed_only_when_its_pid_is_one_the_worker_holds():
    listed = [ListedProcess(4242, 3 * GIB), ListedProcess(999, 5 * GIB), ListedProcess(7, None)]
    processes = classify(listed, managed={4242})
    # Largest first; a listing without a per-process reading says so instead of a zero.
    assert [(p.pid, p.managed) for p in processes] == [(999, False), (4242, True), (7, False)]
    assert [p.used.bytes for p in processes[:2]] == [5 * GIB, 3 * GIB]
    assert processes[2].used.WhichOneof("value") == "unavailable"
    assert "no per-process usage" in processes[2].used.unavailable


def test_past_the_protocols_bound_the_largest_processes_are_kept():
    listed = [ListedProcess(pid, pid) for pid in range(1, MAX_PROCESSES_PER_GPU + 11)]
    processes = classify(listed, managed=())
    assert len(processes) == MAX_PROCESSES_PER_GPU
    assert min(p.used.bytes for p in processes) == 11  # the ten smallest were left out


def test_each_gpu_is_read_with_its_memory_and_processes():
    me = os.getpid()  # a host the worker holds: its pid is a root of the managed tree
    gpus = [("GPU-aaaa", 80 * GIB, 10 * GIB, [(me, 3 * GIB), (999, 5 * GIB)])]
    reader = GpuUsageReader(
        nested_pid_namespace=False,
        visible_devices=None,
        open_nvml=lambda: Nvml.open(FakeNvml(gpus)),
    )
    read, unavailable = reader.read([me])
    assert unavailable == ""
    [gpu] = read
    assert (gpu.device, gpu.total.bytes, gpu.used.bytes) == (0, 80 * GIB, 10 * GIB)
    assert [(p.pid, p.used.bytes, p.managed) for p in gpu.processes] == [
        (999, 5 * GIB, False),
        (me, 3 * GIB, True),
    ]
    # Nothing held: the same process is external.
    [gpu] = reader.read([])[0]
    assert [p.managed for p in gpu.processes] == [False, False]


def test_the_devices_are_the_ones_cuda_visible_devices_lets_the_hosts_see():
    reader = GpuUsageReader(
        nested_pid_namespace=False,
        visible_devices="1",
        open_nvml=lambda: Nvml.open(FakeNvml(TWO_GPUS)),
    )
    [gpu], _ = reader.read([])
    # cuda:0 of a host here is GPU-bbbb: the device number its VRAM domain carries.
    assert (gpu.device, gpu.used.bytes) == (0, 20 * GIB)
    assert sorted(p.pid for p in gpu.processes) == [999, 4242]


def test_without_nvml_the_reading_says_why_and_holds_no_gpu():
    opened: list[FakeNvml] = []

    def open_nvml() -> Nvml:
        opened.append(FakeNvml([], init_error=NVMLError_LibraryNotFound("NVML Shared Library")))
        return Nvml.open(opened[-1])

    reader = GpuUsageReader(nested_pid_namespace=False, visible_devices=None, open_nvml=open_nvml)
    for _ in range(2):
        assert reader.read([]) == ([], "NVMLError_LibraryNotFound: NVML Shared Library")
    assert len(opened) == 1  # opened once for the worker's life, not at every heartbeat
    hidden = GpuUsageReader(
        nested_pid_namespace=False,
        visible_devices="",
        open_nvml=lambda: Nvml.open(FakeNvml(TWO_GPUS)),
    )
    assert hidden.read([]) == ([], "CUDA_VISIBLE_DEVICES is empty")


def test_a_reading_that_fails_is_said_and_never_raises():
    def broken() -> Nvml:
        raise RuntimeError("driver went away")

    reader = GpuUsageReader(nested_pid_namespace=False, visible_devices=None, open_nvml=broken)
    assert reader.read([]) == ([], "reading the GPUs failed: RuntimeError: driver went away")


async def test_a_hung_nvml_costs_the_heartbeat_its_reading_not_the_heartbeat():
    release = threading.Event()

    class HungNvml(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            release.wait()
            return 0

    reader = GpuUsageReader(
        nested_pid_namespace=False, visible_devices=None, open_nvml=lambda: Nvml.open(HungNvml([]))
    )
    try:
        assert await reader.read_within([], timeout_s=0.05) == (
            [],
            "NVML did not answer within 0.05 s",
        )
    finally:
        release.set()
        reader.close()


def test_the_worker_never_lists_more_processes_than_the_protocol_carries():
    assert FIELD_BOUNDS["gantry.v1.GpuUsage.processes"].items == MAX_PROCESSES_PER_GPU


def test_nspid_with_more_than_one_pid_means_a_pid_namespace_of_its_own():
    assert in_nested_pid_namespace("Name:\tgantry\nNSpid:\t16144\n") is False
    assert in_nested_pid_namespace("Name:\tgantry\nNSpid:\t81234\t7\n") is True
    assert in_nested_pid_namespace("Name:\tgantry\n") is False  # before Linux 4.1: unknown


def test_in_a_pid_namespace_of_its_own_no_process_is_listed_or_charged_as_external():
    # NVML's pids are the host's: the worker's own hosts would read as external (charged twice).
    gpus = [("GPU-aaaa", 80 * GIB, 10 * GIB, [(4242, 3 * GIB), (999, 5 * GIB)])]
    reader = GpuUsageReader(
        nested_pid_namespace=True,
        visible_devices=None,
        open_nvml=lambda: Nvml.open(FakeNvml(gpus)),
    )
    [gpu], unavailable = reader.read([4242])
    assert unavailable == ""
    assert (gpu.used.bytes, list(gpu.processes)) == (10 * GIB, [])
    assert gpu.processes_unavailable == NESTED_PID_NAMESPACE
