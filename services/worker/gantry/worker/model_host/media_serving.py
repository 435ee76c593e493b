"""The model host's requests that run alone: a clip to transcribe, images to read, embed or
classify, and any operation added since, answered by the adapter's method named as its kind.

Each runs alone, never batched with another request: one request's images are already a batch
(generated or embedded `max_batch_size` at a time by the adapter), and a clip is up to 60 windows
of generation. The bytes are decoded here, in the host only (`audio_decoding` inside the Whisper
adapter, `image_decoding` here for every image adapter), so a payload the host cannot take is
answered INVALID_PAYLOAD naming the field, and no forward pass is counted as failed. Each request
is one span, `model_host.<kind>`, with what it carried (bytes, media types, pixels once decoded).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.common.telemetry import extract_context
from gantry.v1 import model_host_pb2, worker_gateway_pb2
from gantry.worker.model_host.adapters import ModelAdapter
from gantry.worker.model_host.image_decoding import decode_images
from gantry.worker.model_host.inbox import ResponseWriter
from gantry.worker.model_host.input_lengths import first_overlong

if TYPE_CHECKING:
    from PIL import Image as PILImage

logger = logging.getLogger("gantry.model_host")

_ImagePayload = (
    worker_gateway_pb2.RecognizeTextPayload
    | worker_gateway_pb2.EmbedImagePayload
    | worker_gateway_pb2.ClassifyImagePayload
)

# The serving loop's answer to a forward pass that raised: logged, recorded on the span,
# INVOKE_FAILED unless it is a GantryError already.
FailForwardPass = Callable[[model_host_pb2.HostRequest, trace.Span, Exception], None]
Answer = TypeVar("Answer")


def _refuse_payload(
    responses: ResponseWriter,
    request: model_host_pb2.HostRequest,
    span: trace.Span,
    exc: GantryError,
) -> None:
    """Answer a request the adapter refused with its own error, ending its span."""
    # The client's payload (INVALID_PAYLOAD, INPUT_TOO_LONG): answered as it is, and no forward
    # pass failed.
    kind = request.WhichOneof("kind")
    logger.info("%s request %d refused: %s", kind, request.request_id, exc.message)
    span.set_status(trace.Status(trace.StatusCode.ERROR, exc.reason))
    span.end()
    responses.fail(request, exc)


class RequestRunner:
    """What a runner of one kind of request (media, generate) holds: the adapter, where answers
    go, the tracer, and the serving loop's answer to a forward pass that raised."""

    def __init__(
        self,
        *,
        adapter: ModelAdapter,
        responses: ResponseWriter,
        tracer: trace.Tracer,
        fail: FailForwardPass,
    ) -> None:
        self._adapter = adapter
        self._responses = responses
        self._tracer = tracer
        self._fail = fail

    def _forward(
        self, request: model_host_pb2.HostRequest, span: trace.Span, forward: Callable[[], Answer]
    ) -> Answer | None:
        """What `forward()` gives, or None once its failure is answered (the span ended): the
        adapter's refusal of the payload as it is, any other exception as a failed pass."""
        try:
            return forward()
        except GantryError as exc:
            _refuse_payload(self._responses, request, span, exc)
        except Exception as exc:
            self._fail(request, span, exc)
        return None


class MediaRequests(RequestRunner):
    """Runs one media request on the adapter and answers it."""

    def run(self, request: model_host_pb2.HostRequest) -> None:
        """Answer `request`, an operation's request that runs alone (not an embed, a rerank or a
        generation: serving.py) and whose kind the adapter serves."""
        kind = request.WhichOneof("kind")
        span = self._tracer.start_span(
            f"model_host.{kind}",
            context=extract_context(request.trace_context),
            attributes=_payload_attributes(request),
        )
        response = self._forward(request, span, lambda: self._answer(request, span))
        if response is None:
            return
        span.end()
        response.request_id = request.request_id
        self._responses.send(response)

    def _answer(
        self, request: model_host_pb2.HostRequest, span: trace.Span
    ) -> model_host_pb2.HostResponse:
        """The adapter's answer to `request`, found by its kind: a media kind's way of decoding
        and answering (below), else the adapter's method named as the kind, given the payload
        and giving the result (gantry.common.operations names the field it answers in)."""
        kind = request.WhichOneof("kind") or ""
        payload = getattr(request, kind)
        answer = _MEDIA_ANSWERS.get(kind)
        if answer is not None:
            return answer(self, payload, span)
        result_kind = operations.by_kind(kind).result_kind
        response = model_host_pb2.HostResponse()
        getattr(response, result_kind).CopyFrom(getattr(self._adapter, kind)(payload))
        return response

    def _transcribe(
        self, payload: worker_gateway_pb2.TranscribePayload, span: trace.Span
    ) -> model_host_pb2.HostResponse:
        transcript = self._adapter.transcribe(payload)
        span.set_attribute("gantry.audio_seconds", transcript.audio_seconds)
        return model_host_pb2.HostResponse(transcribe=transcript)

    def _recognize_text(
        self, payload: worker_gateway_pb2.RecognizeTextPayload, span: trace.Span
    ) -> model_host_pb2.HostResponse:
        images = self._decoded(payload, span)
        texts = self._adapter.recognize_text(images)
        return model_host_pb2.HostResponse(
            recognize_text=worker_gateway_pb2.RecognizeTextResult(texts=texts)
        )

    def _embed_image(
        self, payload: worker_gateway_pb2.EmbedImagePayload, span: trace.Span
    ) -> model_host_pb2.HostResponse:
        vectors = self._adapter.embed_image(self._decoded(payload, span))
        return model_host_pb2.HostResponse(
            embed=worker_gateway_pb2.EmbedResult(
                count=vectors.shape[0],
                dim=vectors.shape[1],
                float32_le=vectors.tobytes(order="C"),
            )
        )

    @staticmethod
    def _decoded(payload: _ImagePayload, span: trace.Span) -> list[PILImage.Image]:
        images = decode_images(payload.images, max_pixels=payload.max_image_pixels)
        span.set_attribute("gantry.image_pixels", _pixels(images))
        return images

    def _classify(
        self, payload: worker_gateway_pb2.ClassifyImagePayload, span: trace.Span
    ) -> model_host_pb2.HostResponse:
        labels = list(payload.labels)
        if not labels:
            raise GantryError(
                "INVALID_PAYLOAD", "a classify_image request needs labels", field="labels"
            )
        # A label is a text like any other: past the model's token limit it is refused, never
        # silently cut (there is no truncate for labels).
        refusal = first_overlong(
            self._adapter.embed_token_counts(labels), self._adapter.token_limit, field="labels"
        )
        if refusal is not None:
            raise refusal
        images = self._decoded(payload, span)
        scores = self._adapter.classify_image(images, labels)
        return model_host_pb2.HostResponse(
            classify_image=worker_gateway_pb2.ClassifyImageResult(
                count=len(images), labels=len(labels), scores=scores.reshape(-1).tolist()
            )
        )


# kind -> how a media request is decoded and answered (a kind not here: `_answer`'s default).
_MEDIA_ANSWERS: dict[
    str, Callable[[MediaRequests, Any, trace.Span], model_host_pb2.HostResponse]
] = {
    "transcribe": MediaRequests._transcribe,
    "recognize_text": MediaRequests._recognize_text,
    "embed_image": MediaRequests._embed_image,
    "classify_image": MediaRequests._classify,
}


def _pixels(images: Sequence[PILImage.Image]) -> int:
    return sum(image.width * image.height for image in images)


def _payload_attributes(request: model_host_pb2.HostRequest) -> dict[str, str | int]:
    kind = request.WhichOneof("kind")
    if kind == "transcribe":
        audio = request.transcribe.audio
        return {"gantry.audio_bytes": len(audio.data), "gantry.media_type": audio.media_type}
    payload = getattr(request, kind or "")
    if "images" not in payload.DESCRIPTOR.fields_by_name:
        return {}  # an operation without media: its adapter method names what it wants seen
    images = list(payload.images)
    attributes: dict[str, str | int] = {
        "gantry.image_count": len(images),
        "gantry.image_bytes": sum(len(image.data) for image in images),
        "gantry.media_type": ",".join(sorted({image.media_type for image in images})),
    }
    if kind == "classify_image":
        attributes["gantry.label_count"] = len(request.classify_image.labels)
    return attributes
