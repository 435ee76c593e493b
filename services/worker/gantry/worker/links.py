"""The worker's end of one stream to one control-plane replica: its target, its bounded outbox,
and whether the stream open now was welcomed.

A worker holds one link per replica it knows (control_planes.py). The agent decides what goes on
which link (agent.py); a link only queues, and drops what does not fit: the outbox is bounded so
that a replica that stops reading costs the worker a counted drop, never its memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

from gantry.common.errors import GantryError
from gantry.common.stream_batches import Batches
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.control_planes import StreamTarget
from gantry.worker.gpu_reading import GpuReading


@dataclass(eq=False)
class Link:
    """One control-plane replica's stream, dialled again (a new outbox each time) until the
    worker stops or the address leaves the resolved set."""

    target: StreamTarget
    outbox_limit: int
    outbox: asyncio.Queue[wg.WorkerMessage | None] = field(init=False)
    # Whether the stream open now has read its Welcome: what the worker may send work on.
    welcomed: bool = False
    welcomed_before: bool = False  # a later Welcome is a reconnect (the metrics say which)
    task: asyncio.Task[None] | None = None
    # Of the stream open now (gpu_reading.py): whether its Welcome said the control plane takes
    # Heartbeat.gpus_unchanged, and the GPU reading last put in its outbox (None: none yet).
    gpu_reading_understood: bool = False
    gpu_reading_sent: GpuReading | None = None
    # Of the stream open now: whether its Welcome said the control plane reads WorkerMessage.batch.
    batches_understood: bool = False

    def __post_init__(self) -> None:
        self.renew()

    @property
    def name(self) -> str:
        return self.target.address

    def renew(self) -> None:
        """A fresh outbox for a new stream: what queued while no stream was open is not sent
        (job results are resent from the unacknowledged set; inventory goes whole in Hello)."""
        # One slot more than the limit, kept for the end-of-stream marker.
        self.outbox = asyncio.Queue(maxsize=self.outbox_limit + 1)
        # A new stream: its control plane has heard no reading, nor said what it understands.
        self.gpu_reading_understood = False
        self.gpu_reading_sent = None
        self.batches_understood = False

    def full(self) -> bool:
        return self.outbox.qsize() >= self.outbox_limit

    def put(self, message: wg.WorkerMessage) -> None:
        """Queue a message the caller checked fits (`full`)."""
        self.outbox.put_nowait(message)

    def end(self) -> None:
        """The stream is ending: its sender stops (a late message stays in the old outbox)."""
        with contextlib.suppress(asyncio.QueueFull):
            self.outbox.put_nowait(None)

    async def outgoing(self) -> AsyncIterator[wg.WorkerMessage]:
        """The outbox in order; what waits in it goes as one WorkerBatch once the stream's Welcome
        said its control plane reads that (never the Hello: it goes before any Welcome)."""
        batches = Batches(self.outbox, wrap=_worker_batch, allowed=lambda: self.batches_understood)
        while (message := await batches.next()) is not None:
            yield message


def _worker_batch(messages: list[wg.WorkerMessage]) -> wg.WorkerMessage:
    # The envelope carries the first message's stamp; each message keeps its own.
    first = messages[0]
    return wg.WorkerMessage(
        node_id=first.node_id,
        generation=first.generation,
        batch=wg.WorkerBatch(messages=messages),
    )


def unbatched(message: wg.ControlMessage) -> Sequence[wg.ControlMessage]:
    """The messages a stream message carries: a ControlBatch's, in order, or itself. A batch
    holding a batch or a Welcome breaks the protocol (INVALID_ARGUMENT: the stream ends)."""
    if message.WhichOneof("kind") != "batch":
        return (message,)
    for inner in message.batch.messages:
        if (kind := inner.WhichOneof("kind")) in ("batch", "welcome"):
            raise GantryError("INVALID_ARGUMENT", f"a control message batch holds a {kind}")
    return message.batch.messages


def first_welcomed(links: Iterable[Link]) -> Link | None:
    """The first link, in the configured order, whose stream is welcomed now."""
    return next((link for link in links if link.welcomed), None)
