"""The scheduler's gRPC surface: one Connect stream from the control plane, and snapshots.

The pump is thin: it feeds stream messages to the cluster view and asks the pure routing rules for
decisions. Nothing here survives a restart that the control plane cannot replay.

There is no outbox: each answer is yielded inline, so a slow reader on the control plane's side
holds this pump back through gRPC flow control instead of growing a queue here. What is bounded
is the in-flight work the view tracks: past `max_in_flight` a dispatch is refused QUEUE_FULL.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context, inject_context, tracer
from gantry.scheduler.policy.cluster import ClusterView, ResidencyView
from gantry.scheduler.policy.routing import Refusal, choose_nodes, choose_residency
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
_tracer = tracer("gantry.scheduler")


DEFAULT_MAX_IN_FLIGHT = 65_536


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT


class SchedulerService(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, settings: SchedulerSettings | None = None) -> None:
        self._settings = settings or SchedulerSettings()
        self._view = ClusterView()
        self._finished_by_outcome: Counter[int] = Counter()
        self._connected = False
        self._stream_epoch = 0
        self._dispatched_total = 0
        self._rejected_total = 0

    async def Connect(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.SchedulerInput],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[scheduler_pb2.SchedulerOutput]:
        # A new control-plane stream replaces the old one: the view is rebuilt from its snapshot.
        self._stream_epoch += 1
        epoch = self._stream_epoch
        self._view.reset()
        self._connected = True
        log.info("control plane connected (stream %d)", epoch)
        try:
            async for message in request_iterator:
                if epoch != self._stream_epoch:
                    return
                output = self._handle(message)
                if output is not None:
                    yield output
        finally:
            if epoch == self._stream_epoch:
                self._connected = False
            log.info("control plane stream %d closed", epoch)

    def _handle(
        self, message: scheduler_pb2.SchedulerInput
    ) -> scheduler_pb2.SchedulerOutput | None:
        kind = message.WhichOneof("kind")
        if kind == "cluster_state":
            self._view.reset()
            for node in message.cluster_state.nodes:
                self._apply_node(node)
            for residency in message.cluster_state.residencies:
                self._apply_residency(residency)
            return None
        if kind == "node_update":
            self._apply_node(message.node_update.node)
            return None
        if kind == "residency_update":
            self._apply_residency(message.residency_update.residency)
            return None
        if kind == "work_finished":
            finished = message.work_finished
            self._finished_by_outcome[finished.outcome] += 1
            self._view.finish_work(finished.work_id, finished.outcome)
            return None
        if kind == "work_submitted":
            return self._dispatch(message)
        if kind == "place_deployment":
            return self._place(message.place_deployment)
        raise GantryError("INVALID_ARGUMENT", f"unknown scheduler input {kind!r}")

    def _apply_node(self, node: scheduler_pb2.SchedulerNode) -> None:
        self._view.upsert_node(node.node_id, state=node.state, adapters=frozenset(node.adapters))

    def _apply_residency(self, residency: scheduler_pb2.SchedulerResidency) -> None:
        self._view.upsert_residency(
            residency.residency_id,
            deployment_id=residency.deployment_id,
            node_id=residency.node_id,
            state=residency.state,
        )

    def _dispatch(self, message: scheduler_pb2.SchedulerInput) -> scheduler_pb2.SchedulerOutput:
        work = message.work_submitted
        with _tracer.start_as_current_span(
            "scheduler.dispatch",
            context=extract_context(message.trace_context),
            attributes={"gantry.work_id": work.work_id, "gantry.deployment_id": work.deployment_id},
        ) as span:
            decision: ResidencyView | Refusal
            if len(self._view.assignments) >= self._settings.max_in_flight:
                decision = Refusal(
                    "QUEUE_FULL", f"{self._settings.max_in_flight} calls are already in flight"
                )
            else:
                decision = choose_residency(self._view, work.deployment_id)
            output = scheduler_pb2.SchedulerOutput()
            inject_context(output.trace_context)
            if isinstance(decision, Refusal):
                self._rejected_total += 1
                span.set_attribute("gantry.rejected", decision.reason)
                output.rejected.CopyFrom(_rejected(work.work_id, decision))
                return output
            self._view.start_work(work.work_id, decision.residency_id)
            self._dispatched_total += 1
            span.set_attribute("gantry.node_id", decision.node_id)
            output.dispatch.CopyFrom(
                scheduler_pb2.Dispatch(
                    work_id=work.work_id,
                    residency_id=decision.residency_id,
                    node_id=decision.node_id,
                    deployment_id=decision.deployment_id,
                )
            )
            return output

    def _place(self, request: scheduler_pb2.PlaceDeployment) -> scheduler_pb2.SchedulerOutput:
        decision = choose_nodes(
            self._view,
            deployment_id=request.deployment_id,
            replicas=max(1, request.replicas),
            required_adapter=request.required_adapter,
        )
        if isinstance(decision, Refusal):
            return scheduler_pb2.SchedulerOutput(rejected=_rejected(request.request_id, decision))
        return scheduler_pb2.SchedulerOutput(
            placement=scheduler_pb2.Placement(
                request_id=request.request_id,
                deployment_id=request.deployment_id,
                node_ids=decision,
            )
        )

    async def GetQueueSnapshot(
        self, request: scheduler_pb2.GetQueueSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.QueueSnapshot:
        await asyncio.sleep(0)
        return scheduler_pb2.QueueSnapshot(
            control_plane_connected=self._connected,
            in_flight=len(self._view.assignments),
            dispatched_total=self._dispatched_total,
            rejected_total=self._rejected_total,
            cancelled_total=self._finished_by_outcome[scheduler_pb2.WORK_OUTCOME_CANCELLED],
            infra_failures_total=self._finished_by_outcome[
                scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE
            ],
            residencies=[
                scheduler_pb2.ResidencyLoad(
                    residency_id=r.residency_id,
                    deployment_id=r.deployment_id,
                    node_id=r.node_id,
                    state=(
                        common_pb2.RESIDENCY_STATE_RESIDENT
                        if r.resident
                        else common_pb2.RESIDENCY_STATE_UNSPECIFIED
                    ),
                    in_flight=r.in_flight,
                    infra_failures=r.infra_failures,
                )
                for r in self._view.residencies.values()
            ],
            nodes=[
                scheduler_pb2.SchedulerNode(
                    node_id=n.node_id,
                    state=(
                        common_pb2.NODE_STATE_CONNECTED
                        if n.connected
                        else common_pb2.NODE_STATE_DISCONNECTED
                    ),
                    adapters=sorted(n.adapters),
                )
                for n in self._view.nodes.values()
            ],
        )


def _rejected(work_id: str, refusal: Refusal) -> scheduler_pb2.Rejected:
    return scheduler_pb2.Rejected(
        work_id=work_id,
        failure=GantryError(refusal.reason, refusal.message).to_failure(),
    )
