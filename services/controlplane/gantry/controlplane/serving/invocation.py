"""One inference call's way through the fleet, whatever its RPC: dispatched by the scheduler (or,
uncontended, on a credit it leased this control plane: serving/credits.py, with no round trip
before the call goes), invoked on the chosen worker within the call's budget, and reported
finished exactly once.

Every InferenceService RPC, whatever its operation (the registry, gantry.common.operations; its
binding in operations.py, or generation_inference.py), calls one `Invocation`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from typing import TypeVar

from google.protobuf import timestamp_pb2

from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.common.ids import new_id
from gantry.common.telemetry import inject_context
from gantry.controlplane.nodes.sessions import InvokePayload, OnProgress, WorkerHub
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.serving.credits import CreditPool, HeldCredit
from gantry.controlplane.serving.inference_calls import (
    CallBudget,
    InferenceSettings,
    degradation_outcome,
    operation_of,
    work_outcome,
)
from gantry.controlplane.serving.routing import TargetedRequest
from gantry.controlplane.serving.work_cost import embed_cost, rerank_cost
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

_Answer = TypeVar("_Answer")


def work_cost(payload: wg.EmbedPayload | wg.RerankPayload) -> int:
    """A text call's cost for the scheduler (serving/work_cost.py): bytes of text, at least 1.
    Every operation's binding (operations.py) states its call's cost; this one is a text
    call's, for callers that hold only the payload."""
    if isinstance(payload, wg.RerankPayload):
        return rerank_cost(payload.query, payload.documents)
    return embed_cost(payload.inputs)


def _cost_of(payload: InvokePayload, cost: int | None) -> int:
    """The work's size for the fair queue: the handler's, else a text payload's own."""
    if cost is not None:
        return cost
    if not isinstance(payload, wg.EmbedPayload | wg.RerankPayload):
        raise TypeError(f"a {type(payload).__name__} needs its cost from its handler")
    return work_cost(payload)


def work_inputs(payload: InvokePayload) -> int:
    """The scheduler's slots a call takes: the inputs its model host works on at once (a
    residency's slots are its batch size in inputs). An Embed's texts, a Rerank's documents, a
    media call's images; a generation, a transcription or anything else is one."""
    if isinstance(payload, wg.EmbedPayload):
        count = len(payload.inputs)
    elif isinstance(payload, wg.RerankPayload):
        count = len(payload.documents)
    elif isinstance(
        payload, wg.EmbedImagePayload | wg.RecognizeTextPayload | wg.ClassifyImagePayload
    ):
        count = len(payload.images)
    else:
        count = 1
    return max(1, count)


def _work_submitted(
    work_id: str,
    tenant_id: str,
    deployment_id: str,
    request: TargetedRequest,
    *,
    cost: int,
    inputs: int,
    budget: CallBudget,
) -> scheduler_pb2.WorkSubmitted:
    return scheduler_pb2.WorkSubmitted(
        work_id=work_id,
        tenant_id=tenant_id,
        priority=request.priority or common_pb2.PRIORITY_INTERACTIVE,
        deployment_id=deployment_id,
        capability=request.capability,
        cost=cost,
        # Work still queued past the call's budget has no one to answer.
        timeout_seconds=budget.seconds,
        inputs=inputs,
    )


def _deadline_exceeded(budget: CallBudget, work_id: str) -> GantryError:
    return GantryError(
        "DEADLINE_EXCEEDED",
        f"no answer within {budget.seconds:.1f}s "
        f"({'the client deadline' if budget.client_bounded else 'the server cap'})",
        work_id=work_id,
    )


class Invocation:
    def __init__(
        self,
        *,
        hub: WorkerHub,
        scheduler: SchedulerLink,
        clock: Clock,
        settings: InferenceSettings,
        degradation: CapabilityDegradation | None,
    ) -> None:
        self._hub = hub
        self._scheduler = scheduler
        self._clock = clock
        self._settings = settings
        # Each finished invocation's outcome, per capability: the degradation signal's input.
        self._degradation = degradation
        self._credits = CreditPool.attach(scheduler)

    async def __call__(
        self,
        *,
        tenant_id: str,
        deployment_id: str,
        request: TargetedRequest,
        payload: InvokePayload,
        budget: CallBudget,
        answer: Callable[[wg.InvokeResult], _Answer],
        cost: int | None = None,
        on_progress: OnProgress | None = None,
    ) -> tuple[str, _Answer]:
        """Dispatch through the scheduler and invoke on the chosen worker, within the budget;
        the chosen node and the worker's result as `answer` checked and shaped it.

        `payload` is any of the worker's Invoke payloads; it names the operation the stages are
        counted as. `cost` is the work's size for the fair queue (None: a text payload's own,
        `work_cost`; a media handler passes what its headers said). `answer` runs before the
        work is reported finished, so a result the control plane refuses (wrong counts, scores
        that are not numbers or not probabilities: INVOKE_FAILED, class INFRA) counts against
        the residency that gave it, in the scheduler and the breakers, never as a success.
        `on_progress` takes what a streaming invocation sends before its result, in order
        (worker_sessions bounds what waits for it); its failure fails the call.

        Once the work is submitted the scheduler hears exactly one WorkFinished for it, whatever
        happens: the answer, a failure, the deadline, or the client going away (the handler task
        is cancelled). A refused dispatch holds nothing, so it is not reported.
        """
        deadline_at = asyncio.get_running_loop().time() + budget.seconds
        error: BaseException | None = None
        refused = False
        work = _work_submitted(
            new_id(),
            tenant_id,
            deployment_id,
            request,
            cost=_cost_of(payload, cost),
            inputs=work_inputs(payload),
            budget=budget,
        )
        credit = self._take_credit(work)
        try:
            async with asyncio.timeout_at(deadline_at):
                try:
                    dispatch = await self._dispatch(work, credit, operation=operation_of(payload))
                except GantryError as refusal:
                    # A refusal assigned nothing; a timed-out answer may have, so report that.
                    refused = refusal.reason != "SCHEDULER_UNAVAILABLE"
                    if refused:
                        metrics.admission_rejected(refusal.reason)
                    raise
                result = await self._invoke_on_worker(
                    dispatch.node_id, work, payload, deadline_at, on_progress
                )
            return dispatch.node_id, answer(result)
        except TimeoutError:
            error = _deadline_exceeded(budget, work.work_id)
            raise error from None
        except BaseException as failure:
            error = failure
            raise
        finally:
            if not refused:
                self._report_finished(work, error, budget, request.capability, credit)

    def _take_credit(self, work: scheduler_pb2.WorkSubmitted) -> HeldCredit | None:
        """A credit for the call, if this control plane holds an idle one: INTERACTIVE calls only
        (the scheduler grants credits for that class alone)."""
        if self._credits is None or work.priority != common_pb2.PRIORITY_INTERACTIVE:
            return None
        return self._credits.take(work.deployment_id, work.tenant_id, work.inputs)

    async def _dispatch(
        self, work: scheduler_pb2.WorkSubmitted, credit: HeldCredit | None, *, operation: str
    ) -> scheduler_pb2.Dispatch:
        """The scheduler's choice of node (the credit's, when the call has one), its wait counted
        as the schedule stage."""
        started = time.perf_counter()
        if credit is not None:
            dispatch = scheduler_pb2.Dispatch(
                work_id=work.work_id,
                residency_id=credit.residency_id,
                node_id=credit.node_id,
                deployment_id=credit.deployment_id,
            )
        else:
            dispatch = await self._scheduler.dispatch(work, timeout=work.timeout_seconds)
        metrics.stage_finished(operation, metrics.STAGE_SCHEDULE, time.perf_counter() - started)
        return dispatch

    async def _invoke_on_worker(
        self,
        node_id: str,
        work: scheduler_pb2.WorkSubmitted,
        payload: InvokePayload,
        deadline_at: float,
        on_progress: OnProgress | None,
    ) -> wg.InvokeResult:
        """The chosen worker's result, its wait counted as the worker stage."""
        started = time.perf_counter()
        trace_context: dict[str, str] = {}
        inject_context(trace_context)
        wall_deadline = timestamp_pb2.Timestamp()
        wall_deadline.FromDatetime(self._clock.now() + dt.timedelta(seconds=work.timeout_seconds))
        result = await self._hub.invoke(
            node_id=node_id,
            request_id=work.work_id,
            deployment_id=work.deployment_id,
            capability=metrics.resolved_capability(work.deployment_id),
            payload=payload,
            timeout=max(0.0, deadline_at - asyncio.get_running_loop().time()),
            trace_context=trace_context,
            deadline=wall_deadline,
            on_progress=on_progress,
            progress_limit=self._settings.stream_backlog_limit,
        )
        metrics.stage_finished(
            operation_of(payload), metrics.STAGE_WORKER, time.perf_counter() - started
        )
        return result

    def _report_finished(
        self,
        work: scheduler_pb2.WorkSubmitted,
        error: BaseException | None,
        budget: CallBudget,
        capability: str,
        credit: HeldCredit | None,
    ) -> None:
        """The scheduler's one WorkFinished (a credited call's through its pool), and the outcome
        for the degradation signal."""
        outcome = work_outcome(error, budget)
        reason = error.reason if isinstance(error, GantryError) else ""
        if credit is not None and self._credits is not None:
            self._credits.finish(credit, work.work_id, outcome, reason=reason, cost=work.cost)
        else:
            self._scheduler.work_finished(work.work_id, outcome, reason=reason)
        counted = degradation_outcome(error, budget)
        if self._degradation is not None and counted is not None:
            self._degradation.record(capability, succeeded=counted)
