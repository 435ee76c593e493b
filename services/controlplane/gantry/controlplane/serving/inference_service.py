"""The Inference front door: the caller's tenant from its key, the deployment from the binding or
its id, the scheduler's dispatch, the chosen worker's answer. Embed and Rerank are answered here;
the media RPCs' bodies live in media_inference.py, Generate's and GenerateStream's in
generation_inference.py, and take the same path (invocation.py)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TypeVar

import grpc

from gantry.common.auth import current_principal
from gantry.common.clock import Clock
from gantry.common.errors import GantryError
from gantry.common.telemetry import tracer
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform import metrics
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.capability_degradation import CapabilityDegradation
from gantry.controlplane.serving.generation_inference import DeploymentAdapters, GenerationInference
from gantry.controlplane.serving.inference_calls import (
    DEFAULT_MAX_INVOKE_SECONDS,
    CallBudget,
    InferenceSettings,
    counted,
    work_outcome,
)
from gantry.controlplane.serving.inference_validation import validate_inputs, validate_rerank
from gantry.controlplane.serving.invocation import Invocation, work_cost
from gantry.controlplane.serving.media_inference import MediaInference
from gantry.controlplane.serving.route_cache import RouteCache
from gantry.controlplane.serving.routing import DeploymentResolver, TargetedRequest
from gantry.controlplane.serving.vector_wire import vectors_wire
from gantry.v1 import inference_pb2, inference_pb2_grpc
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
        # What resolves a call's deployment (and reads its adapter settings)...
        database: Database,
        routes: RouteCache,
        resolver: DeploymentResolver | None = None,
        # ...and what invokes it there (invocation.py).
        scheduler: SchedulerLink,
        hub: WorkerHub,
        clock: Clock,
        settings: InferenceSettings | None = None,
        degradation: CapabilityDegradation | None = None,
    ) -> None:
        self._settings = settings or InferenceSettings()
        self._resolver = resolver or DeploymentResolver(database=database, routes=routes)
        self._invoke = Invocation(
            hub=hub,
            scheduler=scheduler,
            clock=clock,
            settings=self._settings,
            degradation=degradation,
        )
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
