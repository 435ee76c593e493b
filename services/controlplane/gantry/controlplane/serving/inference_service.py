"""The Inference front door: the caller's tenant from its key, the deployment from the binding or
its id, the scheduler's dispatch, the chosen worker's answer. Embed and Rerank are answered here;
the media RPCs' bodies live in media_inference.py, Generate's and GenerateStream's in
generation_inference.py, and take the same path (`_invoke`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from google.protobuf import timestamp_pb2

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.common.ids import new_id
from gantry.common.telemetry import inject_context, tracer
from gantry.controlplane.nodes.sessions import InvokePayload, OnProgress, WorkerHub
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.serving.generation_inference import DeploymentAdapters, GenerationInference
from gantry.controlplane.serving.inference_calls import (
    DEFAULT_MAX_INVOKE_SECONDS,
    RUNTIME_OUTCOMES,
    CallBudget,
    InferenceSettings,
    counted,
    operation_of,
    work_outcome,
)
from gantry.controlplane.serving.inference_validation import validate_inputs, validate_rerank
from gantry.controlplane.serving.media_inference import MediaInference
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import DeploymentResolver, TargetedRequest
from gantry.controlplane.serving.vector_wire import vectors_wire
from gantry.controlplane.serving.work_cost import embed_cost, rerank_cost
from gantry.v1 import common_pb2, inference_pb2, inference_pb2_grpc, scheduler_pb2
from gantry.v1 import worker_gateway_pb2 as wg

# Kept importable from here, where callers have always found them.
__all__ = [
    "DEFAULT_MAX_INVOKE_SECONDS",
    "CallBudget",
    "InferenceService",
    "InferenceSettings",
    "ranked",
    "work_cost",
    "work_outcome",
]

_tracer = tracer("gantry.controlplane")
_Answer = TypeVar("_Answer")


def work_cost(payload: wg.EmbedPayload | wg.RerankPayload) -> int:
    """A text call's cost for the scheduler (serving/work_cost.py): bytes of text, at least 1.
    A media call's cost comes from its headers, read by its handler (media_inference.py)."""
    if isinstance(payload, wg.RerankPayload):
        return rerank_cost(payload.query, payload.documents)
    return embed_cost(payload.inputs)


def embedding_response(
    result: wg.EmbedResult, encoding: inference_pb2.VectorEncoding, *, inputs: int
) -> inference_pb2.EmbedResponse:
    """The vectors of `result` as the client's response (its deployment and node left unset):
    one per input, else INVOKE_FAILED; a block whose size disagrees with count x dim is
    INVOKE_FAILED too (vector_wire)."""
    if result.count != inputs:
        raise GantryError(
            "INVOKE_FAILED", f"the worker returned {result.count} vectors for {inputs} inputs"
        )
    encoding = encoding or inference_pb2.VECTOR_ENCODING_FLOAT_LIST
    response = inference_pb2.EmbedResponse(dim=result.dim, encoding=encoding)
    response.MergeFromString(vectors_wire(result, encoding))
    return response


def ranked(
    scores: Sequence[float], top_n: int, *, documents: int
) -> list[inference_pb2.RankedDocument]:
    """Documents by score, highest first, ties by lower index; the first `top_n` (0 = all).
    One finite score per document, else INVOKE_FAILED (an extra score would name a document
    the request does not hold)."""
    if len(scores) != documents:
        raise GantryError(
            "INVOKE_FAILED", f"the worker returned {len(scores)} scores for {documents} documents"
        )
    if any(not math.isfinite(score) for score in scores):
        raise GantryError("INVOKE_FAILED", "the worker returned a non-finite rerank score")
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    if top_n:
        order = order[:top_n]
    return [inference_pb2.RankedDocument(index=index, score=scores[index]) for index in order]


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
        self._media = MediaInference(
            invoke=self._invoke, resolve=self._resolve, settings=self._settings
        )
        self._generation = GenerationInference(
            invoke=self._invoke,
            resolve=self._resolve,
            adapter_of=DeploymentAdapters(database),
            settings=self._settings,
        )

    async def Embed(
        self, request: inference_pb2.EmbedRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        return await counted(metrics.EMBED, self._embed(request, context))

    async def Rerank(
        self, request: inference_pb2.RerankRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.RerankResponse:
        return await counted(metrics.RERANK, self._rerank(request, context))

    async def Transcribe(
        self, request: inference_pb2.TranscribeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.TranscribeResponse:
        return await counted(metrics.TRANSCRIBE, self._media.transcribe(request, context))

    async def RecognizeText(
        self, request: inference_pb2.RecognizeTextRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.RecognizeTextResponse:
        return await counted(metrics.RECOGNIZE_TEXT, self._media.recognize_text(request, context))

    async def EmbedImage(
        self, request: inference_pb2.EmbedImageRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        return await counted(metrics.EMBED_IMAGE, self._media.embed_image(request, context))

    async def ClassifyImage(
        self, request: inference_pb2.ClassifyImageRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ClassifyImageResponse:
        return await counted(metrics.CLASSIFY_IMAGE, self._media.classify_image(request, context))

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.GenerateResponse:
        return await counted(metrics.GENERATE, self._generation.generate(request, context))

    async def GenerateStream(
        self, request: inference_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        # A coroutine that writes, not an async generator: a client that goes away cancels this
        # task wherever it waits (a write included), so the invocation is cancelled at once and
        # not whenever an abandoned generator is collected.
        await counted(metrics.GENERATE_STREAM, self._generation.generate_stream(request, context))

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
            node_id, response = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=wg.EmbedPayload(inputs=inputs, truncate=request.truncate),
                budget=budget,
                answer=lambda result: embedding_response(
                    result.embed, request.encoding, inputs=len(inputs)
                ),
            )
            response.deployment_id, response.node_id = deployment_id, node_id
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
            node_id, results = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=wg.RerankPayload(
                    query=request.query, documents=documents, truncate=request.truncate
                ),
                budget=budget,
                answer=lambda result: ranked(
                    list(result.rerank.scores), request.top_n, documents=len(documents)
                ),
            )
            return inference_pb2.RerankResponse(
                results=results, deployment_id=deployment_id, node_id=node_id
            )

    async def _invoke(
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
        loop = asyncio.get_running_loop()
        deadline_at = loop.time() + budget.seconds
        work_id = new_id()
        error: BaseException | None = None
        refused = False
        operation = operation_of(payload)
        if cost is None:
            if not isinstance(payload, wg.EmbedPayload | wg.RerankPayload):
                raise TypeError(f"a {type(payload).__name__} needs its cost from its handler")
            cost = work_cost(payload)
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
                            cost=cost,
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
                    capability=metrics.resolved_capability(deployment_id),
                    payload=payload,
                    timeout=max(0.0, deadline_at - loop.time()),
                    trace_context=trace_context,
                    deadline=wall_deadline,
                    on_progress=on_progress,
                    progress_limit=self._settings.stream_backlog_limit,
                )
                metrics.stage_finished(
                    operation, metrics.STAGE_WORKER, time.perf_counter() - stage_started
                )
            return dispatch.node_id, answer(result)
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
                if self._degradation is not None and outcome in RUNTIME_OUTCOMES:
                    self._degradation.record(
                        request.capability, succeeded=outcome == scheduler_pb2.WORK_OUTCOME_SUCCESS
                    )

    async def _resolve(self, operation: str, request: TargetedRequest) -> str:
        """capability | deployment_id -> a routable deployment, or a typed reason why not.

        By capability the binding alone decides (routing.py): never another deployment. From
        here on the call is counted under that deployment and its capability.
        """
        started = time.perf_counter()
        target = await self._resolver.resolve_target(request)
        metrics.call_resolved(target.capability, target.deployment_id)
        metrics.stage_finished(operation, metrics.STAGE_RESOLVE, time.perf_counter() - started)
        return target.deployment_id
