"""A heartbeat's GPU reading at the control plane (nodes/gpu_rules.py): what the node's row keeps,
when it is worth a write, and what the scheduler is told to charge for external processes."""

from __future__ import annotations

import datetime as dt

from gantry.controlplane.nodes.gpu_rules import (
    NOT_REPORTED,
    WRITE_STEP_BYTES,
    external_usage,
    frees_capacity,
    stored_reading,
    with_reading,
    worth_writing,
)
from gantry.controlplane.platform.announcer import scheduler_node
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

GIB = 1 << 30
NOW = dt.datetime(2026, 12, 5, 6, 0, tzinfo=dt.UTC)
VRAM = common_pb2.RESOURCE_KIND_VRAM


def process(pid: int, used: int | None, *, managed: bool = False) -> wg.GpuProcess:
    measured = (
        common_pb2.Measurement(bytes=used)
        if used is not None
        else common_pb2.Measurement(unavailable="NVML lists it but reports no per-process usage")
    )
    return wg.GpuProcess(pid=pid, used=measured, managed=managed)


def gpu(device: int, *processes: wg.GpuProcess, used: int = 0) -> wg.GpuUsage:
    return wg.GpuUsage(
        device=device,
        total=common_pb2.Measurement(bytes=24 * GIB),
        used=common_pb2.Measurement(bytes=used or sum(p.used.bytes for p in processes)),
        processes=processes,
    )


def beat(*gpus: wg.GpuUsage, unavailable: str = "") -> wg.Heartbeat:
    return wg.Heartbeat(gpus=gpus, gpus_unavailable=unavailable)


def test_only_external_processes_with_a_reading_are_charged_per_device():
    gpus = [
        gpu(1, process(10, 2 * GIB), process(11, 1 * GIB), process(12, 4 * GIB, managed=True)),
        gpu(0, process(20, 6 * GIB, managed=True), process(21, None)),
    ]
    # Device 0's only external process has no per-process number: nothing to charge there.
    assert external_usage(gpus) == [common_pb2.ResourceClaim(kind=VRAM, bytes=3 * GIB, device=1)]


def test_a_reading_is_written_when_it_changes_enough_to_matter():
    first = beat(gpu(0, process(10, 8 * GIB)))
    assert worth_writing(None, first)
    assert not worth_writing(first, beat(gpu(0, process(10, 8 * GIB))))
    # Memory wobbling under the step costs no write; a step or more does.
    assert not worth_writing(first, beat(gpu(0, process(10, 8 * GIB + WRITE_STEP_BYTES - 1))))
    assert worth_writing(first, beat(gpu(0, process(10, 8 * GIB + WRITE_STEP_BYTES))))
    # A process coming, going or changing hands is always written, whatever its size.
    assert worth_writing(first, beat(gpu(0, process(10, 8 * GIB), process(11, 1))))
    assert worth_writing(first, beat(gpu(0, process(10, 8 * GIB, managed=True))))
    assert worth_writing(first, beat(unavailable="NVMLError_GpuIsLost: GPU is lost"))


def test_the_row_keeps_the_reading_beside_the_rest_of_the_inventory():
    inventory = with_reading(
        {"adapters": ["sentence_transformers"]}, beat(gpu(0, process(10, 8 * GIB))), NOW
    )
    assert inventory["adapters"] == ["sentence_transformers"]
    reading = stored_reading("node-1", inventory)
    assert reading.node_id == "node-1" and reading.unavailable == ""
    assert reading.reported_at.ToDatetime(tzinfo=dt.UTC) == NOW
    assert [(p.pid, p.managed) for p in reading.gpus[0].processes] == [(10, False)]
    assert [(c.device, c.bytes) for c in reading.external_usage] == [(0, 8 * GIB)]


def test_no_reading_is_said_never_shown_as_no_gpu_processes():
    assert stored_reading("node-1", {}).unavailable == NOT_REPORTED
    without = stored_reading("n", with_reading({}, beat(unavailable="NVML not installed"), NOW))
    assert (list(without.gpus), without.unavailable) == ([], "NVML not installed")
    older = stored_reading("n", with_reading({}, wg.Heartbeat(), NOW))
    assert older.unavailable == "the worker's heartbeat carries no GPU reading (an older worker)"


def test_the_scheduler_is_told_the_external_usage_a_node_last_reported():
    inventory = with_reading({}, beat(gpu(0, process(10, 8 * GIB), process(11, GIB))), NOW)
    announced = scheduler_node("node-1", 3, inventory, {"node-1"})
    assert list(announced.external_usage) == [
        common_pb2.ResourceClaim(kind=VRAM, bytes=9 * GIB, device=0)
    ]
    assert list(scheduler_node("node-2", 3, {}, {"node-2"}).external_usage) == []


def test_less_external_memory_than_the_row_holds_frees_capacity():
    held = with_reading({}, beat(gpu(0, process(10, 8 * GIB)), gpu(1, process(11, GIB))), NOW)
    assert frees_capacity(held, beat(gpu(0, process(10, 8 * GIB)), gpu(1)))
    assert frees_capacity(held, beat(unavailable="NVMLError_GpuIsLost: GPU is lost"))
    assert not frees_capacity(held, beat(gpu(0, process(10, 9 * GIB)), gpu(1, process(11, GIB))))
    assert not frees_capacity({}, beat(gpu(0)))  # nothing was charged
