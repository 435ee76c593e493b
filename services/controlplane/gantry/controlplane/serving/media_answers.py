"""A worker's answer to a media call, checked and shaped into the client's response (pure).

The worker's answer is trusted for nothing: a count that does not match the request, a score that
is not a probability, a time that is not a number is the worker failing (INVOKE_FAILED, class
INFRA), never something sent on to the client as if it were an answer. Each check runs inside
the invoke path (InferenceService._invoke's `answer`), before the work is reported finished, so
the scheduler and the breakers count a refused answer against the residency that gave it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gantry.common.errors import GantryError
from gantry.v1 import inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def _failed(message: str) -> GantryError:
    return GantryError("INVOKE_FAILED", message)


def transcription(
    result: wg.TranscribeResult, *, timestamps: bool
) -> inference_pb2.TranscribeResponse:
    """The transcript; its segments only when the client asked for timestamps."""
    if not math.isfinite(result.audio_seconds) or result.audio_seconds < 0:
        raise _failed(f"the worker returned a clip length of {result.audio_seconds} s")
    response = inference_pb2.TranscribeResponse(
        text=result.text, language=result.language, audio_seconds=result.audio_seconds
    )
    if timestamps:
        for segment in result.segments:
            if not (math.isfinite(segment.start_s) and math.isfinite(segment.end_s)):
                raise _failed("the worker returned a segment whose time is not a number")
        response.segments.extend(result.segments)
    return response


def recognized_texts(result: wg.RecognizeTextResult, *, images: int) -> list[str]:
    """One text per image, in the request's order."""
    if len(result.texts) != images:
        raise _failed(f"the worker returned {len(result.texts)} texts for {images} images")
    return list(result.texts)


def checked_image_embeddings(result: wg.EmbedResult, *, images: int) -> wg.EmbedResult:
    """One vector per image (the block's own size is vector_wire's to check)."""
    if result.count != images:
        raise _failed(f"the worker returned {result.count} vectors for {images} images")
    return result


def classifications(
    result: wg.ClassifyImageResult, *, labels: Sequence[str], images: int, top_k: int
) -> list[inference_pb2.ImageClassification]:
    """Per image, its labels by score, highest first, ties by lower label index; the first
    `top_k` (0 = all). Each score must be a probability: SigLIP scores each label on its own (a
    sigmoid), so a row need not sum to 1, but no score may leave [0, 1]."""
    width = len(labels)
    if result.count != images or result.labels != width or len(result.scores) != images * width:
        raise _failed(
            f"the worker returned {len(result.scores)} scores as {result.count} x {result.labels} "
            f"for {images} images x {width} labels"
        )
    scores = list(result.scores)
    if any(not (math.isfinite(score) and 0.0 <= score <= 1.0) for score in scores):
        raise _failed("the worker returned a label score that is not a probability in [0, 1]")
    answers = []
    for image in range(images):
        row = scores[image * width : (image + 1) * width]
        order = sorted(range(width), key=lambda index: (-row[index], index))
        if top_k:
            order = order[:top_k]
        answers.append(
            inference_pb2.ImageClassification(
                labels=[
                    inference_pb2.LabelScore(label=labels[index], index=index, score=row[index])
                    for index in order
                ]
            )
        )
    return answers
