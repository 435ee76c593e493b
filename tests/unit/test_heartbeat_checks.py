"""What the control plane checks of every heartbeat, on its cheap paths (issue 29): the protocol's
bounds skip a message too small to break any (nodes/wire_bounds.py), and a GPU reading equal to
the one written is settled at once (nodes/gpu_rules.py). Both must judge exactly as the full
walk and the full comparison do."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from gantry.common.errors import GantryError
from gantry.controlplane.nodes import wire_bounds
from gantry.controlplane.nodes.gpu_rules import WRITE_STEP_BYTES, Written, worth_writing
from gantry.controlplane.nodes.wire_bounds import check_worker_message, smallest_bound
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

GIB = 1 << 30


def refusal(message: wg.WorkerMessage) -> dict[str, str] | None:
    try:
        check_worker_message(message)
    except GantryError as error:
        return error.metadata
    return None


def test_the_smallest_bound_a_type_reaches_counts_every_type_under_it():
    assert smallest_bound(wg.GpuProcess.DESCRIPTOR) == 4096  # the default bound's entries
    assert smallest_bound(wg.GpuUsage.DESCRIPTOR) == 256  # its processes
    assert smallest_bound(wg.Heartbeat.DESCRIPTOR) == 64  # a job id, and the GPUs
    # A type that can carry bytes (an invocation's result) is always walked.
    assert smallest_bound(wg.InvokeResult.DESCRIPTOR) is None
    assert smallest_bound(wg.WorkerMessage.DESCRIPTOR) is None
    # An envelope is sized as what its oneof holds: a heartbeat's, beside its own fields (the
    # trace context's 16 entries the smallest of them).
    assert smallest_bound(wg.WorkerMessage.DESCRIPTOR, ("heartbeat",)) == 16
    assert smallest_bound(wg.WorkerMessage.DESCRIPTOR, ("invoke_result",)) is None
    # A recursive type ends the search.
    assert smallest_bound(struct_pb2.Value.DESCRIPTOR) is not None


def near_the_bounds() -> list[wg.WorkerMessage]:
    """Heartbeats with each bounded field a step under, at and over its bound."""
    messages = []
    for size in (63, 64, 65):
        messages.append(wg.WorkerMessage(heartbeat=wg.Heartbeat(active_job_ids=["j" * size])))
        messages.append(wg.WorkerMessage(node_id="n" * size, heartbeat=wg.Heartbeat()))
        messages.append(
            wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus=[wg.GpuUsage(device=0)] * size))
        )
    for size in (255, 256, 257):
        processes = [wg.GpuProcess(pid=0)] * size  # the smallest entry there is: 2 bytes
        messages.append(
            wg.WorkerMessage(
                heartbeat=wg.Heartbeat(gpus=[wg.GpuUsage(device=1, processes=processes)])
            )
        )
    for size in (4095, 4096, 4097):
        messages.append(wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus_unavailable="x" * size)))
        unlisted = wg.GpuUsage(device=0, processes_unavailable="é" * size)  # 2 bytes a character
        messages.append(wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus=[unlisted])))
    for size in (15, 16, 17):
        context = {str(index): "" for index in range(size)}  # entries of 3 or 4 bytes
        messages.append(wg.WorkerMessage(trace_context=context, heartbeat=wg.Heartbeat()))
    messages.append(wg.WorkerMessage(generation=7, heartbeat=wg.Heartbeat(resident_count=3)))
    return messages


def test_the_size_shortcut_refuses_exactly_what_the_full_walk_refuses(
    monkeypatch: pytest.MonkeyPatch,
):
    with_shortcut = [refusal(message) for message in near_the_bounds()]
    monkeypatch.setattr(wire_bounds, "smallest_bound", lambda *_: None)
    walked = [refusal(message) for message in near_the_bounds()]
    assert with_shortcut == walked
    assert sum(found is not None for found in walked) == 7  # each kind's "over" case


def test_a_field_over_its_bound_deep_in_a_gpu_reading_is_still_named():
    crowded = wg.GpuUsage(device=3, processes=[wg.GpuProcess(pid=1)] * 257)
    found = refusal(wg.WorkerMessage(heartbeat=wg.Heartbeat(gpus=[wg.GpuUsage(), crowded])))
    assert found is not None
    assert found["field"] == "WorkerMessage.heartbeat.gpus[1].processes"


def process(pid: int, used: int, *, managed: bool = False) -> wg.GpuProcess:
    return wg.GpuProcess(pid=pid, used=common_pb2.Measurement(bytes=used), managed=managed)


def reading(*used: int, pids: tuple[int, ...] = (10, 11)) -> wg.Heartbeat:
    """Eight devices, each with the processes `pids` (the first managed) using `used[i]`."""
    gpus = []
    for device in range(8):
        amount = used[device] if device < len(used) else 4 * GIB
        processes = [process(pid, amount, managed=index == 0) for index, pid in enumerate(pids)]
        gpus.append(
            wg.GpuUsage(
                device=device,
                total=common_pb2.Measurement(bytes=80 * GIB),
                used=common_pb2.Measurement(bytes=amount * len(pids)),
                processes=processes,
            )
        )
    return wg.Heartbeat(gpus=gpus)


def test_a_reading_kept_as_written_judges_as_the_heartbeat_it_came_from():
    first = reading()
    written = Written.of(first)
    heard = [
        reading(),  # the same, to the byte
        wg.Heartbeat(sent_at={"seconds": 9}, gpus=first.gpus),  # only the time differs
        reading(4 * GIB + WRITE_STEP_BYTES // 4),  # a wobble under the step
        reading(4 * GIB + WRITE_STEP_BYTES),  # a step: used and external both moved
        reading(pids=(10, 12)),  # another process
        reading(pids=(10,)),  # one gone
        wg.Heartbeat(gpus_unavailable="NVMLError_GpuIsLost: GPU is lost"),
        wg.Heartbeat(),
    ]
    expected = [False, False, False, True, True, True, True, True]
    assert [worth_writing(written, beat) for beat in heard] == expected
    assert [worth_writing(first, beat) for beat in heard] == expected
    assert worth_writing(None, first)


def test_no_reading_at_all_is_written_once_then_never_again():
    written = Written.of(wg.Heartbeat())
    assert not worth_writing(written, wg.Heartbeat(resident_count=2))
    assert worth_writing(written, reading())
