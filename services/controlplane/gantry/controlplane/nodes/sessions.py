"""Open worker streams: one per connected node generation, and the invocations sent over them.

Every queue here is bounded and nothing waits on a full one: a full outbox or too many pending
invocations is answered at once with QUEUE_FULL (RESOURCE_EXHAUSTED). Nothing is dropped silently.
Messages that *retire* work (a CancelInvoke, the close marker) are always admitted: each pending
invocation yields at most one cancel, so they stay within `pending_invokes_limit` extra slots and
the outbox stays bounded by `outbox_limit + pending_invokes_limit + 1`.

An invocation that streams (a GenerateStream) holds its worker's progress, in order, until its
caller takes it: at most `progress_limit` items. The reader never waits for that caller (it serves
every other call on the stream too): when a caller falls that far behind, its invocation fails
with CLIENT_TOO_SLOW and the worker is told to drop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.common.grpc_server import MESSAGE_LIMIT_BYTES
from gantry.controlplane.nodes.gpu_rules import StreamReading
from gantry.controlplane.nodes.heartbeat_pacing import StaleGrace
from gantry.controlplane.nodes.worker_log import WorkerLog
from gantry.v1 import worker_gateway_pb2 as wg

log = logging.getLogger(__name__)
# Worker-supplied text, excerpted and rate-limited per node (shared with the gateway's).
worker_log = WorkerLog(log)

DEFAULT_OUTBOX_LIMIT = 4096
DEFAULT_PENDING_INVOKES_LIMIT = 1024
# Progress items one streaming invocation holds for a caller that has not taken them yet (a
# GenerateStream's text, about one token each, while its client reads slower than the model writes).
DEFAULT_PROGRESS_LIMIT = 256
# How long an invocation dispatched to a node this replica holds no stream to waits for the
# worker's stream before it is NoStreamHere: a replica that just (re)started is dispatched to as
# soon as it links to the scheduler, and the worker dials it within a moment. Without the wait
# each such call failed at once, and a client's five retries could all meet the same replica
# (the replica chaos suite, case A: 1 call of several hundred, now and then).
STREAM_ARRIVAL_WAIT_S = 2.0

# Any registered operation's worker payload (gantry.common.operations): its type names the
# Invoke field it travels in and the result outcome that answers it.
InvokePayload: TypeAlias = Message
# What a streaming caller does with each progress item, in order (e.g. write it to its client).
OnProgress = Callable[[wg.InvokeProgress], Awaitable[None]]


class NoStreamHere(GantryError):
    """The scheduler dispatched to a node this replica holds no stream to: the worker is
    connected to another replica, or has not dialled this one yet (it just started, or is
    reconnecting). Said WORKER_UNAVAILABLE to the client, whose documented channel retries it on
    another replica; the node is not at fault, so the scheduler hears CANCELLED, never a failure
    that counts on the node's breaker (serving/inference_calls.work_outcome)."""

    def __init__(self, node_id: str) -> None:
        super().__init__(
            "WORKER_UNAVAILABLE",
            f"node {node_id} holds no stream to this control-plane replica",
            node_id=node_id,
        )


@dataclass(eq=False)
class PendingInvoke:
    """One invocation sent and not answered yet: its result and, when its caller takes progress,
    the progress received so far and not yet taken (in order, at most `progress_limit`)."""

    result: asyncio.Future[wg.InvokeResult]
    progress_limit: int = 0  # 0: the caller takes no progress
    deployment_id: str = ""  # whose residency on this node runs it (a drain counts them)
    progress: deque[wg.InvokeProgress] = field(default_factory=deque)
    _arrived: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        # The result (or a failure) ends the caller's wait for progress too.
        self.result.add_done_callback(lambda _: self._wake())

    def offer(self, item: wg.InvokeProgress) -> bool:
        """Hold one progress item for the caller; False (nothing held) when it holds its limit."""
        if len(self.progress) >= self.progress_limit:
            return False
        self.progress.append(item)
        self._wake()
        return True

    async def next_progress(self) -> wg.InvokeProgress | None:
        """The next progress item; None once the result is in and every item sent before it was
        taken (a worker sends its progress before its result, and the reader keeps that order).
        A failure (the stream lost, the backlog overflowed) is raised at once, not after the
        backlog: its caller is answered with the failure, not with more text."""
        while True:
            if self.result.done() and not self.result.cancelled() and self.result.exception():
                self.result.result()
            if self.progress:
                return self.progress.popleft()
            if self.result.done():
                return None
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)


@dataclass(frozen=True, kw_only=True)
class WorkerStreamSettings:
    """Bounds of one worker stream."""

    outbox_limit: int = DEFAULT_OUTBOX_LIMIT
    pending_invokes_limit: int = DEFAULT_PENDING_INVOKES_LIMIT


@dataclass(eq=False)
class WorkerStream:
    """One worker generation's stream. Closing it fails whatever still waits on it.

    Every method is synchronous and never blocks, so the stream's reader can resolve an invoke
    result inline, ahead of any database work queued behind it.
    """

    node_id: str
    generation: int
    outbox_limit: int = DEFAULT_OUTBOX_LIMIT
    pending_invokes_limit: int = DEFAULT_PENDING_INVOKES_LIMIT
    outbox: asyncio.Queue[wg.ControlMessage | None] = field(init=False)
    pending_invokes: dict[str, PendingInvoke] = field(init=False, default_factory=dict)
    closed: bool = False
    # Why the control plane ended the stream, when its worker broke the protocol (a message that
    # does not parse, has no known kind, or breaks a bound): the stream's status, once drained.
    refusal: GantryError | None = None
    # The GPU reading last heard on this stream: what a heartbeat saying `gpus_unchanged` means.
    gpu_reading: StreamReading = field(init=False, default_factory=StreamReading)
    # Its worker's Hello said it reads ControlMessage.batch (gantry.common.stream_batches).
    batches_understood: bool = False

    def __post_init__(self) -> None:
        # The queue's own bound is a backstop: admission below keeps `send` within outbox_limit
        # and leaves room for the cancels and the close marker (see the module docstring).
        self.outbox = asyncio.Queue(maxsize=self.outbox_limit + self.pending_invokes_limit + 1)

    @classmethod
    def open(cls, *, node_id: str, generation: int, settings: WorkerStreamSettings) -> WorkerStream:
        return cls(
            node_id=node_id,
            generation=generation,
            outbox_limit=settings.outbox_limit,
            pending_invokes_limit=settings.pending_invokes_limit,
        )

    def send(self, message: wg.ControlMessage) -> None:
        """Queue a message for the worker, or raise WORKER_UNAVAILABLE / QUEUE_FULL at once."""
        if self.closed:
            raise GantryError("WORKER_UNAVAILABLE", f"node {self.node_id} is not connected")
        if self.outbox.qsize() >= self.outbox_limit:
            raise GantryError(
                "QUEUE_FULL",
                f"the stream to node {self.node_id} holds {self.outbox_limit} unsent messages",
                node_id=self.node_id,
            )
        self.outbox.put_nowait(message)

    def begin_invoke(
        self, request_id: str, *, progress_limit: int = 0, deployment_id: str = ""
    ) -> PendingInvoke:
        """Register an invocation about to be sent; its result resolves the returned pending
        invocation, which holds up to `progress_limit` progress items for its caller."""
        if self.closed:
            raise GantryError("WORKER_UNAVAILABLE", f"node {self.node_id} is not connected")
        if len(self.pending_invokes) >= self.pending_invokes_limit:
            raise GantryError(
                "QUEUE_FULL",
                f"node {self.node_id} already has {self.pending_invokes_limit} invocations "
                "in flight",
                node_id=self.node_id,
            )
        if request_id in self.pending_invokes:
            raise GantryError("ALREADY_EXISTS", f"invocation {request_id} is already in flight")
        future: asyncio.Future[wg.InvokeResult] = asyncio.get_running_loop().create_future()
        pending = PendingInvoke(
            result=future, progress_limit=progress_limit, deployment_id=deployment_id
        )
        self.pending_invokes[request_id] = pending
        return pending

    def in_flight(self, deployment_id: str) -> int:
        """The deployment's invocations sent on this stream and not answered yet: what its
        residency on this node (a node holds at most one per deployment) still runs."""
        return sum(p.deployment_id == deployment_id for p in self.pending_invokes.values())

    def cancel_deployment_invokes(self, deployment_id: str, error: GantryError) -> int:
        """Fail the deployment's invocations still in flight with `error`, and tell the worker
        to drop them (a drain's deadline passed); how many there were."""
        ids = [r for r, p in self.pending_invokes.items() if p.deployment_id == deployment_id]
        for request_id in ids:
            self.cancel_invoke(request_id, error)
        return len(ids)

    def forget_invoke(self, request_id: str) -> None:
        self.pending_invokes.pop(request_id, None)

    def cancel_invoke(self, request_id: str, error: GantryError | None = None) -> None:
        """Forget the invocation and tell the worker to drop it (the client went away, its
        deadline passed, or it fell behind: then `error` is what its caller gets). Only an
        invocation still pending is cancelled, so each yields at most one CancelInvoke and the
        outbox stays bounded."""
        pending = self.pending_invokes.pop(request_id, None)
        if pending is None or self.closed:
            return
        if not pending.result.done():
            if error is None:
                pending.result.cancel()
            else:
                pending.result.set_exception(error)
        self.outbox.put_nowait(
            wg.ControlMessage(cancel_invoke=wg.CancelInvoke(request_id=request_id))
        )

    def resolve_invoke(self, result: wg.InvokeResult) -> bool:
        """Hand an invoke result to its waiter. Never awaits: call it inline from the reader.

        False when nobody waits any more (cancelled, timed out, or an unknown id): the late
        result is dropped, which is correct since its caller has already been answered.
        """
        pending = self.pending_invokes.pop(result.request_id, None)
        if pending is None or pending.result.done():
            log.debug("late or unknown invoke result %s from %s", result.request_id, self.node_id)
            return False
        pending.result.set_result(result)
        return True

    def progress_invoke(self, progress: wg.InvokeProgress) -> bool:
        """Hand a progress item to its waiter, in order. Never awaits: call it inline from the
        reader. A caller that holds `progress_limit` items already is too slow to be waited for:
        its invocation fails (CLIENT_TOO_SLOW) and is cancelled on the worker.

        False when nobody takes it: a late or unknown invocation (its caller was answered), or
        one whose caller asked for no progress (logged: that worker breaks the protocol).
        """
        pending = self.pending_invokes.get(progress.request_id)
        if pending is None or pending.result.done():
            log.debug("late or unknown progress %s from %s", progress.request_id, self.node_id)
            return False
        if not pending.progress_limit:
            worker_log.warning(
                self.node_id,
                "sent progress for invocation %s, which asked for none; dropped",
                progress.request_id,
            )
            return False
        if pending.offer(progress):
            return True
        self.cancel_invoke(
            progress.request_id,
            GantryError(
                "CLIENT_TOO_SLOW",
                f"the caller fell {pending.progress_limit} streamed results behind what the "
                "model produced; the call was stopped",
                limit=str(pending.progress_limit),
            ),
        )
        return False

    def refuse(self, refusal: GantryError) -> None:
        """Close the stream because its worker broke the protocol: `refusal` becomes the status
        the worker reads (the first one, if several), and whatever waits on the stream fails
        WORKER_UNAVAILABLE, as when a stream is lost."""
        if self.refusal is None:
            self.refusal = refusal
        self.close(
            GantryError("WORKER_UNAVAILABLE", f"the stream to node {self.node_id} was refused")
        )

    def close(self, error: GantryError) -> None:
        if self.closed:
            return
        self.closed = True
        self.outbox.put_nowait(None)
        pending, self.pending_invokes = self.pending_invokes, {}
        for invocation in pending.values():
            if not invocation.result.done():
                invocation.result.set_exception(error)


# The old name: gateway.py and tests constructed `WorkerSession(node_id=..., generation=...)`.
WorkerSession = WorkerStream


class WorkerHub:
    """node id -> the current stream on this replica. A newer generation replaces (and fences)
    the older one. Other replicas hold streams of their own: `replica_id` names this one's rows
    of `node_streams`, and another replica's row counts as a live stream for the staleness grace
    (`grace`, at the longest interval this replica told) after it was last refreshed."""

    def __init__(
        self,
        settings: WorkerStreamSettings | None = None,
        *,
        replica_id: str = "",
        grace: StaleGrace | None = None,
    ) -> None:
        self.settings = settings or WorkerStreamSettings()
        self.replica_id = replica_id
        self.grace = grace or StaleGrace(base_interval_s=3.0)
        # The longest heartbeat interval this replica told a stream, in base intervals
        # (heartbeat_pacing.py): another replica's fleet is about as large, and its rows are
        # refreshed as seldom as its streams beat. It never falls while this process runs.
        self.heartbeat_multiple = 1
        self._sessions: dict[str, WorkerStream] = {}
        # node id -> its turn's lock and how many hold or wait for it (`turn`).
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        # Set (and replaced) when a stream attaches: what an invocation waiting for a node's
        # stream waits on (`_arriving`).
        self._arrival: asyncio.Event | None = None

    @contextlib.asynccontextmanager
    async def turn(self, node_id: str) -> AsyncIterator[None]:
        """One at a time per node on this replica: a Hello, from its claim to its attach, and a
        stream's end, from its detach to its goodbye's commit. Without it a worker process that
        redialled at once (the same generation) could be attached and CONNECTED by its Hello
        while its old stream's goodbye, detached before that attach, was still to be written:
        the goodbye then marked the node DISCONNECTED under a live stream, and nothing moved it
        back (a fresh clone's test_self_healing reconnect, 1 run in 12 beside other load)."""
        lock, users = self._turns.get(node_id, (None, 0))
        lock = lock or asyncio.Lock()
        self._turns[node_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            _, users = self._turns[node_id]
            if users == 1:
                del self._turns[node_id]  # no entry outlives its last user
            else:
                self._turns[node_id] = (lock, users - 1)

    def turns_wanted(self, node_id: str) -> int:
        """How many hold or wait for the node's turn."""
        return self._turns.get(node_id, (None, 0))[1]

    def held_since(self, now: dt.datetime) -> dt.datetime:
        """Another replica's row refreshed since this still holds its stream."""
        return now - dt.timedelta(seconds=self.grace.seconds(self.heartbeat_multiple))

    def open_stream(self, *, node_id: str, generation: int) -> WorkerStream:
        """A stream bounded by this hub's settings (not attached yet)."""
        return WorkerStream.open(node_id=node_id, generation=generation, settings=self.settings)

    def attach(self, session: WorkerStream) -> None:
        previous = self._sessions.get(session.node_id)
        if previous is not None and previous is not session:
            previous.close(
                GantryError(
                    "STALE_GENERATION",
                    f"node {session.node_id} reconnected as generation {session.generation}",
                )
            )
        self._sessions[session.node_id] = session
        if self._arrival is not None:
            self._arrival.set()
            self._arrival = None

    async def _arriving(self, node_id: str, wait_s: float) -> WorkerStream | None:
        """The node's stream once one attaches here, waiting at most `wait_s`; None if none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while (stream := self.get(node_id)) is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            if self._arrival is None:
                self._arrival = asyncio.Event()
            arrival = self._arrival
            try:
                async with asyncio.timeout(remaining):
                    await arrival.wait()
            except TimeoutError:
                return None
        return stream

    def detach(self, session: WorkerStream) -> bool:
        """Forget the stream if it is still the current one; True when it was."""
        if self._sessions.get(session.node_id) is session:
            del self._sessions[session.node_id]
            return True
        return False

    def get(self, node_id: str) -> WorkerStream | None:
        session = self._sessions.get(node_id)
        return session if session is not None and not session.closed else None

    def close_superseded(self, generations: Mapping[str, int]) -> list[WorkerStream]:
        """Close (STALE_GENERATION, the status its worker reads) each stream here whose node the
        database gives a newer generation (`generations`: node id -> the stored one): another
        worker process took the node through another replica. The streams closed."""
        closed = []
        for node_id, stored in generations.items():
            stream = self.get(node_id)
            if stream is not None and stream.generation < stored:
                stream.refuse(
                    GantryError(
                        "STALE_GENERATION",
                        f"node {node_id} was taken over by generation {stored}",
                        node_id=node_id,
                    )
                )
                closed.append(stream)
        return closed

    def connected_node_ids(self) -> Sequence[str]:
        return [node_id for node_id, s in self._sessions.items() if not s.closed]

    def stream_count(self) -> int:
        """Streams attached here (a closing one until its goodbye): what heartbeat pacing counts,
        without a pass over them."""
        return len(self._sessions)

    def streams(self) -> list[WorkerStream]:
        """The open streams here (a copy: sending on them never changes this hub)."""
        return [s for s in self._sessions.values() if not s.closed]

    async def invoke_embed(
        self,
        *,
        node_id: str,
        request_id: str,
        deployment_id: str,
        inputs: Sequence[str],
        timeout: float,
        trace_context: Mapping[str, str],
        deadline: timestamp_pb2.Timestamp,
    ) -> wg.EmbedResult:
        """Embed `inputs` on the node (see `invoke`)."""
        result = await self.invoke(
            node_id=node_id,
            request_id=request_id,
            deployment_id=deployment_id,
            payload=wg.EmbedPayload(inputs=inputs),
            timeout=timeout,
            trace_context=trace_context,
            deadline=deadline,
        )
        return result.embed

    async def invoke_rerank(
        self,
        *,
        node_id: str,
        request_id: str,
        deployment_id: str,
        query: str,
        documents: Sequence[str],
        timeout: float,
        trace_context: Mapping[str, str],
        deadline: timestamp_pb2.Timestamp,
    ) -> wg.RerankResult:
        """Score `documents` against `query` on the node (see `invoke`); one score per document."""
        result = await self.invoke(
            node_id=node_id,
            request_id=request_id,
            deployment_id=deployment_id,
            payload=wg.RerankPayload(query=query, documents=documents),
            timeout=timeout,
            trace_context=trace_context,
            deadline=deadline,
        )
        if len(result.rerank.scores) != len(documents):
            raise GantryError(
                "INVOKE_FAILED",
                f"node {node_id} returned {len(result.rerank.scores)} scores for "
                f"{len(documents)} documents",
            )
        return result.rerank

    async def invoke(
        self,
        *,
        node_id: str,
        request_id: str,
        deployment_id: str,
        payload: InvokePayload,
        timeout: float,
        trace_context: Mapping[str, str],
        deadline: timestamp_pb2.Timestamp,
        on_progress: OnProgress | None = None,
        progress_limit: int = DEFAULT_PROGRESS_LIMIT,
        capability: str = "",
    ) -> wg.InvokeResult:
        """Send one invocation and wait for its result, at most `timeout` seconds.

        Returns a result whose outcome is the payload's kind; a failure is raised as the
        client may see it. With `on_progress`, each progress item the worker sends before its
        result is awaited with it, in order (at most `progress_limit` wait their turn). When the
        wait ends without a result (the timeout, the caller is cancelled because its client went
        away, `on_progress` failed or fell behind) the worker is told to drop the work with a
        CancelInvoke. `capability` is the deployment's, for the worker's metrics labels only.
        """
        stream = self.get(node_id)
        if stream is None:
            waited_from = asyncio.get_running_loop().time()
            stream = await self._arriving(node_id, min(timeout, STREAM_ARRIVAL_WAIT_S))
            timeout -= asyncio.get_running_loop().time() - waited_from
        if stream is None or timeout <= 0:
            raise NoStreamHere(node_id)
        invoke = wg.Invoke(
            request_id=request_id,
            deployment_id=deployment_id,
            capability=capability,
            deadline=deadline,
            timeout=_duration(timeout),
        )
        expected = _put_payload(invoke, payload)
        message = wg.ControlMessage(trace_context=trace_context, invoke=invoke)
        check_fits_stream(message)
        pending = stream.begin_invoke(
            request_id,
            progress_limit=progress_limit if on_progress is not None else 0,
            deployment_id=deployment_id,
        )
        try:
            stream.send(message)
        except GantryError:
            stream.forget_invoke(request_id)
            raise
        try:
            async with asyncio.timeout(timeout):
                if on_progress is not None:
                    while (item := await pending.next_progress()) is not None:
                        await _unless_failed(on_progress(item), pending.result)
                result = await pending.result
        except TimeoutError:
            raise GantryError(
                "DEADLINE_EXCEEDED", f"no answer from node {node_id} within {timeout:.1f}s"
            ) from None
        finally:
            # Still pending only when no result came: the worker drops the work. An answered or
            # failed invocation was forgotten already, and this does nothing.
            stream.cancel_invoke(request_id)
        return checked_result(result, expected=expected, node_id=node_id)


def _put_payload(invoke: wg.Invoke, payload: InvokePayload) -> str:
    """Set the payload in its field of `invoke` (its operation's `kind`); the result outcome
    that answers it (its `result_kind`)."""
    operation = operations.of_payload(payload)
    getattr(invoke, operation.kind).CopyFrom(payload)
    return operation.result_kind


def checked_result(result: wg.InvokeResult, *, expected: str, node_id: str) -> wg.InvokeResult:
    """The result when its outcome answers the payload sent; a failure as the client may see it,
    any other outcome INVOKE_FAILED."""
    outcome = result.WhichOneof("outcome")
    if outcome == "failure":
        raise GantryError.for_client(result.failure)
    if outcome != expected:
        raise GantryError(
            "INVOKE_FAILED", f"node {node_id} answered a {expected} invocation with {outcome!r}"
        )
    return result


async def _unless_failed(step: Awaitable[None], result: asyncio.Future[wg.InvokeResult]) -> None:
    """Await `step` (a write to a client, which waits while that client reads nothing) unless the
    invocation fails first. A caller blocked in a write would otherwise hear of its failure (its
    backlog overflowed, the stream was lost) only when its client read again or at its deadline,
    and the scheduler would count the work as running until then."""
    write = asyncio.ensure_future(step)
    try:
        await asyncio.wait((write, result), return_when=asyncio.FIRST_COMPLETED)
        if not write.done() and result.done() and not result.cancelled():
            if (failure := result.exception()) is not None:
                raise failure
        await write  # an answer that came meanwhile waits for the write before it
    finally:
        if not write.done():
            write.cancel()


# What one frame of the worker stream may carry (both ends set it as their receive limit).
WORKER_STREAM_MESSAGE_LIMIT_BYTES = MESSAGE_LIMIT_BYTES


def check_fits_stream(message: wg.ControlMessage) -> None:
    """Refuse, as the caller's error, a message the worker stream could not carry.

    An oversize frame would not fail alone: gRPC tears down the whole stream, and with it every
    other caller's work on that node. The inference front door bounds its inputs well below this;
    the check is where the Invoke is built, so no future payload can slip past it.
    """
    size = message.ByteSize()
    if size > WORKER_STREAM_MESSAGE_LIMIT_BYTES:
        raise GantryError(
            "INVALID_PAYLOAD",
            f"the request becomes a {size}-byte worker message; the stream carries at most "
            f"{WORKER_STREAM_MESSAGE_LIMIT_BYTES}",
            limit_bytes=str(WORKER_STREAM_MESSAGE_LIMIT_BYTES),
        )


def control_batch(messages: list[wg.ControlMessage]) -> wg.ControlMessage:
    """What a stream's outbox sends together, to a worker whose Hello said it reads it."""
    return wg.ControlMessage(batch=wg.ControlBatch(messages=messages))


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(max(0, int(seconds * 1e9)))
    return duration
