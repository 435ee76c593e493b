"""Inference.Embed and Inference.Rerank: the front door. Caller's tenant from its key, route via
the scheduler."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf import timestamp_pb2

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.common.ids import new_id
from gantry.common.inference_limits import InferenceLimits
from gantry.common.telemetry import inject_context, tracer
from gantry.controlplane import metrics
from gantry.controlplane.domain.capability_degradation import CapabilityDegradation
from gantry.controlplane.domain.work_cost import embed_cost, rerank_cost
from gantry.controlplane.inference_validation import validate_inputs, validate_rerank
from gantry.controlplane.persistence.database import Database
from gantry.controlplane.route_cache import RouteCache
from gantry.controlplane.routing import DeploymentResolver
from gantry.controlplane.scheduler_link import SchedulerLink
from gantry.controlplane.vector_wire import vectors_wire
from gantry.controlplane.worker_sessions import WorkerHub
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

_tracer = tracer("gantry.controlplane")
_Answer = TypeVar("_Answer")

DEFAULT_MAX_INVOKE_SECONDS = 300.0
_OUTCOME_BY_CLASS = {
    common_pb2.FAILURE_CLASS_INFRA: scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE,
    common_pb2.FAILURE_CLASS_REQUEST: scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE,
    common_pb2.FAILURE_CLASS_CONFIG: scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE,
}


def work_cost(payload: wg.EmbedPayload | wg.RerankPayload) -> int:
    """The call's cost for the scheduler (domain/work_cost.py): bytes of text, at least 1."""
    if isinstance(payload, wg.RerankPayload):
        return rerank_cost(payload.query, payload.documents)
    return embed_cost(payload.inputs)


def ranked(scores: Sequence[float], top_n: int) -> list[inference_pb2.RankedDocument]:
    """Documents by score, highest first, ties by lower index; the first `top_n` (0 = all)."""
    if any(not math.isfinite(score) for score in scores):
        raise GantryError("INVOKE_FAILED", "the worker returned a non-finite rerank score")
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    if top_n:
        order = order[:top_n]
    return [inference_pb2.RankedDocument(index=index, score=scores[index]) for index in order]


@dataclass(frozen=True, kw_only=True)
class InferenceSettings:
    # The server's own bound on one call, applied only when the client asks for longer or sets
    # no deadline: a client that asks for 120 s gets 120 s.
    max_invoke_seconds: float = DEFAULT_MAX_INVOKE_SECONDS
    limits: InferenceLimits = field(default_factory=InferenceLimits)


@dataclass(frozen=True, slots=True)
class CallBudget:
    """How long one call may take, and whose limit that is."""

    seconds: float
    client_bounded: bool  # the client's deadline, not the server cap, is the binding limit

    @classmethod
    def of(cls, client_remaining: float | None, *, max_seconds: float) -> CallBudget:
        if client_remaining is not None and client_remaining <= max_seconds:
            return cls(seconds=max(0.0, client_remaining), client_bounded=True)
        return cls(seconds=max_seconds, client_bounded=False)


def work_outcome(error: BaseException | None, budget: CallBudget) -> scheduler_pb2.WorkOutcome:
    """How finished work counts for the scheduler's health accounting; one place decides.

    A client that goes away is CANCELLED, never INFRA. A deadline that passes counts as INFRA
    (a timeout, per CONTRACTS.md) only when it was the server's own cap: a deadline the client
    chose says nothing about the residency, and counting it would let any client with tight
    deadlines trip breakers on healthy residencies. The client still sees DEADLINE_EXCEEDED.
    """
    if error is None:
        return scheduler_pb2.WORK_OUTCOME_SUCCESS
    if isinstance(error, asyncio.CancelledError):
        return scheduler_pb2.WORK_OUTCOME_CANCELLED
    if isinstance(error, GantryError):
        if error.reason == "DEADLINE_EXCEEDED" and budget.client_bounded:
            return scheduler_pb2.WORK_OUTCOME_CANCELLED
        return _OUTCOME_BY_CLASS[error.failure_class.value]
    return scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE


# Outcomes that say something about the runtime (a bad request or a client that left does not).
_RUNTIME_OUTCOMES = (scheduler_pb2.WORK_OUTCOME_SUCCESS, scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE)


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        *,
        database: Database,
        hub: WorkerHub,
        scheduler: SchedulerLink,
        routes: RouteCache,
        clock: Clock,
        settings: InferenceSettings | None = None,
        resolver: DeploymentResolver | None = None,
        degradation: CapabilityDegradation | None = None,
    ) -> None:
        self._database = database
        # Each finished invocation's outcome, per capability: the degradation signal's input.
        self._degradation = degradation
        self._routes = routes
        self._hub = hub
        self._scheduler = scheduler
        self._clock = clock
        self._settings = settings or InferenceSettings()
        self._resolver = resolver or DeploymentResolver(database=database, routes=routes)

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        return await _counted(metrics.EMBED, self._embed(request, context))

    async def Rerank(
        self, request: inference_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.RerankResponse:
        return await _counted(metrics.RERANK, self._rerank(request, context))

    async def _embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        tenant_id = current_principal().subject
        inputs = list(request.inputs)
        validate_inputs(inputs, self._settings.limits)
        budget = CallBudget.of(
            context.time_remaining(), max_seconds=self._settings.max_invoke_seconds
        )
        with _tracer.start_as_current_span(
            "controlplane.embed", attributes={"gantry.tenant_id": tenant_id}
        ) as span:
            deployment_id = await self._resolve(metrics.EMBED, request)
            span.set_attribute("gantry.deployment_id", deployment_id)
            node_id, outcome = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=wg.EmbedPayload(inputs=inputs, truncate=request.truncate),
                budget=budget,
            )
            result = outcome.embed
            encoding = request.encoding or inference_pb2.VECTOR_ENCODING_FLOAT_LIST
            response = inference_pb2.EmbedResponse(
                dim=result.dim, deployment_id=deployment_id, node_id=node_id, encoding=encoding
            )
            response.MergeFromString(vectors_wire(result, encoding))
            return response

    async def _rerank(
        self, request: inference_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.RerankResponse:
        tenant_id = current_principal().subject
        documents = list(request.documents)
        validate_rerank(request.query, documents, self._settings.limits)
        budget = CallBudget.of(
            context.time_remaining(), max_seconds=self._settings.max_invoke_seconds
        )
        with _tracer.start_as_current_span(
            "controlplane.rerank",
            attributes={"gantry.tenant_id": tenant_id, "gantry.document_count": len(documents)},
        ) as span:
            deployment_id = await self._resolve(metrics.RERANK, request)
            span.set_attribute("gantry.deployment_id", deployment_id)
            # Whether the deployment's adapter reranks is its model host's to say: a rerank sent
            # to an embedding deployment comes back INVALID_PAYLOAD, as the client's error.
            node_id, outcome = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=wg.RerankPayload(
                    query=request.query, documents=documents, truncate=request.truncate
                ),
                budget=budget,
            )
            return inference_pb2.RerankResponse(
                results=ranked(list(outcome.rerank.scores), request.top_n),
                deployment_id=deployment_id,
                node_id=node_id,
            )

    async def _invoke(
        self,
        *,
        tenant_id: str,
        deployment_id: str,
        request: inference_pb2.EmbedRequest | inference_pb2.RerankRequest,
        payload: wg.EmbedPayload | wg.RerankPayload,
        budget: CallBudget,
    ) -> tuple[str, wg.InvokeResult]:
        """Dispatch through the scheduler and invoke on the chosen worker, within the budget.

        Once the work is submitted the scheduler hears exactly one WorkFinished for it, whatever
        happens: the answer, a failure, the deadline, or the client going away (the handler task
        is cancelled). A refused dispatch holds nothing, so it is not reported.
        """
        loop = asyncio.get_running_loop()
        deadline_at = loop.time() + budget.seconds
        work_id = new_id()
        error: BaseException | None = None
        refused = False
        operation = metrics.RERANK if isinstance(payload, wg.RerankPayload) else metrics.EMBED
        stage_started = time.perf_counter()
        try:
            async with asyncio.timeout_at(deadline_at):
                try:
                    dispatch = await self._scheduler.dispatch(
                        scheduler_pb2.WorkSubmitted(
                            work_id=work_id,
                            tenant_id=tenant_id,
                            priority=request.priority or common_pb2.PRIORITY_INTERACTIVE,
                            deployment_id=deployment_id,
                            capability=request.capability,
                            cost=work_cost(payload),
                            # Work still queued past the call's budget has no one to answer.
                            timeout_seconds=budget.seconds,
                        ),
                        timeout=budget.seconds,
                    )
                except GantryError as refusal:
                    # A refusal assigned nothing; a timed-out answer may have, so report that.
                    refused = refusal.reason != "SCHEDULER_UNAVAILABLE"
                    if refused:
                        metrics.admission_rejected(refusal.reason)
                    raise
                decided_at = time.perf_counter()
                metrics.stage_finished(
                    operation, metrics.STAGE_SCHEDULE, decided_at - stage_started
                )
                stage_started = decided_at
                trace_context: dict[str, str] = {}
                inject_context(trace_context)
                wall_deadline = timestamp_pb2.Timestamp()
                wall_deadline.FromDatetime(self._clock.now() + dt.timedelta(seconds=budget.seconds))
                result = await self._hub.invoke(
                    node_id=dispatch.node_id,
                    request_id=work_id,
                    deployment_id=deployment_id,
                    payload=payload,
                    timeout=max(0.0, deadline_at - loop.time()),
                    trace_context=trace_context,
                    deadline=wall_deadline,
                )
                metrics.stage_finished(
                    operation, metrics.STAGE_WORKER, time.perf_counter() - stage_started
                )
            return dispatch.node_id, result
        except TimeoutError:
            error = GantryError(
                "DEADLINE_EXCEEDED",
                f"no answer within {budget.seconds:.1f}s "
                f"({'the client deadline' if budget.client_bounded else 'the server cap'})",
                work_id=work_id,
            )
            raise error from None
        except BaseException as failure:
            error = failure
            raise
        finally:
            if not refused:
                outcome = work_outcome(error, budget)
                self._scheduler.work_finished(
                    work_id, outcome, reason=error.reason if isinstance(error, GantryError) else ""
                )
                if self._degradation is not None and outcome in _RUNTIME_OUTCOMES:
                    self._degradation.record(
                        request.capability, succeeded=outcome == scheduler_pb2.WORK_OUTCOME_SUCCESS
                    )

    async def _resolve(
        self, operation: str, request: inference_pb2.EmbedRequest | inference_pb2.RerankRequest
    ) -> str:
        """capability | deployment_id -> a routable deployment, or a typed reason why not.

        By capability the binding alone decides (routing.py): never another deployment.
        """
        started = time.perf_counter()
        deployment_id = await self._resolver.resolve(request)
        metrics.stage_finished(operation, metrics.STAGE_RESOLVE, time.perf_counter() - started)
        return deployment_id


async def _counted(operation: str, answer: Awaitable[_Answer]) -> _Answer:
    """Await one call's answer and count it, whatever it is: the status and reason the client
    sees (validation errors included) and the whole call's latency."""
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        return await answer
    except BaseException as failure:
        error = failure
        raise
    finally:
        metrics.invocation_answered(operation, error, time.perf_counter() - started)
