"""Checking a model host's answer before the worker trusts it (pure).

The host is a sandboxed child running third-party model code: its answer is input like any other,
so an answer whose shape disagrees with the request (an embed's rows or bytes, a rerank's scores,
a transcript's segment times, a text per image, a classification's probabilities) is refused,
never sent on.
"""

from __future__ import annotations

import math

from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2, worker_gateway_pb2


def checked_embed(
    response: model_host_pb2.HostResponse, *, input_count: int, dim: int
) -> worker_gateway_pb2.EmbedResult:
    """The embed result, when it has one row of the loaded width per input; its failure raised."""
    kind = response.WhichOneof("kind")
    if kind == "failure":
        raise GantryError.from_failure(response.failure)
    if kind != "embed":
        raise GantryError("INVOKE_FAILED", f"model host answered an embed with {kind!r}")
    result = response.embed
    if (
        result.count != input_count
        or result.dim != dim
        or len(result.float32_le) != result.count * result.dim * 4
    ):
        raise GantryError(
            "INVOKE_FAILED",
            f"model host answered {result.count}x{result.dim} with {len(result.float32_le)} "
            f"bytes for {input_count} inputs of width {dim}",
        )
    return result


def _expect(response: model_host_pb2.HostResponse, kind: str, what: str) -> None:
    answered = response.WhichOneof("kind")
    if answered == "failure":
        raise GantryError.from_failure(response.failure)
    if answered != kind:
        raise GantryError("INVOKE_FAILED", f"model host answered {what} with {answered!r}")


def checked_rerank(
    response: model_host_pb2.HostResponse, *, document_count: int
) -> worker_gateway_pb2.RerankResult:
    """The rerank result, when it has one score per document; its failure raised."""
    _expect(response, "rerank", "a rerank")
    if len(response.rerank.scores) != document_count:
        raise GantryError(
            "INVOKE_FAILED",
            f"model host answered {len(response.rerank.scores)} scores for "
            f"{document_count} documents",
        )
    return response.rerank


def checked_transcribe(
    response: model_host_pb2.HostResponse,
) -> worker_gateway_pb2.TranscribeResult:
    """The transcription, when its segments are in order inside the clip; its failure raised."""
    _expect(response, "transcribe", "a transcribe")
    result = response.transcribe
    previous_start = 0.0
    for index, segment in enumerate(result.segments):
        if not (previous_start <= segment.start_s <= segment.end_s <= result.audio_seconds + 1e-6):
            raise GantryError(
                "INVOKE_FAILED",
                f"model host answered segment {index} at {segment.start_s:g}-{segment.end_s:g} s "
                f"for a {result.audio_seconds:g} s clip (out of order or outside it)",
            )
        previous_start = segment.start_s
    return result


def checked_recognize_text(
    response: model_host_pb2.HostResponse, *, image_count: int
) -> worker_gateway_pb2.RecognizeTextResult:
    """The recognized texts, when there is one per image; its failure raised."""
    _expect(response, "recognize_text", "a recognize_text")
    if len(response.recognize_text.texts) != image_count:
        raise GantryError(
            "INVOKE_FAILED",
            f"model host answered {len(response.recognize_text.texts)} texts for "
            f"{image_count} images",
        )
    return response.recognize_text


def checked_classify_image(
    response: model_host_pb2.HostResponse, *, image_count: int, label_count: int
) -> worker_gateway_pb2.ClassifyImageResult:
    """The classification, when it has a probability in [0, 1] for every image and label; its
    failure raised."""
    _expect(response, "classify_image", "a classify_image")
    result = response.classify_image
    if (
        result.count != image_count
        or result.labels != label_count
        or len(result.scores) != image_count * label_count
    ):
        raise GantryError(
            "INVOKE_FAILED",
            f"model host answered {result.count}x{result.labels} with {len(result.scores)} "
            f"scores for {image_count} images and {label_count} labels",
        )
    for index, score in enumerate(result.scores):
        if not (math.isfinite(score) and 0.0 <= score <= 1.0):
            raise GantryError(
                "INVOKE_FAILED",
                f"model host answered score {score!r} for image {index // label_count}, label "
                f"{index % label_count}: not a probability",
            )
    return result
