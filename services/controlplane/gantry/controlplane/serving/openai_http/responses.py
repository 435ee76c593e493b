"""Gantry's answers -> OpenAI response bodies and server-sent events. Pure: no IO.

Embeddings' `usage` is 0 tokens: the worker returns vectors, not token counts, and a count made up
here (characters / 4, a second tokenizer) would be a number Gantry did not measure. Generations
report the model host's own prompt and completion token counts.
"""

from __future__ import annotations

import base64
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gantry.controlplane.serving.openai_http.requests import EncodingFormat
from gantry.v1 import common_pb2, inference_pb2

OWNED_BY = "gantry"
SSE_DONE = b"data: [DONE]\n\n"
FINISH_REASONS: Mapping[int, str] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
}


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One capability, as GET /v1/models lists it."""

    capability: str
    created: int  # unix seconds: when the deployment it names was created
    deployment_id: str
    state: str  # that deployment's state (READY serves); "" while none is bound


@dataclass(frozen=True, slots=True)
class Completion:
    """What one generation call's OpenAI objects share."""

    completion_id: str
    created: int
    model: str
    chat: bool

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    @property
    def chunk_object_name(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"


def embeddings_body(
    response: inference_pb2.EmbedResponse, *, model: str, encoding_format: EncodingFormat
) -> dict[str, Any]:
    """An EmbedResponse asked for as FLOAT32_LE_BYTES: each vector's block as floats, or as its
    base64 (OpenAI's base64 is exactly these little-endian float32 bytes)."""
    data = []
    for index, vector in enumerate(response.vectors):
        block = vector.float32_le
        embedding: list[float] | str
        if encoding_format is EncodingFormat.BASE64:
            embedding = base64.b64encode(block).decode("ascii")
        else:
            floats = array("f")
            floats.frombytes(block)  # the wire is little-endian; so is every host Gantry runs on
            embedding = floats.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    completion: Completion, response: inference_pb2.GenerateResponse
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": FINISH_REASONS.get(response.finish_reason),
        "logprobs": None,
    }
    if completion.chat:
        choice["message"] = {"role": "assistant", "content": response.text}
    else:
        choice["text"] = response.text
    return {
        "id": completion.completion_id,
        "object": completion.object_name,
        "created": completion.created,
        "model": completion.model,
        "choices": [choice],
        "usage": usage(response.prompt_tokens, response.completion_tokens),
    }


def chunk_body(
    completion: Completion,
    *,
    text: str | None = None,
    role: bool = False,
    finish_reason: str | None = None,
    usage_counts: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One streamed chunk: a piece of text, the chat's opening role, the finish reason, or
    (with stream_options.include_usage) the token counts, with no choices, as OpenAI sends them."""
    choices: list[dict[str, Any]] = []
    if usage_counts is None:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if completion.chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choices.append(choice)
    body: dict[str, Any] = {
        "id": completion.completion_id,
        "object": completion.chunk_object_name,
        "created": completion.created,
        "model": completion.model,
        "choices": choices,
    }
    if usage_counts is not None:
        body["usage"] = usage_counts
    return body


def stream_events(
    completion: Completion, chunk: inference_pb2.GenerateChunk, *, include_usage: bool
) -> list[bytes]:
    """The events one GenerateChunk becomes: its text, or (the last chunk) the finish reason,
    the usage when asked for, and `[DONE]`."""
    if not chunk.finish_reason:
        return [sse(chunk_body(completion, text=chunk.text))]
    events = []
    if chunk.text:
        events.append(sse(chunk_body(completion, text=chunk.text)))
    events.append(
        sse(chunk_body(completion, finish_reason=FINISH_REASONS.get(chunk.finish_reason)))
    )
    if include_usage:
        counts = usage(chunk.prompt_tokens, chunk.completion_tokens)
        events.append(sse(chunk_body(completion, usage_counts=counts)))
    events.append(SSE_DONE)
    return events


def sse(body: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def models_body(entries: Sequence[ModelEntry]) -> dict[str, Any]:
    return {"object": "list", "data": [model_body(entry) for entry in entries]}


def model_body(entry: ModelEntry) -> dict[str, Any]:
    """OpenAI's model object, plus `gantry`: the deployment the capability names and its state
    (only a READY one serves)."""
    return {
        "id": entry.capability,
        "object": "model",
        "created": entry.created,
        "owned_by": OWNED_BY,
        "gantry": {"deployment_id": entry.deployment_id, "state": entry.state},
    }
