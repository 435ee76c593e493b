"""Issue 29, item 3: `Heartbeat.gpus_unchanged`, decided by pure functions at both ends. The worker
says it only where the stream's control plane understands it and a reading equal to this one
went on the stream already (worker/gpu_reading.py); the control plane takes it as the last reading
heard on the stream, refuses it before any or beside one, and settles it by identity, never field
by field (nodes/gpu_rules.py, `StreamReading`)."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.nodes import gpu_rules
from gantry.controlplane.nodes.gpu_rules import WRITE_STEP_BYTES, StreamReading, Written
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.gpu_reading import GpuReading, heartbeat, says_unchanged

GIB = 1 << 30


def gpus(*external: int) -> list[wg.GpuUsage]:
    """One device per amount: a managed process of 4 GiB and an external one of that amount."""
    return [
        wg.GpuUsage(
            device=device,
            total=common_pb2.Measurement(bytes=80 * GIB),
            used=common_pb2.Measurement(bytes=4 * GIB + amount),
            processes=[
                wg.GpuProcess(pid=10, managed=True, used=common_pb2.Measurement(bytes=4 * GIB)),
                wg.GpuProcess(pid=11, used=common_pb2.Measurement(bytes=amount)),
            ],
        )
        for device, amount in enumerate(external)
    ]


def reading(*external: int, unavailable: str = "") -> GpuReading:
    return GpuReading.of(gpus(*external), unavailable)


# ---- the worker's decision ---------------------------------------------------------------------


def test_unchanged_needs_the_flag_a_reading_sent_on_the_stream_and_an_equal_one():
    now = reading(GIB, 2 * GIB)
    assert says_unchanged(now, reading(GIB, 2 * GIB), understood=True)  # equal, new messages
    assert not says_unchanged(now, reading(GIB, 2 * GIB), understood=False)  # an older CP
    assert not says_unchanged(now, None, understood=True)  # the stream's first heartbeat
    assert not says_unchanged(now, reading(GIB, 2 * GIB + 1), understood=True)  # one byte moved
    assert not says_unchanged(now, reading(GIB), understood=True)  # a GPU fewer
    none = reading(unavailable="NVML is not installed")
    assert says_unchanged(none, reading(unavailable="NVML is not installed"), understood=True)
    assert not says_unchanged(none, reading(unavailable="no GPU listed"), understood=True)
    assert not says_unchanged(reading(), none, understood=True)


def test_the_heartbeat_carries_the_reading_or_says_unchanged_never_both():
    now = reading(GIB)
    whole = heartbeat(now, None, understood=True, active_job_ids=["j"], resident_count=2)
    assert (list(whole.gpus), whole.gpus_unchanged) == (gpus(GIB), False)
    assert (list(whole.active_job_ids), whole.resident_count) == (["j"], 2)
    said = heartbeat(now, reading(GIB), understood=True, active_job_ids=["j"], resident_count=2)
    assert said.gpus_unchanged and not said.gpus and not said.gpus_unavailable
    assert (list(said.active_job_ids), said.resident_count) == (["j"], 2)
    older = heartbeat(now, reading(GIB), understood=False)
    assert list(older.gpus) == gpus(GIB) and not older.gpus_unchanged
    why = heartbeat(reading(unavailable="NVML is not installed"), None, understood=True)
    assert (why.gpus_unavailable, why.gpus_unchanged) == ("NVML is not installed", False)


# ---- the control plane's reading of it -----------------------------------------------------------


def test_unchanged_is_the_last_reading_heard_on_the_stream():
    stream = StreamReading()
    first = wg.Heartbeat(gpus=gpus(GIB))
    assert stream.reading_of(first) is first
    assert stream.reading_of(wg.Heartbeat(gpus_unchanged=True, active_job_ids=["j"])) is first
    second = wg.Heartbeat(gpus=gpus(2 * GIB))
    assert stream.reading_of(second) is second
    assert stream.reading_of(wg.Heartbeat(gpus_unchanged=True)) is second
    # A heartbeat without the flag is a reading, none included (an older worker's): kept.
    empty = wg.Heartbeat()
    assert stream.reading_of(empty) is empty
    assert stream.reading_of(wg.Heartbeat(gpus_unchanged=True)) is empty


@pytest.mark.parametrize(
    "heard, said",
    [
        pytest.param(None, wg.Heartbeat(gpus_unchanged=True), id="before-any-reading"),
        pytest.param(
            wg.Heartbeat(gpus=gpus(GIB)),
            wg.Heartbeat(gpus_unchanged=True, gpus=gpus(GIB)),
            id="beside-gpus",
        ),
        pytest.param(
            wg.Heartbeat(gpus=gpus(GIB)),
            wg.Heartbeat(gpus_unchanged=True, gpus_unavailable="NVML is not installed"),
            id="beside-why-none",
        ),
    ],
)
def test_unchanged_misused_breaks_the_protocol(heard: wg.Heartbeat | None, said: wg.Heartbeat):
    stream = StreamReading()
    if heard is not None:
        stream.reading_of(heard)
    with pytest.raises(GantryError) as refused:
        stream.reading_of(said)
    assert refused.value.reason == "INVALID_ARGUMENT"
    assert refused.value.metadata["field"] == "Heartbeat.gpus_unchanged"
    assert stream.heard is heard  # the refused heartbeat changed nothing


def test_a_repeated_reading_is_settled_by_identity_not_judged_again(
    monkeypatch: pytest.MonkeyPatch,
):
    judged: list[wg.Heartbeat] = []
    judge = gpu_rules.worth_writing

    def counted(written: Written | wg.Heartbeat | None, heard: wg.Heartbeat) -> bool:
        judged.append(heard)
        return judge(written, heard)

    monkeypatch.setattr(gpu_rules, "worth_writing", counted)
    stream = StreamReading()
    written = Written.of(wg.Heartbeat(gpus=gpus(GIB)))
    # A reading near the written one (a wobble under the step): judged once, not worth a write.
    near = stream.reading_of(wg.Heartbeat(gpus=gpus(GIB + WRITE_STEP_BYTES // 4)))
    assert not stream.worth_writing(written, near)
    assert len(judged) == 1
    for _ in range(5):
        repeated = stream.reading_of(wg.Heartbeat(gpus_unchanged=True))
        assert not stream.worth_writing(written, repeated)
    assert len(judged) == 1  # settled by identity five times
    # Another written reading (another replica's write, a new Hello): judged again, once.
    rewritten = Written.of(wg.Heartbeat(gpus=gpus(GIB)))
    assert not stream.worth_writing(rewritten, repeated)
    assert not stream.worth_writing(rewritten, repeated)
    assert len(judged) == 2
    # Nothing written yet: always worth a write (nothing is settled against no reading).
    assert stream.worth_writing(None, repeated) and stream.worth_writing(None, repeated)


def test_a_repeated_reading_judges_as_the_reading_it_repeats():
    stream = StreamReading()
    written = Written.of(wg.Heartbeat(gpus=gpus(GIB)))
    moved = stream.reading_of(wg.Heartbeat(gpus=gpus(GIB + WRITE_STEP_BYTES)))
    assert stream.worth_writing(written, moved)
    # Not written yet (the write failed, or is queued): the repeat is still worth it.
    repeated = stream.reading_of(wg.Heartbeat(gpus_unchanged=True))
    assert repeated is moved and stream.worth_writing(written, repeated)
    # Once written, the written reading itself settles at once.
    now_written = Written.of(moved)
    assert not gpu_rules.worth_writing(now_written, repeated)
    assert not stream.worth_writing(now_written, repeated)
