"""Checking a model host's answer before the worker trusts it (pure).

The host is a sandboxed child running third-party model code: its answer is input like any other,
so an answer whose shape disagrees with the request (an embed's rows or bytes, a rerank's scores,
a transcript's segment times, a text per image, a classification's probabilities, a generation's
finish reason, token counts and streamed text) is refused, never sent on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from gantry.common import operations
from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2, worker_gateway_pb2

_FINISHED = (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)


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


class StreamedDeltas:
    """The `generate_delta` frames of one generate request, checked as they come and passed on
    in order. Deltas for a request that did not ask to stream, or whose token counts go back,
    are kept from the caller, and `problem` says why the answer will be refused."""

    def __init__(
        self, *, stream: bool, forward: Callable[[worker_gateway_pb2.GenerateDelta], None] | None
    ) -> None:
        self.stream = stream
        self._forward = forward
        self._texts: list[str] = []
        self.completion_tokens = 0
        self.problem: str | None = None

    @property
    def text(self) -> str:
        return "".join(self._texts)

    def receive(self, response: model_host_pb2.HostResponse) -> None:
        delta = response.generate_delta
        if self.problem is not None:
            return
        if not self.stream:
            self.problem = "model host streamed text for a generate request that did not ask for it"
        elif delta.completion_tokens < self.completion_tokens:
            self.problem = (
                f"model host streamed a delta at {delta.completion_tokens} tokens after one at "
                f"{self.completion_tokens}"
            )
        if self.problem is not None:
            return
        self._texts.append(delta.text)
        self.completion_tokens = delta.completion_tokens
        if self._forward is not None:
            self._forward(delta)


def checked_generate(
    response: model_host_pb2.HostResponse, *, max_tokens: int, deltas: StreamedDeltas
) -> worker_gateway_pb2.GenerateResult:
    """The generation, when it says why it ended, its token counts are possible (a prompt of
    some tokens, no more new ones than `max_tokens` when that is set, at least one for any text)
    and, streamed, its text is the deltas joined; its failure raised."""
    _expect(response, "generate", "a generate")
    result = response.generate
    problem = deltas.problem
    if problem is None and result.finish_reason not in _FINISHED:
        reason = common_pb2.FinishReason.Name(result.finish_reason)
        problem = f"model host answered a generation with finish reason {reason}"
    if problem is None and (
        result.prompt_tokens == 0
        or (max_tokens and result.completion_tokens > max_tokens)
        or (result.text and result.completion_tokens == 0)
        or result.completion_tokens < deltas.completion_tokens
    ):
        problem = (
            f"model host answered {result.prompt_tokens} prompt and {result.completion_tokens} "
            f"completion tokens ({len(result.text)} characters, {deltas.completion_tokens} "
            f"tokens streamed) for at most {max_tokens or 'the default'} new tokens"
        )
    if problem is None and deltas.stream and deltas.text != result.text:
        problem = (
            f"model host streamed {len(deltas.text)} characters but answered a text of "
            f"{len(result.text)} that is not them joined"
        )
    if problem is not None:
        raise GantryError("INVOKE_FAILED", problem)
    return result


def _needs_inputs(payload: worker_gateway_pb2.EmbedPayload) -> None:
    if not payload.inputs:
        raise GantryError("INVALID_PAYLOAD", "an embed request needs at least one input")


def _needs_query_and_documents(payload: worker_gateway_pb2.RerankPayload) -> None:
    if not payload.query or not payload.documents:
        raise GantryError("INVALID_PAYLOAD", "a rerank request needs a query and documents")


# kind -> the INVALID_PAYLOAD a request gets before it is sent (the host would refuse it anyway).
REQUEST_CHECKS: Mapping[str, Callable[[Any], None]] = {
    "embed": _needs_inputs,
    "rerank": _needs_query_and_documents,
}


@dataclass(frozen=True, kw_only=True)
class Asked:
    """What a host was asked, for checking its answer: the payload, the loaded model's width,
    and the deltas a generation streamed before it."""

    payload: Any  # the kind's worker payload (gantry.common.operations)
    dim: int
    deltas: StreamedDeltas


# kind -> the check of its answer beyond its kind (`checked_answer`); a kind with none here is
# checked for its kind alone.
AnswerCheck = Callable[[model_host_pb2.HostResponse, Asked], Message]
ANSWER_CHECKS: Mapping[str, AnswerCheck] = {
    "embed": lambda response, asked: checked_embed(
        response, input_count=len(asked.payload.inputs), dim=asked.dim
    ),
    "rerank": lambda response, asked: checked_rerank(
        response, document_count=len(asked.payload.documents)
    ),
    "transcribe": lambda response, asked: checked_transcribe(response),
    "recognize_text": lambda response, asked: checked_recognize_text(
        response, image_count=len(asked.payload.images)
    ),
    # An image embedding answers as an embed does: one row of the loaded width per image.
    "embed_image": lambda response, asked: checked_embed(
        response, input_count=len(asked.payload.images), dim=asked.dim
    ),
    "classify_image": lambda response, asked: checked_classify_image(
        response, image_count=len(asked.payload.images), label_count=len(asked.payload.labels)
    ),
    "generate": lambda response, asked: checked_generate(
        response, max_tokens=asked.payload.max_tokens, deltas=asked.deltas
    ),
}


def checked_answer(kind: str, response: model_host_pb2.HostResponse, asked: Asked) -> Message:
    """The answer to a `kind` request, checked by its entry in ANSWER_CHECKS, else for its
    operation's result kind alone; its failure raised."""
    check = ANSWER_CHECKS.get(kind)
    if check is not None:
        return check(response, asked)
    result_kind = operations.by_kind(kind).result_kind
    _expect(response, result_kind, f"a {kind}")
    result: Message = getattr(response, result_kind)
    return result
