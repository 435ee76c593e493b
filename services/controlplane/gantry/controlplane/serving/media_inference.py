"""Inference.Transcribe, RecognizeText, EmbedImage and ClassifyImage: the media operations' calls.

Each call takes the path Embed takes (inference_service.py: the caller's tenant from its key, the
deployment from the binding, the scheduler's dispatch, the worker's model host), after its media
are checked by their headers alone (media_validation.py): nothing is decoded here. The payload
carries the control plane's pixel and seconds limits, which the model host checks again on what
it decoded. Whether a deployment's adapter does this kind of work is its model host's to say: a
Transcribe sent to an embedding deployment comes back INVALID_PAYLOAD, as the client's error.
Each function here is one operation's entry in `operations.PREPARED`.
"""

from __future__ import annotations

from gantry.common.inference_limits import InferenceLimits
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
from gantry.controlplane.serving.prepared_call import PreparedCall
from gantry.controlplane.serving.text_answers import embedding_response
from gantry.controlplane.serving.work_cost import audio_cost, classify_cost, image_cost
from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def prepare_transcribe(
    request: inference_pb2.TranscribeRequest, limits: InferenceLimits
) -> PreparedCall:
    header = validate_audio(request.audio if request.HasField("audio") else None, limits)
    return PreparedCall(
        payload=wg.TranscribePayload(
            audio=request.audio,
            language=request.language,
            timestamps=request.timestamps,
            max_audio_seconds=float(limits.max_audio_seconds),
        ),
        cost=audio_cost(header.seconds),
        attributes={"gantry.audio_seconds": round(header.seconds, 3)},
        answer=lambda result: transcription(result.transcribe, timestamps=request.timestamps),
    )


def prepare_recognize_text(
    request: inference_pb2.RecognizeTextRequest, limits: InferenceLimits
) -> PreparedCall:
    headers = validate_images(request.images, limits)
    return PreparedCall(
        payload=wg.RecognizeTextPayload(
            images=request.images, max_image_pixels=limits.max_image_pixels
        ),
        cost=image_cost(header.pixels for header in headers),
        attributes={"gantry.image_count": len(headers)},
        answer=lambda result: inference_pb2.RecognizeTextResponse(
            texts=recognized_texts(result.recognize_text, images=len(headers))
        ),
    )


def prepare_embed_image(
    request: inference_pb2.EmbedImageRequest, limits: InferenceLimits
) -> PreparedCall:
    headers = validate_images(request.images, limits)
    return PreparedCall(
        payload=wg.EmbedImagePayload(
            images=request.images, max_image_pixels=limits.max_image_pixels
        ),
        cost=image_cost(header.pixels for header in headers),
        attributes={"gantry.image_count": len(headers)},
        # One vector per image, else INVOKE_FAILED, shaped as an Embed's.
        answer=lambda result: embedding_response(
            checked_image_embeddings(result.embed, images=len(headers)),
            request.encoding,
            inputs=len(headers),
        ),
    )


def prepare_classify_image(
    request: inference_pb2.ClassifyImageRequest, limits: InferenceLimits
) -> PreparedCall:
    headers = validate_images(request.images, limits)
    labels = list(request.labels)
    validate_labels(labels, limits)
    return PreparedCall(
        payload=wg.ClassifyImagePayload(
            images=request.images, labels=labels, max_image_pixels=limits.max_image_pixels
        ),
        cost=classify_cost((header.pixels for header in headers), labels),
        attributes={"gantry.image_count": len(headers), "gantry.label_count": len(labels)},
        answer=lambda result: inference_pb2.ClassifyImageResponse(
            results=classifications(
                result.classify_image, labels=labels, images=len(headers), top_k=request.top_k
            )
        ),
    )
