"""What a heartbeat says of the GPUs on one stream: the reading NVML gave now, or that it is the
one last sent on that stream (`Heartbeat.gpus_unchanged`). Pure: no IO.

A GPU node's reading is the same, to the byte, from beat to beat while nothing on its GPUs
allocates or frees, and a control plane judges every reading it hears (gpu_rules.py there): the
unchanged flag spares it that for most heartbeats of an idle fleet. It is sent only where it
cannot be misread: on a stream whose Welcome said the control plane understands it
(Welcome.gpu_reading_unchanged_understood; an older one always gets the reading), and only after
a reading went on that same stream (a stream's first heartbeat always carries it; a new stream,
the same replica dialled again, starts over). A reading is remembered as sent only once it is in
the stream's outbox: one dropped there (the outbox full) was never sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gantry.v1 import worker_gateway_pb2 as wg


@dataclass(frozen=True, slots=True)
class GpuReading:
    """A heartbeat's GPU reading: each GPU as NVML read it, or why there is none."""

    gpus: tuple[wg.GpuUsage, ...]
    unavailable: str

    @classmethod
    def of(cls, gpus: Sequence[wg.GpuUsage], unavailable: str) -> GpuReading:
        return cls(gpus=tuple(gpus), unavailable=unavailable)


def says_unchanged(reading: GpuReading, last_sent: GpuReading | None, *, understood: bool) -> bool:
    """Whether a heartbeat carrying `reading` says `gpus_unchanged` instead: the stream's
    control plane understands it, a reading went on this stream already, and `reading` equals
    it (every field of every GPU)."""
    return understood and last_sent is not None and reading == last_sent


def heartbeat(
    reading: GpuReading,
    last_sent: GpuReading | None,
    *,
    understood: bool,
    active_job_ids: Sequence[str] = (),
    resident_count: int = 0,
) -> wg.Heartbeat:
    """The heartbeat (without its time) carrying `reading`, or saying it is unchanged."""
    if says_unchanged(reading, last_sent, understood=understood):
        return wg.Heartbeat(
            active_job_ids=active_job_ids, resident_count=resident_count, gpus_unchanged=True
        )
    return wg.Heartbeat(
        active_job_ids=active_job_ids,
        resident_count=resident_count,
        gpus=reading.gpus,
        gpus_unavailable=reading.unavailable,
    )
