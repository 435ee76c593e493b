"""Inference.Transcribe, RecognizeText, EmbedImage and ClassifyImage: the media front door.

Each call takes the path Embed takes (inference_service.py: the caller's tenant from its key, the
deployment from the binding, the scheduler's dispatch, the worker's model host), after its media
are checked by their headers alone (media_validation.py): nothing is decoded here. The payload
carries the control plane's pixel and seconds limits, which the model host checks again on what
it decoded. Whether a deployment's adapter does this kind of work is its model host's to say: a
Transcribe sent to an embedding deployment comes back INVALID_PAYLOAD, as the client's error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc

from gantry.common.auth import current_principal
from gantry.common.telemetry import tracer
from gantry.controlplane.nodes.sessions import InvokePayload
from gantry.controlplane.platform import metrics
from gantry.controlplane.serving.inference_calls import CallBudget, InferenceSettings
from gantry.controlplane.serving.invocation import Invocation
from gantry.controlplane.serving.media_answers import (
    checked_image_embeddings,
    classifications,
    recognized_texts,
    transcription,
)
from gantry.controlplane.serving.media_validation import (
    validate_audio,
    validate_images,
    validate_labels,
)
from gantry.controlplane.serving.routing import TargetedRequest
from gantry.controlplane.serving.vector_wire import vectors_wire
from gantry.controlplane.serving.work_cost import audio_cost, classify_cost, image_cost
from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg

_tracer = tracer("gantry.controlplane")
_Answer = TypeVar("_Answer")
_SPAN_OF_OPERATION = {
    metrics.TRANSCRIBE: "controlplane.transcribe",
    metrics.RECOGNIZE_TEXT: "controlplane.recognize_text",
    metrics.EMBED_IMAGE: "controlplane.embed_image",
    metrics.CLASSIFY_IMAGE: "controlplane.classify_image",
}


# InferenceService's invocation: dispatch through the scheduler, invoke on the chosen worker (its
# progress, if it streams, to `on_progress`), and check and shape its result with `answer` before
# the work is reported finished.
Invoke = Invocation


class Resolve(Protocol):
    """InferenceService._resolve: capability | deployment_id -> a routable deployment."""

    def __call__(self, operation: str, request: TargetedRequest) -> Awaitable[str]: ...


@dataclass(frozen=True, slots=True)
class _Served(Generic[_Answer]):
    deployment_id: str
    node_id: str
    answer: _Answer  # the worker's result, checked and shaped (media_answers)


class MediaInference:
    """The four media RPCs' bodies; InferenceService counts each call and delegates here."""

    def __init__(self, *, invoke: Invoke, resolve: Resolve, settings: InferenceSettings) -> None:
        self._invoke = invoke
        self._resolve = resolve
        self._settings = settings

    async def transcribe(
        self, request: inference_pb2.TranscribeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.TranscribeResponse:
        limits = self._settings.limits
        header = validate_audio(request.audio if request.HasField("audio") else None, limits)
        payload = wg.TranscribePayload(
            audio=request.audio,
            language=request.language,
            timestamps=request.timestamps,
            max_audio_seconds=float(limits.max_audio_seconds),
        )
        served = await self._serve(
            metrics.TRANSCRIBE,
            request,
            context,
            payload=payload,
            cost=audio_cost(header.seconds),
            attributes={"gantry.audio_seconds": round(header.seconds, 3)},
            answer=lambda result: transcription(result.transcribe, timestamps=request.timestamps),
        )
        response = served.answer
        response.deployment_id, response.node_id = served.deployment_id, served.node_id
        return response

    async def recognize_text(
        self, request: inference_pb2.RecognizeTextRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.RecognizeTextResponse:
        limits = self._settings.limits
        headers = validate_images(request.images, limits)
        served = await self._serve(
            metrics.RECOGNIZE_TEXT,
            request,
            context,
            payload=wg.RecognizeTextPayload(
                images=request.images, max_image_pixels=limits.max_image_pixels
            ),
            cost=image_cost(header.pixels for header in headers),
            attributes={"gantry.image_count": len(headers)},
            answer=lambda result: recognized_texts(result.recognize_text, images=len(headers)),
        )
        return inference_pb2.RecognizeTextResponse(
            texts=served.answer,
            deployment_id=served.deployment_id,
            node_id=served.node_id,
        )

    async def embed_image(
        self, request: inference_pb2.EmbedImageRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EmbedResponse:
        limits = self._settings.limits
        headers = validate_images(request.images, limits)
        served = await self._serve(
            metrics.EMBED_IMAGE,
            request,
            context,
            payload=wg.EmbedImagePayload(
                images=request.images, max_image_pixels=limits.max_image_pixels
            ),
            cost=image_cost(header.pixels for header in headers),
            attributes={"gantry.image_count": len(headers)},
            answer=lambda result: _embeddings(
                result, images=len(headers), encoding=request.encoding
            ),
        )
        response = served.answer
        response.deployment_id, response.node_id = served.deployment_id, served.node_id
        return response

    async def classify_image(
        self, request: inference_pb2.ClassifyImageRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ClassifyImageResponse:
        limits = self._settings.limits
        headers = validate_images(request.images, limits)
        labels = list(request.labels)
        validate_labels(labels, limits)
        served = await self._serve(
            metrics.CLASSIFY_IMAGE,
            request,
            context,
            payload=wg.ClassifyImagePayload(
                images=request.images, labels=labels, max_image_pixels=limits.max_image_pixels
            ),
            cost=classify_cost((header.pixels for header in headers), labels),
            attributes={"gantry.image_count": len(headers), "gantry.label_count": len(labels)},
            answer=lambda result: classifications(
                result.classify_image, labels=labels, images=len(headers), top_k=request.top_k
            ),
        )
        return inference_pb2.ClassifyImageResponse(
            results=served.answer,
            deployment_id=served.deployment_id,
            node_id=served.node_id,
        )

    async def _serve(
        self,
        operation: str,
        request: TargetedRequest,
        context: grpc.aio.ServicerContext,
        *,
        payload: InvokePayload,
        cost: int,
        attributes: Mapping[str, str | int | float],
        answer: Callable[[wg.InvokeResult], _Answer],
    ) -> _Served[_Answer]:
        """Resolve the target and invoke the checked payload within the call's budget; the
        worker's result comes back as `answer` checked and shaped it, inside the invoke path."""
        tenant_id = current_principal().subject
        budget = CallBudget.of(
            context.time_remaining(), max_seconds=self._settings.max_invoke_seconds
        )
        with _tracer.start_as_current_span(
            _SPAN_OF_OPERATION[operation],
            attributes={"gantry.tenant_id": tenant_id, **attributes},
        ) as span:
            deployment_id = await self._resolve(operation, request)
            span.set_attribute("gantry.deployment_id", deployment_id)
            node_id, answered = await self._invoke(
                tenant_id=tenant_id,
                deployment_id=deployment_id,
                request=request,
                payload=payload,
                budget=budget,
                answer=answer,
                cost=cost,
            )
            return _Served(deployment_id=deployment_id, node_id=node_id, answer=answered)


def _embeddings(
    result: wg.InvokeResult, *, images: int, encoding: inference_pb2.VectorEncoding
) -> inference_pb2.EmbedResponse:
    """One vector per image in `encoding` (deployment and node left unset); a block whose size
    disagrees with count x dim is INVOKE_FAILED (vector_wire)."""
    checked = checked_image_embeddings(result.embed, images=images)
    encoding = encoding or inference_pb2.VECTOR_ENCODING_FLOAT_LIST
    response = inference_pb2.EmbedResponse(dim=checked.dim, encoding=encoding)
    response.MergeFromString(vectors_wire(checked, encoding))
    return response
