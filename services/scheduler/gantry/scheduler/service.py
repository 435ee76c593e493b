"""The scheduler's gRPC surface: the control planes' Connect streams, and snapshots.

Every control-plane replica opens its own Connect stream, and all of them feed ONE core, so a
tenant's weighted share holds across replicas (one tenant cannot double its share by spreading
its calls over them). Each stream has an origin (its name here): work submitted on it carries
it, and its Dispatch or Rejected goes back on that stream only; a placement's answer goes to the
stream that asked, and what nobody waits for (breaker moves, scale advice) to every stream. The
service keeps the map work id -> origin of work still queued (bounded by the core's queue depth),
so the core stays pure.

A stream's snapshot replaces the cluster's facts but not other streams' work
(`SchedulerCore.load_cluster`). When a stream closes, its work leaves the core
(`SchedulerCore.drop_origin`): its control plane failed those callers when the stream dropped.
When the last one closes, everything is forgotten, and the next stream's snapshot rebuilds it.

Per stream, a reader task feeds each input to the core and the response stream drains the
stream's outbox (`outbox.py`: its bounds). One ticker, while any stream is open, feeds the core
the time (queued deadlines, breaker cooldowns, placement holds, autoscale advice). Decisions for
queued work come later than its input (when a slot frees, maybe on another stream's input), so
they cannot be yielded inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from gantry.common.clock import Clock, SystemClock
from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, inject_context, tracer
from gantry.scheduler import wire
from gantry.scheduler.metrics import SchedulerMetrics
from gantry.scheduler.outbox import StreamOutbox
from gantry.scheduler.policy.core import CoreSettings, SchedulerCore
from gantry.scheduler.policy.credits import CreditGranted, CreditsRevoked
from gantry.scheduler.policy.events import (
    Decision,
    Dispatched,
    PlacementMade,
    PlacementRefused,
    WorkRejected,
)
from gantry.scheduler.policy.types import Outcome
from gantry.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
_tracer = tracer("gantry.scheduler")

DEFAULT_OUTBOX_LIMIT = 4096
DEFAULT_TICK_SECONDS = 0.1
DEFAULT_MAX_STREAMS = 16  # control-plane replicas connected at once
MAX_BATCH = 256  # outputs coalesced into one stream message at most
GAUGE_SECONDS = 1.0  # how often the gauges' summary of the core is refreshed


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    core: CoreSettings = field(default_factory=CoreSettings)
    tick_seconds: float = DEFAULT_TICK_SECONDS  # how late a queued deadline may be noticed
    outbox_limit: int = DEFAULT_OUTBOX_LIMIT
    max_streams: int = DEFAULT_MAX_STREAMS


@dataclass(eq=False)
class _Stream:
    """One control plane's Connect stream."""

    origin: str
    outbox: StreamOutbox[scheduler_pb2.SchedulerOutput]
    failure: GantryError | None = None  # what the stream ends with, if not a plain close


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self, settings: SchedulerSettings | None = None, *, clock: Clock | None = None
    ) -> None:
        self._settings = settings or SchedulerSettings()
        self._clock = clock or SystemClock()
        self._core = SchedulerCore(self._settings.core)
        self._streams: dict[str, _Stream] = {}  # by origin
        self._opened = 0  # streams ever opened: names each origin
        self._ticker: asyncio.Task[None] | None = None
        # Work still queued -> the origin of the stream that submitted it, where its answer goes.
        # An entry leaves with that answer, its caller's finish or its stream, so the map is
        # bounded by the core's queue depth.
        self._origins: dict[str, str] = {}
        # The caller's trace context of work that has no answer yet (bounded by the core's queue
        # depth plus its in-flight bound): a dispatch decided later still joins the caller's trace.
        self._traces: dict[str, dict[str, str]] = {}
        self._metrics = SchedulerMetrics()
        self._gauges_at = 0.0

    @property
    def core(self) -> SchedulerCore:
        return self._core

    @property
    def streams(self) -> int:
        """Control-plane streams open now."""
        return len(self._streams)

    async def Connect(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        stream = self._open()
        reader = asyncio.create_task(self._read(request_iterator, stream))
        log.info("control plane connected (%s, %d open)", stream.origin, len(self._streams))
        try:
            outbox = stream.outbox
            while (item := await outbox.get()) is not None:
                # What else is already decided goes in the same stream message (in order).
                batch = [item, *outbox.take_ready(MAX_BATCH - 1)]
                if len(batch) == 1:
                    yield item
                else:
                    yield scheduler_pb2.SchedulerOutput(
                        batch=scheduler_pb2.OutputBatch(outputs=batch)
                    )
            if stream.failure is not None:
                raise stream.failure
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            self._close(stream)
            if not self._streams:
                await self._stop_ticker()
            log.info("control plane stream %s closed (%d open)", stream.origin, len(self._streams))

    def _open(self) -> _Stream:
        limit = self._settings.max_streams
        if len(self._streams) >= limit:
            raise GantryError(
                "QUEUE_FULL",
                f"{limit} control-plane streams are open already, the scheduler's limit "
                f"(--max-streams)",
                limit=str(limit),
            )
        self._opened += 1
        # A stream may be owed, past its own backlog, an answer for every call it could queue.
        overflow = self._settings.outbox_limit + self._settings.core.global_queue_depth
        stream = _Stream(
            origin=f"stream-{self._opened}",
            outbox=StreamOutbox(limit=self._settings.outbox_limit, overflow_limit=overflow),
        )
        self._streams[stream.origin] = stream
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick(), name="scheduler-ticker")
        return stream

    def _close(self, stream: _Stream) -> None:
        """The stream leaves: nothing more is routed to it, and its work leaves the core."""
        if self._streams.pop(stream.origin, None) is None:
            return  # closed already (its outbox overflowed)
        stream.outbox.end()
        if not self._streams:
            # The last one: nobody waits on anything the core holds; the next snapshot rebuilds.
            self._core.reset()
            self._origins.clear()
            self._traces.clear()
            self._metrics.reset()
            return
        for work_id in [w for w, origin in self._origins.items() if origin == stream.origin]:
            del self._origins[work_id]
            self._traces.pop(work_id, None)
            self._metrics.finished(work_id)
        self._deliver(self._core.drop_origin(stream.origin, self._clock.monotonic()), None)

    def _overflowed(self, stream: _Stream) -> None:
        """A control plane that stopped reading: its stream ends (it reconnects with a fresh
        snapshot, its link having failed its callers) rather than hold the others back."""
        stream.failure = GantryError(
            "CLIENT_TOO_SLOW",
            f"the control plane on {stream.origin} left the scheduler's outputs unread past "
            f"the outbox bound; the stream is ended",
        )
        stream.outbox.end(discard=True)
        self._close(stream)

    async def _stop_ticker(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _read(
        self, request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput], stream: _Stream
    ) -> None:
        try:
            async for message in request_iterator:
                if stream.outbox.ended:
                    break  # ended by an overflow: its work has left the core already
                for output in self._apply(message, stream):
                    await stream.outbox.put(output)
        except GantryError as error:
            stream.failure = error
        except grpc.aio.AioRpcError:
            pass  # the control plane went away; the stream ends
        stream.outbox.end()

    async def _tick(self) -> None:
        while True:
            await self._clock.sleep(self._settings.tick_seconds)
            now = self._clock.monotonic()
            self._deliver(self._core.tick(now), None)
            if now >= self._gauges_at and self._metrics.enabled:
                self._gauges_at = now + GAUGE_SECONDS
                self._metrics.summarise(self._core.snapshot(now))

    def _apply(
        self, message: scheduler_pb2.SchedulerInput, stream: _Stream
    ) -> list[scheduler_pb2.SchedulerOutput]:
        """One input to the core: the outputs its decisions make for this stream, in order (those
        for other streams are offered to them)."""
        now = self._clock.monotonic()
        kind = message.WhichOneof("kind")
        if kind == "batch":
            outputs = []
            for inner in message.batch.inputs:
                if inner.WhichOneof("kind") == "batch":
                    raise GantryError("INVALID_ARGUMENT", "scheduler input batches do not nest")
                outputs.extend(self._apply(inner, stream))
            return outputs
        if kind == "work_submitted":
            work_id = message.work_submitted.work_id
            if work_id in self._origins:
                # Queued already, maybe from another stream, whose answer must stay its own.
                known = WorkRejected(work_id, "ALREADY_EXISTS", f"work {work_id} is known")
                return [self._output(known, now)]
            decisions = self._submit(message, stream.origin, now)
        elif kind == "work_finished":
            decisions = self._finish(message.work_finished, stream.origin, now)
        elif kind == "credits_returned":
            returned = message.credits_returned.credit_ids
            decisions = self._core.return_credits(stream.origin, returned, now)
        else:
            decisions = self._update_cluster(message, kind, stream.origin, now)
        return self._deliver(decisions, stream)

    def _submit(
        self, message: scheduler_pb2.SchedulerInput, origin: str, now: float
    ) -> list[Decision]:
        submitted = message.work_submitted
        self._origins[submitted.work_id] = origin
        if message.trace_context:
            self._traces[submitted.work_id] = dict(message.trace_context)
        self._metrics.submitted(submitted.work_id, submitted.tenant_id, now)
        return self._core.submit(wire.work(submitted, origin=origin), now)

    def _finish(
        self, finished: scheduler_pb2.WorkFinished, origin: str, now: float
    ) -> list[Decision]:
        # An outcome this scheduler does not know says nothing about health.
        outcome = (
            Outcome(finished.outcome) if finished.outcome in _KNOWN_OUTCOMES else Outcome.CANCELLED
        )
        if finished.credit_id:  # dispatched by the control plane on its credit: never queued here
            tenant_id = self._core.credit_tenant(origin, finished.credit_id)
            if tenant_id is not None:
                self._metrics.credited(tenant_id)
            return self._core.credit_used(
                origin,
                finished.credit_id,
                outcome,
                now,
                reason=finished.reason,
                cost=finished.cost,
            )
        self._origins.pop(finished.work_id, None)
        self._traces.pop(finished.work_id, None)
        self._metrics.finished(finished.work_id)
        return self._core.finish(finished.work_id, outcome, now, reason=finished.reason)

    def _update_cluster(
        self, message: scheduler_pb2.SchedulerInput, kind: str | None, origin: str, now: float
    ) -> list[Decision]:
        """What the cluster's state, a node, residency, deployment or tenant policy changing
        decides now."""
        core = self._core
        if kind == "cluster_state":
            state = message.cluster_state
            core.takes_credits(origin, state.takes_credits)
            return core.load_cluster(
                nodes=[wire.node(n) for n in state.nodes],
                residencies=[wire.residency(r) for r in state.residencies],
                deployments=[wire.deployment(d) for d in state.deployments],
                policies=[wire.tenant_policy(p) for p in state.tenant_policies],
                now=now,
            )
        if kind == "node_update":
            update = message.node_update
            if update.removed:
                return core.remove_node(update.node.node_id, now)
            return core.upsert_node(wire.node(update.node), now)
        if kind == "residency_update":
            return core.upsert_residency(wire.residency(message.residency_update.residency), now)
        if kind == "place_deployment":
            return [core.place(wire.placement(message.place_deployment), now)]
        if kind == "placement_released":
            released = message.placement_released
            return core.release_holds(released.deployment_id, released.node_ids)
        if kind == "tenant_policies":
            policies = (wire.tenant_policy(p) for p in message.tenant_policies.policies)
            revoked = core.set_policies(policies)
            return revoked + core.tick(now)  # a raised quota or weight may let waiting work go now
        if kind == "deployment_update":
            deployment_update = message.deployment_update
            if deployment_update.removed:
                return core.remove_deployment(deployment_update.deployment.deployment_id, now)
            core.upsert_deployment(wire.deployment(deployment_update.deployment))
            return []
        raise GantryError("INVALID_ARGUMENT", f"unknown scheduler input {kind!r}")

    def _deliver(
        self, decisions: list[Decision], asking: _Stream | None
    ) -> list[scheduler_pb2.SchedulerOutput]:
        """Each decision's output to the streams it is for: the asking stream's returned in order
        (its reader waits for room), the others' offered at once."""
        own = []
        now = self._clock.monotonic() if decisions else 0.0
        for decision in decisions:
            output = self._output(decision, now)
            for stream in self._targets(decision, asking):
                if stream is asking:
                    own.append(output)
                elif not stream.outbox.offer(output):
                    self._overflowed(stream)
        return own

    def _targets(self, decision: Decision, asking: _Stream | None) -> list[_Stream]:
        if isinstance(decision, Dispatched | WorkRejected):
            # Every call submitted has its entry until its answer (a call refused at submit as
            # a duplicate of one in flight too: its entry was just made). None: its stream
            # closed meanwhile, and nobody waits for the answer.
            origin = self._origins.pop(decision.work_id, None)
            stream = self._streams.get(origin) if origin is not None else None
            return [stream] if stream is not None else []
        if isinstance(decision, PlacementMade | PlacementRefused):
            return [asking] if asking is not None else []
        if isinstance(decision, CreditGranted | CreditsRevoked):  # the stream that holds them
            stream = self._streams.get(decision.origin)
            return [stream] if stream is not None else []
        return list(self._streams.values())  # breaker moves and advice: every control plane's

    def _output(self, decision: Decision, now: float) -> scheduler_pb2.SchedulerOutput:
        self._metrics.decided(decision, now)
        output = wire.output(decision)
        if isinstance(decision, Dispatched):
            carrier = self._traces.pop(decision.work_id, None)
            with _tracer.start_as_current_span(
                "scheduler.dispatch",
                context=extract_context(carrier or {}),
                attributes={
                    "gantry.work_id": decision.work_id,
                    "gantry.deployment_id": decision.deployment_id,
                    "gantry.node_id": decision.node_id,
                },
            ):
                inject_context(output.trace_context)
        elif isinstance(decision, WorkRejected):
            self._traces.pop(decision.work_id, None)
        return output

    async def GetQueueSnapshot(
        self, request: scheduler_pb2.GetQueueSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.QueueSnapshot:
        await asyncio.sleep(0)
        return wire.snapshot(
            self._core.snapshot(self._clock.monotonic()), connected=bool(self._streams)
        )


_KNOWN_OUTCOMES = frozenset(int(o) for o in Outcome)
