"""What a heartbeat's GPU reading means: what the node's row keeps of it, when it is worth a write,
and what placement charges for it. Pure: no IO, the time comes in as an argument.

A worker reports each GPU's used and total memory and every process NVML lists on it, marked
managed (it started it; a residency's envelope charges it) or external. The scheduler charges the
external processes' memory against the device's VRAM domain, beside the residencies' envelopes.

Liveness is kept in memory at every beat; the reading is written to the node's inventory (and the
node announced to the scheduler) only when it changed in a way placement or an operator would
notice: the processes or their marks, why there is no reading, or a device's used or external
memory moving by `WRITE_STEP_BYTES` or more since the last write. So the row lags the worker by
less than that step, and a fleet whose GPU memory wobbles costs no transaction per heartbeat.

That judgement runs on every heartbeat of the fleet, so it is cheap where nothing changed: a
reading equal to the one written (an idle node's, one with no GPU) is settled by one comparison
of the messages, and the written reading's shape and byte counts are worked out once, when it is
written (`Written`), not again at each heartbeat compared with it.

A worker whose stream's Welcome said so (Welcome.gpu_reading_unchanged_understood) sends
`gpus_unchanged` instead of a reading equal to the last one it sent on that stream: such a
heartbeat's reading is the last one heard on the stream (`StreamReading.reading_of`), the very
message, so its judgement is an identity check against the one made when that reading was heard,
never a comparison field by field. Saying unchanged on a stream that carried no reading yet, or
beside a reading, breaks the protocol (INVALID_ARGUMENT, naming `Heartbeat.gpus_unchanged`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from gantry.common.errors import GantryError
from gantry.controlplane.platform import convert
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg

# How far a device's used or external memory moves before the row is written again.
WRITE_STEP_BYTES = 256 << 20
# Said where no reading is kept: the worker never sent one (an older worker, or not yet).
NOT_REPORTED = "no heartbeat of this node has reported its GPUs yet"
_INVENTORY_KEY = "gpus"


def external_bytes(gpu: wg.GpuUsage) -> int:
    """The memory of the processes on `gpu` its worker did not start (those NVML lists without a
    per-process reading count nothing: there is no number to charge)."""
    return sum(
        process.used.bytes
        for process in gpu.processes
        if not process.managed and process.used.WhichOneof("value") == "bytes"
    )


def external_usage(gpus: Sequence[wg.GpuUsage]) -> list[common_pb2.ResourceClaim]:
    """One VRAM claim per device with external memory on it, by device."""
    return [
        common_pb2.ResourceClaim(kind=common_pb2.RESOURCE_KIND_VRAM, bytes=used, device=gpu.device)
        for gpu in sorted(gpus, key=lambda g: g.device)
        if (used := external_bytes(gpu)) > 0
    ]


@dataclass(frozen=True, slots=True)
class Written:
    """A reading the node's row holds, as `worth_writing` compares it (worked out once)."""

    heartbeat: wg.Heartbeat
    shape: tuple[object, ...]
    amounts: tuple[tuple[int, int], ...]  # per device: used and external bytes

    @classmethod
    def of(cls, heartbeat: wg.Heartbeat) -> Written:
        shape, amounts = _shape_and_amounts(heartbeat)
        return cls(heartbeat=heartbeat, shape=shape, amounts=amounts)


def worth_writing(written: Written | wg.Heartbeat | None, heard: wg.Heartbeat) -> bool:
    """Whether `heard`'s GPU reading differs from the one last written (None: none yet) in a way
    worth a write (see the module's docstring)."""
    if written is None:
        return True
    if isinstance(written, wg.Heartbeat):
        written = Written.of(written)
    kept = written.heartbeat
    if heard is kept:
        return False  # the written reading itself, repeated (`StreamReading`)
    if heard.gpus_unavailable == kept.gpus_unavailable and heard.gpus == kept.gpus:
        return False  # the same reading to the byte: nothing to judge
    shape, amounts = _shape_and_amounts(heard)
    if written.shape != shape:
        return True
    for (used_before, external_before), (used_now, external_now) in zip(
        written.amounts, amounts, strict=True
    ):
        if abs(used_before - used_now) >= WRITE_STEP_BYTES:
            return True
        if abs(external_before - external_now) >= WRITE_STEP_BYTES:
            return True
    return False


_UNCHANGED_FIELD = "Heartbeat.gpus_unchanged"


@dataclass(slots=True)
class StreamReading:
    """The GPU reading last heard on one worker stream, which a heartbeat saying `gpus_unchanged`
    repeats, and the last judgement that found a reading not worth writing (kept so that a
    repeated reading is settled by identity, not judged again)."""

    # The heartbeat that carried the stream's last reading (None: none heard yet).
    heard: wg.Heartbeat | None = None
    # (reading, written): `reading` was found not worth writing over `written`.
    settled: tuple[wg.Heartbeat, Written] | None = None

    def reading_of(self, heartbeat: wg.Heartbeat) -> wg.Heartbeat:
        """The heartbeat whose `gpus` and `gpus_unavailable` are `heartbeat`'s reading: itself
        (kept as the stream's last), or for `gpus_unchanged` the last one heard on the stream.
        INVALID_ARGUMENT for `gpus_unchanged` beside a reading or before any."""
        if not heartbeat.gpus_unchanged:
            self.heard = heartbeat
            return heartbeat
        if heartbeat.gpus_unavailable or len(heartbeat.gpus):
            raise GantryError(
                "INVALID_ARGUMENT",
                "a heartbeat says its GPU reading is unchanged and carries one as well",
                field=_UNCHANGED_FIELD,
            )
        if self.heard is None:
            raise GantryError(
                "INVALID_ARGUMENT",
                "a heartbeat says its GPU reading is unchanged before any reading on this stream",
                field=_UNCHANGED_FIELD,
            )
        return self.heard

    def worth_writing(self, written: Written | None, reading: wg.Heartbeat) -> bool:
        """`worth_writing(written, reading)`, settled at once for a reading already found not
        worth writing over the same `written` (both the same objects)."""
        settled = self.settled
        if settled is not None and settled[0] is reading and settled[1] is written:
            return False
        if worth_writing(written, reading):
            return True
        if written is not None:
            self.settled = (reading, written)
        return False


def _shape_and_amounts(
    heartbeat: wg.Heartbeat,
) -> tuple[tuple[object, ...], tuple[tuple[int, int], ...]]:
    """Everything of a reading but its byte counts; and per device, in the order sent, its used
    memory and its external processes' memory (`external_bytes`). One pass over the devices:
    this runs on every heartbeat whose reading is not the one written. A measurement that is
    unavailable reads 0 bytes (its oneof's other member), as `external_bytes` counts it."""
    devices = []
    amounts = []
    for gpu in heartbeat.gpus:
        total, used = gpu.total, gpu.used
        processes = []
        external = 0
        for process in gpu.processes:
            measured = process.used
            processes.append((process.pid, process.managed, measured.unavailable))
            if not process.managed:
                external += measured.bytes
        processes.sort()
        devices.append(
            (
                gpu.device,
                total.bytes,
                total.unavailable,
                used.unavailable,
                gpu.processes_unavailable,
                tuple(processes),
            )
        )
        amounts.append((used.bytes, external))
    return (heartbeat.gpus_unavailable, tuple(devices)), tuple(amounts)


def with_reading(
    inventory: Mapping[str, Any] | None, heard: wg.Heartbeat, now: dt.datetime
) -> dict[str, Any]:
    """The node's inventory JSON with `heard`'s GPU reading in place of the one it held."""
    unavailable = heard.gpus_unavailable
    if not heard.gpus and not unavailable:
        unavailable = "the worker's heartbeat carries no GPU reading (an older worker)"
    reading = cp.NodeGpus(
        gpus=heard.gpus,
        unavailable=unavailable,
        reported_at=convert.timestamp(now),
        external_usage=external_usage(heard.gpus),
    )
    return {**(inventory or {}), _INVENTORY_KEY: json_format.MessageToDict(reading)}


def stored_reading(node_id: str, inventory: Mapping[str, Any] | None) -> cp.NodeGpus:
    """The reading a node's inventory JSON keeps, or one saying there is none."""
    stored = (inventory or {}).get(_INVENTORY_KEY)
    if not stored:
        return cp.NodeGpus(node_id=node_id, unavailable=NOT_REPORTED)
    reading = json_format.ParseDict(stored, cp.NodeGpus(), ignore_unknown_fields=True)
    reading.node_id = node_id
    return reading


def frees_capacity(inventory: Mapping[str, Any] | None, heard: wg.Heartbeat) -> bool:
    """Whether `heard` has less external memory on some device than the node's row holds:
    placements refused for it are worth trying again at once."""
    after = {claim.device: claim.bytes for claim in external_usage(heard.gpus)}
    return any(
        claim.bytes > after.get(claim.device, 0) for claim in stored_external_usage(inventory)
    )


def stored_external_usage(inventory: Mapping[str, Any] | None) -> list[common_pb2.ResourceClaim]:
    """What placement charges for the node's external GPU processes, from its inventory JSON."""
    return list(stored_reading("", inventory).external_usage)
