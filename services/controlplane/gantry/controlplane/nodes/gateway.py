"""WorkerGateway.Connect: the control plane's end of each worker's outbound stream.

Every message is first checked against the protocol's size bounds (wire_bounds.py): one past them
ends the stream INVALID_ARGUMENT (as does one that does not parse or has no kind the stream takes),
and nothing of it is logged, stored or kept; what is logged of a worker's text
is an excerpt, rate-limited per node (worker_log.py). Hello binds the stream to one node
generation, issued here, never chosen by the worker: the generation the Hello presents is kept
only when it is the node's current one (the same process reconnecting), else the next is issued
(`claim_generation`, one conditional UPDATE). The newest Hello wins: the stream it replaces is
closed with STALE_GENERATION, and that worker dials again and wins in turn; no value a credential
holder sends can lock the real worker out. Anything stamped with another generation is rejected
and nothing from it is committed. A replica whose `last_seen_at` flush finds a node's generation
moved past its stream's (another worker process took the node through another replica) closes
that stream STALE_GENERATION (`WorkerHub.close_superseded`).

A worker holds a stream to every replica; they share the database, not their streams. Each
replica writes a `node_streams` row for each stream it holds (at Hello, refreshed with its
`last_seen_at` flush, deleted at the goodbye): a stream's end marks its node DISCONNECTED only when
no other replica's row of the node's generation is fresh (heard within the staleness grace).

Invoke results and progress are handed over inline by the reader; everything else (heartbeats,
job results, inventory) goes through a bounded per-stream queue to one writer task, in the order
sent, so a slow write never delays an invoke result behind it. Results are committed
idempotently and acknowledged. A heartbeat refreshes the stream's liveness in memory (liveness.py;
the reconciler flushes `last_seen_at` in batches) and writes the database only to renew the leases
of the jobs it names, or to keep its GPU reading when that changed enough to matter (gpu_rules.py:
the node is then announced to the scheduler, which charges its external GPU processes). Any
other message of the stream's generation counts as heard too. The Welcome says this control plane
takes `Heartbeat.gpus_unchanged`: a worker then sends it instead of a GPU reading equal to the one
it last sent on the stream, and the reader takes that heartbeat as the stream's last reading
(gpu_rules.StreamReading); one saying so before any reading, or beside one, is refused as a
message past its bounds is (a Reject naming the field, then the stream closes INVALID_ARGUMENT).

How often a worker heartbeats is the Welcome's to say, per stream: heartbeat_pacing.py grows the
interval with the streams this replica holds, so their heartbeats stay under a bound however large
the fleet; when the fleet grows past a step, every stream told less hears the longer interval
(HeartbeatInterval), and its staleness grace grows with it (liveness.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from google.protobuf import json_format
from sqlalchemy.ext.asyncio import AsyncSession

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.common.stream_batches import Batches
from gantry.controlplane.deployments.lifecycle import DeploymentLifecycle
from gantry.controlplane.deployments.settle import settle_node_deployments
from gantry.controlplane.jobs import store as jobs
from gantry.controlplane.jobs.handlers import jobs_requeued
from gantry.controlplane.nodes import gpu_rules, inventory_rules
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.goodbyes import Goodbyes, settle_ends
from gantry.controlplane.nodes.handshake import check_hello, interval, node_inventory, welcome
from gantry.controlplane.nodes.heartbeat_pacing import (
    DEFAULT_MAX_HEARTBEATS_PER_S,
    HeartbeatPacing,
)
from gantry.controlplane.nodes.inventory import Reconciled
from gantry.controlplane.nodes.liveness import Liveness
from gantry.controlplane.nodes.sessions import WorkerHub, WorkerStream, control_batch
from gantry.controlplane.nodes.stream_refusals import refuse_stamp, reject, unexpected_kind
from gantry.controlplane.nodes.wire_bounds import check_batch, check_worker_message
from gantry.controlplane.nodes.worker_log import WorkerLog
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import (
    CapacityFreed,
    NodeChanged,
    ReconcileWanted,
    ResidenciesChanged,
    record,
)
from gantry.controlplane.platform.transitions import retry_on_conflict
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.v1 import worker_gateway_pb2_grpc

log = logging.getLogger(__name__)
# Anything a worker supplied (ids, progress, failure text) is logged through this: excerpts only,
# rate-limited per node (worker_log.py).
worker_log = WorkerLog(log)

# How long a closing stream's writer may take to finish the writes already queued.
_WRITER_DRAIN_S = 5.0
# On a stream's write queue: run a pump pass for its node (after the Welcome is sent).
_DISPATCH = wg.WorkerMessage()


@dataclass(frozen=True, slots=True)
class _Beat:
    """A heartbeat on a stream's write queue, with the heartbeat that carries its GPU reading:
    itself, or the stream's last reading when it says `gpus_unchanged` (the reader resolves it
    in the order the stream sent them; the writer may handle it later)."""

    heartbeat: wg.Heartbeat
    reading: wg.Heartbeat


_Write = wg.WorkerMessage | _Beat


def _kind_of(message: _Write) -> str | None:
    return "heartbeat" if isinstance(message, _Beat) else message.WhichOneof("kind")


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    # The base interval: what a replica holding few streams tells each (heartbeat_pacing.py).
    heartbeat_interval_s: float = 3.0
    # Heartbeats per second this replica takes from its whole fleet before the interval grows.
    max_heartbeats_per_s: float = DEFAULT_MAX_HEARTBEATS_PER_S
    # Database work waiting per stream; past it the stream is closed (the worker reconnects and
    # resends what was not acknowledged) rather than holding an unbounded backlog.
    write_queue_limit: int = 1024


class WorkerGatewayService(worker_gateway_pb2_grpc.WorkerGatewayServicer):
    def __init__(
        self,
        *,
        database: Database,
        hub: WorkerHub,
        lifecycle: DeploymentLifecycle,
        clock: Clock,
        settings: GatewaySettings,
        liveness: Liveness,
    ) -> None:
        self._database = database
        self._liveness = liveness  # shared with the reconciler, which decides staleness from it
        self._hub = hub
        self._lifecycle = lifecycle
        self._clock = clock
        self._settings = settings
        self._endings: set[asyncio.Task[None]] = set()
        # Streams that end together are written together (a fleet that drops at once).
        self.goodbyes = Goodbyes(database, clock, functools.partial(settle_ends, hub))
        # node id -> the GPU reading its row holds, as gpu_rules.worth_writing compares it.
        self._gpus_written: dict[str, gpu_rules.Written] = {}
        # How often each stream here is told to beat; a test may bound it lower.
        self.pacing = HeartbeatPacing(
            base_interval_s=settings.heartbeat_interval_s,
            max_per_s=settings.max_heartbeats_per_s,
        )
        # The multiple of the base interval the last Hello was told: a Hello told more means
        # the fleet here crossed a step, and every stream told less hears the new interval.
        self._paced_multiple = 1

    async def Connect(
        self,
        request_iterator: AsyncIterator[wg.WorkerMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[wg.ControlMessage]:
        node_id = current_principal().subject
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        check_hello(first, node_id)
        async with self._hub.turn(node_id):  # after an old stream's goodbye, never beside it
            stream, welcome = await self._hello(node_id, first.generation, first.hello)
            stream.batches_understood = first.hello.control_batches_understood
            self._hub.attach(stream)
        metrics.worker_stream("connected")
        served = self._serve(stream, welcome, first.generation, request_iterator)
        async for message in served:
            yield message
        if stream.refusal is not None:
            # The worker broke the protocol: the status says how (the interceptor maps it).
            raise stream.refusal
        if (holder := self._hub.get(node_id)) is not None and holder is not stream:
            # Another Hello with this node's credential took the node over (the newest wins):
            # said as the stream's status, so this worker knows it was not a network fault.
            raise GantryError(
                "STALE_GENERATION",
                f"node {node_id} was taken over by generation {holder.generation}: another "
                "stream presented this node's credential",
                node_id=node_id,
            )

    async def _serve(
        self,
        stream: WorkerStream,
        welcome: wg.Welcome,
        presented: int,
        request_iterator: AsyncIterator[wg.WorkerMessage],
    ) -> AsyncIterator[wg.ControlMessage]:
        """The Welcome, then what the stream's outbox holds until it closes."""
        node_id = stream.node_id
        writes: asyncio.Queue[_Write | None] = asyncio.Queue(
            maxsize=self._settings.write_queue_limit + 2  # + the first dispatch and the end marker
        )
        reader: asyncio.Task[None] | None = None
        writer: asyncio.Task[None] | None = None
        try:
            yield wg.ControlMessage(welcome=welcome)
            writer = asyncio.create_task(self._write(stream, writes), name=f"writes-{node_id}")
            reader = asyncio.create_task(
                self._read(stream, request_iterator, writes, presented=presented),
                name=f"read-{node_id}",
            )
            # The first pump pass runs on the writer too: database work on a stream is never cut
            # in half by the handler's cancellation (a client going away, a server stopping).
            writes.put_nowait(_DISPATCH)
            # What waits in the outbox goes as one ControlBatch to a worker that reads it.
            outgoing = Batches(
                stream.outbox, wrap=control_batch, allowed=lambda: stream.batches_understood
            )
            while (message := await outgoing.next()) is not None:
                yield message
        finally:
            # The end runs as its own task, shielded: a handler cancelled by a stopping server
            # must not cut a database write in half; `close()` waits for every such end.
            ending = asyncio.create_task(
                self._end_stream(stream, reader, writer, writes), name=f"end-{node_id}"
            )
            self._endings.add(ending)
            ending.add_done_callback(self._endings.discard)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(ending)

    async def _end_stream(
        self,
        stream: WorkerStream,
        reader: asyncio.Task[None] | None,
        writer: asyncio.Task[None] | None,
        writes: asyncio.Queue[_Write | None],
    ) -> None:
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if writer is not None:
            # Finish the writes already queued (results the worker waits to see acknowledged
            # are resent anyway), then stop; never cancel one mid-transaction unless it hangs.
            writes.put_nowait(None)
            try:
                await asyncio.wait_for(asyncio.shield(writer), _WRITER_DRAIN_S)
            except TimeoutError:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer
        metrics.worker_stream("disconnected")
        await self._goodbye(stream)

    async def close(self) -> None:
        """Wait for every stream's end (its last writes and its goodbye) to finish."""
        if self._endings:
            await asyncio.wait(set(self._endings), timeout=_WRITER_DRAIN_S * 2)

    async def _hello(
        self, node_id: str, presented: int, hello: wg.Hello
    ) -> tuple[WorkerStream, wg.Welcome]:
        """Claim the node for the generation the control plane issues (`claim_generation`) and
        open the stream bound to it; the Welcome tells the worker which generation it holds."""
        now = self._clock.now()
        inventory = node_inventory(hello)
        async with self._database.transaction() as db:
            node, previous = await nodes.claim_generation(
                db,
                node_id,
                presented=presented,
                hostname=hello.hostname,
                inventory=inventory,
                now=now,
            )
            generation = node.generation
            if previous and generation > previous:
                await _release_generation(db, node_id, previous, now=now)
            reconciled = await self._lifecycle.reconcile_node(
                db, node_id=node_id, generation=generation, inventory=hello.inventory, now=now
            )
            await settle_node_deployments(db, node_id, now=now)
            await nodes.record_stream(
                db,
                node_id=node_id,
                replica_id=self._hub.replica_id,
                generation=generation,
                now=now,
            )
            record(
                db,
                NodeChanged(node, (node_id,)),
                ResidenciesChanged(tuple(reconciled.changed)),
                ReconcileWanted(),
            )
        stream = self._hub.open_stream(node_id=node_id, generation=generation)
        self._gpus_written.pop(node_id, None)  # the Hello's inventory holds no GPU reading
        # Right after the commit, which wrote `last_seen_at = now`: until this line the row alone
        # is fresh, from here on the reconciler judges the stream by what it hears (its wake
        # above only lets its next pass run once this task waits).
        multiple = self._pace(self._hub.stream_count() + 1)
        self._liveness.connected(node_id, generation, now, holder=stream, multiple=multiple)
        # Per node within its rate: a credential holder reconnecting in a loop floods nothing.
        worker_log.info(
            node_id,
            "connected, generation %d (presented %d), adopted %d, unloading %d",
            generation,
            presented,
            len(reconciled.adopted),
            len(reconciled.unwanted),
        )
        welcomed = welcome(
            node_id,
            generation,
            reconciled,
            heartbeat_interval_s=self.pacing.base_interval_s * multiple,
        )
        return stream, welcomed

    def _pace(self, streams: int) -> int:
        """The multiple of the base interval to tell a stream welcomed now that `streams` are
        held here; when it rose past the last Hello's, each open stream told less is told it."""
        multiple = self.pacing.multiple(streams)
        if multiple > self._paced_multiple:
            told = wg.ControlMessage(
                heartbeat_interval=wg.HeartbeatInterval(
                    heartbeat_interval=interval(self.pacing.base_interval_s * multiple)
                )
            )
            for stream in self._hub.streams():
                if self._liveness.paced(stream.node_id, holder=stream, multiple=multiple):
                    # A full outbox is a stream in trouble already: its grace widened anyway.
                    with contextlib.suppress(GantryError):
                        stream.send(told)
            self._warn_past_the_lease(streams, self.pacing.base_interval_s * multiple)
        self._paced_multiple = multiple
        self._hub.heartbeat_multiple = max(self._hub.heartbeat_multiple, multiple)
        return multiple

    def _warn_past_the_lease(self, streams: int, interval_s: float) -> None:
        """Only a heartbeat renews a job's lease (`_heartbeat`): an interval as long as the lease
        lets a lease lapse between two beats, and the job is queued again though its worker
        runs it. Said once each time the interval rises that far (docs/limits.md, job lease)."""
        lease_s = self._lifecycle.pump.lease_seconds
        if interval_s >= lease_s:
            log.warning(
                "%d worker streams on this replica are told to heartbeat every %g s, no sooner "
                "than the %g s job lease: a lease can lapse between the heartbeats that renew "
                "it; raise --lease-seconds or --max-heartbeats-per-s, or spread the workers over "
                "more replicas",
                streams,
                interval_s,
                lease_s,
            )

    async def _read(
        self,
        stream: WorkerStream,
        messages: AsyncIterator[wg.WorkerMessage],
        writes: asyncio.Queue[_Write | None],
        *,
        presented: int,
    ) -> None:
        """Each message in turn: bounded, from this stream's generation (the one issued, or the
        one its Hello presented: what a worker stamps until it reads its Welcome), then handed
        over inline (invoke results) or queued for the writer."""
        # Every stream's generation is the control plane's; a stamp is a consistency check.
        stamps = {stream.generation, presented}
        try:
            async for message in messages:
                if stream.closed:
                    return
                if message.WhichOneof("kind") != "batch":
                    if not self._take(stream, message, writes, stamps):
                        return
                    continue
                # A batch (WorkerBatch): its messages in order, each as if it had come alone.
                if not self._within_bounds(stream, message, walk=False):
                    return
                for inner in message.batch.messages:
                    if stream.closed or not self._take(stream, inner, writes, stamps):
                        return
        except grpc.aio.AioRpcError:
            pass
        except GantryError as error:
            # A message that does not parse (the interceptor's refusal) or has no kind this
            # stream takes: one bounded line, no traceback, and the refusal is the stream's status.
            worker_log.warning(
                stream.node_id, "worker stream refused, closing: %s %s", error.reason, error.message
            )
            stream.refuse(error)
        except Exception:
            worker_log.exception(stream.node_id, "worker stream failed")
        finally:
            stream.close(
                GantryError("WORKER_UNAVAILABLE", f"lost the stream to node {stream.node_id}")
            )

    def _take(
        self,
        stream: WorkerStream,
        message: wg.WorkerMessage,
        writes: asyncio.Queue[_Write | None],
        stamps: set[int],
    ) -> bool:
        """One message: bounded, from this stream's generation, then handed over inline (invoke
        results) or queued for the writer. False when the stream must end."""
        if not self._within_bounds(stream, message):
            return False  # the stream closes: a worker that breaks a bound is broken or hostile
        if message.generation not in stamps:
            refuse_stamp(stream, message)
            return True
        kind = message.WhichOneof("kind")
        if kind != "heartbeat":
            # Any message is proof of life; a heartbeat's is noted in its own turn.
            self._liveness.heard(stream.node_id, stream.generation, self._clock.now())
        if kind == "invoke_result":
            stream.resolve_invoke(message.invoke_result)
        elif kind == "invoke_progress":
            # Inline like a result, and never waiting: a caller that falls behind has its
            # own call failed (worker_sessions), never this reader's other calls delayed.
            stream.progress_invoke(message.invoke_progress)
        elif kind == "heartbeat":
            heartbeat = message.heartbeat
            try:
                reading = stream.gpu_reading.reading_of(heartbeat)
            except GantryError as error:
                self._refuse(stream, message, error)
                return False
            if self._heard_inline(stream, heartbeat, reading, writes):
                return True
            return self._queue_write(stream, writes, _Beat(heartbeat, reading))
        elif kind in ("job_result", "job_update", "inventory_report"):
            return self._queue_write(stream, writes, message)
        else:
            # A Hello after the first message, a batch inside a batch, or no kind at all.
            raise unexpected_kind(kind)
        return True

    def _queue_write(
        self, stream: WorkerStream, writes: asyncio.Queue[_Write | None], item: _Write
    ) -> bool:
        """Queue `item` for the writer; False (logged) when the writes fell too far behind: the
        reader then ends the stream."""
        if writes.qsize() >= self._settings.write_queue_limit:
            worker_log.error(stream.node_id, "database writes fell behind; closing")
            return False
        writes.put_nowait(item)
        return True

    def _within_bounds(
        self, stream: WorkerStream, message: wg.WorkerMessage, *, walk: bool = True
    ) -> bool:
        """Whether every field of `message` is within its bound; if not, the worker is told why
        (a Reject naming the field) before its stream is closed. `walk=False`: a batch's own
        fields only (its count); each of its messages is checked as it is taken."""
        try:
            if walk:
                check_worker_message(message)
            else:
                check_batch(message)
        except GantryError as error:
            self._refuse(stream, message, error)
            return False
        return True

    def _refuse(self, stream: WorkerStream, message: wg.WorkerMessage, error: GantryError) -> None:
        """`message` breaks the protocol: counted, logged (one bounded line, no traceback), the
        worker told why (a Reject naming the field), and its stream closed with `error`."""
        kind = message.WhichOneof("kind") or ""
        metrics.message_refused(error.reason, kind)
        worker_log.warning(stream.node_id, "%s refused, stream closed: %s", kind, error.message)
        with contextlib.suppress(GantryError):
            stream.send(reject("", error))
        stream.refuse(error)

    def _heard_inline(
        self,
        stream: WorkerStream,
        heartbeat: wg.Heartbeat,
        reading: wg.Heartbeat,
        writes: asyncio.Queue[_Write | None],
    ) -> bool:
        """A heartbeat with no leases to renew and nothing queued before it is only liveness, kept
        in memory: note it here rather than wake the writer for it. Most heartbeats of a fleet are
        these; the queue hop cost a task switch each (fleet bench, issue 9). With writes pending,
        it waits its turn behind them as `_heartbeat` says. `reading`: the heartbeat carrying its
        GPU reading (`StreamReading.reading_of`)."""
        if heartbeat.active_job_ids or not writes.empty():
            return False
        if stream.gpu_reading.worth_writing(self._gpus_written.get(stream.node_id), reading):
            return False
        self._liveness.heard(stream.node_id, stream.generation, self._clock.now())
        return True

    async def _write(self, stream: WorkerStream, writes: asyncio.Queue[_Write | None]) -> None:
        while (message := await writes.get()) is not None:
            try:
                if message is _DISPATCH:
                    await self._lifecycle.dispatch_queued(stream.node_id)
                elif isinstance(message, _Beat):
                    await self._heartbeat(stream, message.heartbeat, message.reading)
                else:
                    await self._handle(stream, message)
            except GantryError as error:
                kind = _kind_of(message) or ""
                worker_log.warning(stream.node_id, "%s refused: %s", kind, str(error))
            except Exception:
                worker_log.exception(stream.node_id, "handling %s failed", _kind_of(message))

    async def _handle(self, stream: WorkerStream, message: wg.WorkerMessage) -> None:
        kind = message.WhichOneof("kind")
        if kind == "job_result":
            await self._job_result(stream, message.job_result)
        elif kind == "job_update":
            await self._job_update(stream, message.job_update)
        elif kind == "inventory_report":
            await self._inventory(stream, message.inventory_report.inventory)

    async def _heartbeat(
        self, stream: WorkerStream, heartbeat: wg.Heartbeat, reading: wg.Heartbeat
    ) -> None:
        """Note the stream as heard, and renew the leases of the jobs the worker still runs.
        `reading`: the heartbeat carrying its GPU reading (itself, or the stream's last reading
        when it says `gpus_unchanged`).

        On the writer, so it counts only once the messages sent before it were handled. Only the
        generation that holds the node refreshes its liveness, and only the one that holds a job
        renews it (`renew_leases` matches node and generation): a late heartbeat of an old
        generation changes nothing. Its GPU reading is written after the leases, so a failed
        write of it never costs a lease its renewal.
        """
        holds = self._liveness.heard(stream.node_id, stream.generation, self._clock.now())
        if heartbeat.active_job_ids:
            async with self._database.transaction() as db:
                await jobs.renew_leases(
                    db,
                    node_id=stream.node_id,
                    generation=stream.generation,
                    job_ids=list(heartbeat.active_job_ids),
                    lease_seconds=self._lifecycle.pump.lease_seconds,
                    now=self._clock.now(),
                )
        # Otherwise no transaction: liveness alone is kept in memory.
        written = self._gpus_written.get(stream.node_id)
        if holds and stream.gpu_reading.worth_writing(written, reading):
            await retry_on_conflict(lambda: self._write_gpus(stream, reading))

    async def _write_gpus(self, stream: WorkerStream, heartbeat: wg.Heartbeat) -> None:
        """Keep the heartbeat's GPU reading in the node's inventory and announce the node (the
        scheduler charges its external GPU processes), if this stream's generation holds it."""
        async with self._database.transaction() as db:
            node = await nodes.get_node(db, stream.node_id)
            if node.generation != stream.generation:
                return
            freed = gpu_rules.frees_capacity(node.inventory, heartbeat)
            node.inventory = gpu_rules.with_reading(node.inventory, heartbeat, self._clock.now())
            record(db, NodeChanged(node, (stream.node_id,)))
            if freed:
                record(db, CapacityFreed())  # after the node: the scheduler hears it first
        self._gpus_written[stream.node_id] = gpu_rules.Written.of(heartbeat)

    async def _job_result(self, stream: WorkerStream, result: wg.JobResult) -> None:
        try:
            await retry_on_conflict(
                lambda: self._lifecycle.apply_result(
                    node_id=stream.node_id, generation=stream.generation, result=result
                )
            )
        except GantryError as error:
            worker_log.warning(
                stream.node_id, "job result %s refused: %s", result.job_id, str(error)
            )
            metrics.message_refused(error.reason, "job_result")
            stream.send(reject(result.job_id, error))
            return
        stream.send(wg.ControlMessage(ack=wg.Ack(job_id=result.job_id)))

    async def _job_update(self, stream: WorkerStream, update: wg.JobUpdate) -> None:
        """Progress, recorded only from the holder of the job's current lease. A refusal is
        logged, never answered with a Reject: a Reject is what a worker reads about a result."""
        if update.progress:
            worker_log.info(stream.node_id, "job %s: %s", update.job_id, update.progress)
        try:
            await retry_on_conflict(
                lambda: self._lifecycle.apply_update(
                    node_id=stream.node_id, generation=stream.generation, update=update
                )
            )
        except GantryError as error:
            worker_log.warning(
                stream.node_id, "job update %s refused: %s", update.job_id, str(error)
            )
            metrics.message_refused(error.reason, "job_update")

    async def _inventory(self, stream: WorkerStream, inventory: wg.Inventory) -> None:
        async def reconcile() -> Reconciled | None:
            async with self._database.transaction() as db:
                # Locked: replicas applying this node's reports take turns, each judging the
                # one its predecessor committed.
                node = await nodes.lock_node(db, stream.node_id)
                stamp = inventory_rules.Stamp(inventory.generation, inventory.sequence)
                if inventory_rules.older(stamp, inventory_rules.shown_stamp(node.inventory)):
                    return None  # read late: a newer one of this process was applied already
                # GetInventory shows the latest report, not only the Hello's (an adopted
                # endpoint, say, appears only in a report).
                node.inventory = {
                    **(node.inventory or {}),
                    "inventory": json_format.MessageToDict(inventory),
                }
                reconciled = await self._lifecycle.reconcile_node(
                    db,
                    node_id=stream.node_id,
                    generation=stream.generation,
                    inventory=inventory,
                    now=self._clock.now(),
                )
                record(db, ResidenciesChanged(tuple(reconciled.changed)))
                return reconciled

        reconciled = await retry_on_conflict(reconcile)
        if reconciled is None:
            worker_log.info(
                stream.node_id,
                "inventory %d skipped: a newer one of generation %d was applied",
                inventory.sequence,
                inventory.generation,
            )
            return
        if reconciled.stale_for:
            worker_log.info(
                stream.node_id,
                "inventory %d is older than the last change of residencies %s: kept as they are",
                inventory.sequence,
                ", ".join(reconciled.stale_for),
            )
        if reconciled.unwanted:
            # Only a Hello's Welcome tells a worker to unload what no record accounts for; mid-
            # stream this is rare (a load that outlived its record) and is reported, not guessed.
            worker_log.warning(
                stream.node_id,
                "holds deployments no record on it accounts for: %s (unloaded on its next connect)",
                ", ".join(reconciled.unwanted),
            )
        if reconciled.queued_jobs:
            await self._lifecycle.dispatch_queued(stream.node_id)

    async def _goodbye(self, stream: WorkerStream) -> None:
        stream.close(GantryError("WORKER_UNAVAILABLE", f"node {stream.node_id} disconnected"))
        async with self._hub.turn(stream.node_id):  # a Hello of the node waits for this write
            if not self._hub.detach(stream):
                self._liveness.disconnected(stream.node_id, holder=stream)  # a newer one's is kept
                return  # a newer stream already holds the node
            held = False
            try:
                held = await self.goodbyes.settle(stream)
            except GantryError as error:
                log.warning("could not mark node %s disconnected: %s", stream.node_id, error)
                return
            finally:
                # Only now: until the row says DISCONNECTED, staleness is still decided here.
                self._liveness.disconnected(stream.node_id, holder=stream)
        if held:
            worker_log.info(
                stream.node_id,
                "generation %d: this replica's stream ended; another replica holds one",
                stream.generation,
            )
        else:
            worker_log.info(stream.node_id, "generation %d disconnected", stream.generation)


async def _release_generation(
    db: AsyncSession, node_id: str, generation: int, *, now: dt.datetime
) -> None:
    """Another worker process (or a stream that lost the node) holds it now: the old
    generation's unfinished jobs go back to the queue (a probe among them back to QUEUED: its
    child died with the old process)."""
    released = await jobs.release_generation_jobs(
        db, node_id=node_id, generation=generation, now=now
    )
    await jobs_requeued(db, released, now=now)
