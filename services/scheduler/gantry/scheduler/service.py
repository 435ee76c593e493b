"""The scheduler's gRPC surface: one Connect stream from the control plane, and snapshots.

The pump is a reader task, the pure core, a ticker and a bounded outbox. The reader feeds each
input to the core and puts its decisions in the outbox; the ticker feeds the core the time (queued
deadlines, breaker cooldowns, placement holds, autoscale advice); the response stream drains the
outbox. Decisions for queued work come later than its input (when a slot frees), so they cannot be
yielded inline. A full outbox makes the reader wait: the control plane's sends are then held back
by gRPC flow control, never dropped. Nothing here survives a new stream: the control plane replays
the cluster state, and every waiter of the old stream was already failed on its side.
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
from gantry.scheduler.policy.core import CoreSettings, Decision, Dispatched, SchedulerCore
from gantry.scheduler.policy.types import Outcome
from gantry.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
_tracer = tracer("gantry.scheduler")

DEFAULT_OUTBOX_LIMIT = 4096
DEFAULT_TICK_SECONDS = 0.1
MAX_BATCH = 256  # outputs coalesced into one stream message at most
GAUGE_SECONDS = 1.0  # how often the gauges' summary of the core is refreshed


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    core: CoreSettings = field(default_factory=CoreSettings)
    tick_seconds: float = DEFAULT_TICK_SECONDS  # how late a queued deadline may be noticed
    outbox_limit: int = DEFAULT_OUTBOX_LIMIT


_END = object()


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self, settings: SchedulerSettings | None = None, *, clock: Clock | None = None
    ) -> None:
        self._settings = settings or SchedulerSettings()
        self._clock = clock or SystemClock()
        self._core = SchedulerCore(self._settings.core)
        self._connected = False
        self._stream_epoch = 0
        # The caller's trace context of work that has no answer yet (bounded by the core's queue
        # depth plus its in-flight bound): a dispatch decided later still joins the caller's trace.
        self._traces: dict[str, dict[str, str]] = {}
        self._metrics = SchedulerMetrics()
        self._gauges_at = 0.0

    @property
    def core(self) -> SchedulerCore:
        return self._core

    async def Connect(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        # A new control-plane stream replaces the old one: the core is rebuilt from its snapshot.
        self._stream_epoch += 1
        epoch = self._stream_epoch
        self._core.reset()
        self._traces.clear()
        self._metrics.reset()
        self._connected = True
        outbox: asyncio.Queue[scheduler_pb2.SchedulerOutput | object] = asyncio.Queue(
            maxsize=self._settings.outbox_limit
        )
        failure: list[BaseException] = []
        reader = asyncio.create_task(self._read(request_iterator, outbox, epoch, failure))
        ticker = asyncio.create_task(self._tick(outbox, epoch))
        log.info("control plane connected (stream %d)", epoch)
        try:
            ended = False
            while not ended:
                item = await outbox.get()
                if item is _END:
                    break
                assert isinstance(item, scheduler_pb2.SchedulerOutput)
                # What else is already decided goes in the same stream message (in order).
                batch = [item]
                while len(batch) < MAX_BATCH and not outbox.empty():
                    more = outbox.get_nowait()
                    if more is _END:
                        ended = True
                        break
                    assert isinstance(more, scheduler_pb2.SchedulerOutput)
                    batch.append(more)
                if len(batch) == 1:
                    yield item
                else:
                    yield scheduler_pb2.SchedulerOutput(
                        batch=scheduler_pb2.OutputBatch(outputs=batch)
                    )
            if failure:
                raise failure[0]
        finally:
            for task in (reader, ticker):
                task.cancel()
            for task in (reader, ticker):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if epoch == self._stream_epoch:
                self._connected = False
            log.info("control plane stream %d closed", epoch)

    async def _read(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        outbox: asyncio.Queue[scheduler_pb2.SchedulerOutput | object],
        epoch: int,
        failure: list[BaseException],
    ) -> None:
        try:
            async for message in request_iterator:
                if epoch != self._stream_epoch:
                    break  # a newer stream owns the core now
                for output in self._apply(message):
                    await outbox.put(output)
        except GantryError as error:
            failure.append(error)
        except grpc.aio.AioRpcError:
            pass  # the control plane went away; the stream ends
        # The end marker must get through even when the outbox is full: wait for room.
        await outbox.put(_END)

    async def _tick(
        self, outbox: asyncio.Queue[scheduler_pb2.SchedulerOutput | object], epoch: int
    ) -> None:
        while epoch == self._stream_epoch:
            await self._clock.sleep(self._settings.tick_seconds)
            if epoch != self._stream_epoch:
                return
            now = self._clock.monotonic()
            for output in self._outputs(self._core.tick(now)):
                await outbox.put(output)
            if now >= self._gauges_at and self._metrics.enabled:
                self._gauges_at = now + GAUGE_SECONDS
                self._metrics.summarise(self._core.snapshot(now))

    def _apply(self, message: scheduler_pb2.SchedulerInput) -> list[scheduler_pb2.SchedulerOutput]:
        """One input to the core; the outputs its decisions make, in order."""
        now = self._clock.monotonic()
        kind = message.WhichOneof("kind")
        if kind == "batch":
            outputs = []
            for inner in message.batch.inputs:
                if inner.WhichOneof("kind") == "batch":
                    raise GantryError("INVALID_ARGUMENT", "scheduler input batches do not nest")
                outputs.extend(self._apply(inner))
            return outputs
        if kind == "work_submitted":
            decisions = self._submit(message, now)
        elif kind == "work_finished":
            decisions = self._finish(message.work_finished, now)
        else:
            decisions = self._update_cluster(message, kind, now)
        return self._outputs(decisions)

    def _submit(self, message: scheduler_pb2.SchedulerInput, now: float) -> list[Decision]:
        submitted = message.work_submitted
        if message.trace_context:
            self._traces[submitted.work_id] = dict(message.trace_context)
        self._metrics.submitted(submitted.work_id, submitted.tenant_id, now)
        return self._core.submit(wire.work(submitted), now)

    def _finish(self, finished: scheduler_pb2.WorkFinished, now: float) -> list[Decision]:
        self._traces.pop(finished.work_id, None)
        self._metrics.finished(finished.work_id)
        # An outcome this scheduler does not know says nothing about health.
        outcome = (
            Outcome(finished.outcome) if finished.outcome in _KNOWN_OUTCOMES else Outcome.CANCELLED
        )
        return self._core.finish(finished.work_id, outcome, now, reason=finished.reason)

    def _update_cluster(
        self, message: scheduler_pb2.SchedulerInput, kind: str | None, now: float
    ) -> list[Decision]:
        """What the cluster's state, a node, residency, deployment or tenant policy changing
        decides now."""
        core = self._core
        if kind == "cluster_state":
            state = message.cluster_state
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
            core.set_policies(wire.tenant_policy(p) for p in message.tenant_policies.policies)
            return core.tick(now)  # a raised quota or weight may let waiting work go now
        if kind == "deployment_update":
            deployment_update = message.deployment_update
            if deployment_update.removed:
                return core.remove_deployment(deployment_update.deployment.deployment_id, now)
            core.upsert_deployment(wire.deployment(deployment_update.deployment))
            return []
        raise GantryError("INVALID_ARGUMENT", f"unknown scheduler input {kind!r}")

    def _outputs(self, decisions: list[Decision]) -> list[scheduler_pb2.SchedulerOutput]:
        outputs = []
        now = self._clock.monotonic() if decisions else 0.0
        for decision in decisions:
            self._metrics.decided(decision, now)
            output = wire.output(decision)
            work_id = getattr(decision, "work_id", None)
            carrier = self._traces.pop(work_id, None) if work_id else None
            if isinstance(decision, Dispatched):
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
            outputs.append(output)
        return outputs

    async def GetQueueSnapshot(
        self, request: scheduler_pb2.GetQueueSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.QueueSnapshot:
        await asyncio.sleep(0)
        return wire.snapshot(
            self._core.snapshot(self._clock.monotonic()), connected=self._connected
        )


_KNOWN_OUTCOMES = frozenset(int(o) for o in Outcome)
