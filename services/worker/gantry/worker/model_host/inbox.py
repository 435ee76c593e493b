"""The child's side of the pipe: a reader thread that answers pings and a bounded inbox of work.

The reader thread never runs the model, so it answers `Ping` even while the main thread is in a
long forward pass: a missed ping therefore means the process itself is stuck (or stopped), not
busy. It also records `CancelRequest`s and refuses work past the inbox bound with QUEUE_FULL.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from google.protobuf.message import DecodeError

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2
from gantry.worker.model_host.framing import FrameError, read_frame, write_frames
from gantry.worker.model_host.proc_facts import rss_bytes_of

logger = logging.getLogger("gantry.model_host")

DEFAULT_INBOX_LIMIT = 256
# Work kinds count against the inbox bound: every inference operation's (the registry's kinds)
# and the checks that run the model; control frames (shutdown) never are refused.
WORK_KINDS = operations.KINDS | {"health", "probe_check"}

# After the channel closes nobody can receive an answer; if the main thread is stuck in a forward
# pass this long, the reader thread ends the process itself.
CHANNEL_CLOSED_GRACE_S = 5.0
EXIT_CHANNEL_CLOSED = 3


class ResponseWriter:
    """Both threads answer on one pipe: a lock keeps their frames from interleaving."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, response: model_host_pb2.HostResponse) -> None:
        self.send_all([response])

    def send_all(self, responses: Sequence[model_host_pb2.HostResponse]) -> None:
        """Answer several requests in one write (a forward pass's answers): one system call and
        one wake of the worker's reader, not one per request."""
        # A broken pipe means the parent is gone; the main loop ends on CHANNEL_CLOSED.
        try:
            with self._lock:
                write_frames(self._stream, responses)
        except OSError as exc:
            ids = ", ".join(str(response.request_id) for response in responses)
            logger.error("cannot answer request(s) %s: %s", ids, exc)

    def fail(self, request: model_host_pb2.HostRequest, error: GantryError) -> None:
        self.send(
            model_host_pb2.HostResponse(request_id=request.request_id, failure=error.to_failure())
        )


class ChannelClosed:
    """Queued by the reader thread when the parent's end of the pipe is gone."""


CHANNEL_CLOSED = ChannelClosed()


@dataclass(frozen=True, slots=True)
class Queued:
    request: model_host_pb2.HostRequest
    # Monotonic time past which the request is answered DEADLINE_EXCEEDED instead of run.
    expires_at: float | None

    @property
    def kind(self) -> str | None:
        return self.request.WhichOneof("kind")

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


InboxItem = Queued | ChannelClosed


class Woken:
    """Queued by `Inbox.wake`: it ends a `get_or_woken` wait; every other `get` passes over it."""


WOKEN = Woken()


# Control frames (pings, cancels) waiting beside the work: a flood past this is refused.
CONTROL_FRAME_LIMIT = 1024


class Inbox:
    """Frames for the main thread. Work is bounded; cancelled work is dropped when taken."""

    def __init__(self, *, limit: int = DEFAULT_INBOX_LIMIT) -> None:
        # Work is bounded by `limit`; control frames (pings, cancels) by the rest, and the one
        # close marker always has room.
        self._queue: queue.Queue[InboxItem | Woken] = queue.Queue(
            maxsize=limit + CONTROL_FRAME_LIMIT + 1
        )
        self._limit = limit
        self._lock = threading.Lock()
        self._queued_work = 0
        # Cancels for requests that already ran would pile up forever: keep a bounded recent set.
        self._cancelled: collections.OrderedDict[int, None] = collections.OrderedDict()

    def offer(self, item: Queued) -> bool:
        """Queue `item`; False (and nothing queued) when it is work and the inbox is full."""
        if item.kind in WORK_KINDS:
            with self._lock:
                if self._queued_work >= self._limit:
                    return False
                self._queued_work += 1
        elif self._queue.qsize() >= self._limit + CONTROL_FRAME_LIMIT:
            return False  # keep room for the close marker
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            if item.kind in WORK_KINDS:
                with self._lock:
                    self._queued_work -= 1
            return False
        return True

    def close(self) -> None:
        self._queue.put(CHANNEL_CLOSED)

    def get(self, timeout: float | None = None) -> InboxItem:
        """Block for the next frame (queue.Empty after `timeout`; 0 means do not wait); a
        `wake` nobody waited for is passed over."""
        while True:
            item = self._queue.get_nowait() if timeout == 0 else self._queue.get(timeout=timeout)
            if not isinstance(item, Woken):
                return self._taken(item)

    def get_or_woken(self) -> InboxItem | Woken:
        """Block for the next frame or the next `wake`, whichever comes first (a wake that came
        while nobody waited returns at once: the caller checks again what it waits for)."""
        item = self._queue.get()
        return item if isinstance(item, Woken) else self._taken(item)

    def wake(self) -> None:
        """End a `get_or_woken` wait from another thread (a pass lane whose batch ended)."""
        with contextlib.suppress(queue.Full):  # a full queue wakes its waiter by itself
            self._queue.put_nowait(WOKEN)

    def _taken(self, item: InboxItem) -> InboxItem:
        if isinstance(item, Queued) and item.kind in WORK_KINDS:
            with self._lock:
                self._queued_work -= 1
        return item

    def cancel(self, request_id: int) -> None:
        with self._lock:
            self._cancelled[request_id] = None
            while len(self._cancelled) > 4 * self._limit:
                self._cancelled.popitem(last=False)

    def take_cancelled(self, request_id: int) -> bool:
        with self._lock:
            if request_id not in self._cancelled:
                return False
            del self._cancelled[request_id]
            return True


def read_requests(
    stream: BinaryIO, inbox: Inbox, responses: ResponseWriter, done: threading.Event
) -> None:
    """Reader thread body: frames to the inbox until EOF or a broken frame, then CHANNEL_CLOSED."""
    try:
        while (payload := read_frame(stream)) is not None:
            request = model_host_pb2.HostRequest.FromString(payload)
            _route(request, inbox, responses)
    except (FrameError, DecodeError, OSError) as exc:
        logger.error("model host channel broken: %s", exc)
    inbox.close()
    if not done.wait(timeout=CHANNEL_CLOSED_GRACE_S):
        logger.error("channel closed while a forward pass was still running; exiting")
        os._exit(EXIT_CHANNEL_CLOSED)


def _route(request: model_host_pb2.HostRequest, inbox: Inbox, responses: ResponseWriter) -> None:
    kind = request.WhichOneof("kind")
    if kind == "ping":
        pong = model_host_pb2.Pong(rss_bytes=rss_bytes_of() or 0)
        responses.send(model_host_pb2.HostResponse(request_id=request.request_id, pong=pong))
        return
    if kind == "cancel":
        inbox.cancel(request.cancel.request_id)
        return
    # The timeout counts from now: the parent's clock and ours need not agree.
    expires_at = time.monotonic() + request.timeout_ms / 1000 if request.timeout_ms else None
    if not inbox.offer(Queued(request, expires_at)):
        responses.fail(
            request, GantryError("QUEUE_FULL", "the model host's inbox is full; try again later")
        )
