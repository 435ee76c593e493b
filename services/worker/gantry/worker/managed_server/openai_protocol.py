"""The OpenAI-compatible wire, as a managed server speaks it: request bodies from a
GeneratePayload, answers and server-sent events back into GenerateResult and GenerateDelta.

Pure: no HTTP here (`server_calls` sends what this builds). A prompt goes to /v1/completions,
messages to /v1/chat/completions (the server renders them with the model's own chat template).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gantry.common.errors import GantryError
from gantry.common.inference_limits import DEPLOYMENT_MAX_NEW_TOKENS
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
MODELS = "/v1/models"
EMBEDDINGS = "/v1/embeddings"
SSE_DONE = "[DONE]"

# Without a per-deployment limit (max_new_tokens 0): the bound the control plane resolves calls by.
DEFAULT_MAX_NEW_TOKENS = DEPLOYMENT_MAX_NEW_TOKENS
DEFAULT_MAX_TOKENS = 256

_FINISH_REASONS = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "eos": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
}


@dataclass(frozen=True, kw_only=True)
class CompletionRequest:
    path: str
    body: dict[str, Any]
    chat: bool


def _payload_error(message: str, field: str, **metadata: str) -> GantryError:
    return GantryError("INVALID_PAYLOAD", message, field=field, **metadata)


def checked_max_tokens(asked: int, max_new_tokens: int) -> int:
    limit = max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    if asked > limit:
        raise _payload_error(
            f"max_tokens {asked} is past this deployment's limit of {limit} new tokens",
            "max_tokens",
            limit=str(limit),
            value=str(asked),
        )
    return asked or min(DEFAULT_MAX_TOKENS, limit)


def completion_request(
    payload: wg.GeneratePayload,
    *,
    model: str,
    max_new_tokens: int,
    top_k_off: int,
    neutral_sampling: Mapping[str, Any] | None = None,
) -> CompletionRequest:
    """The request for `payload`; INVALID_PAYLOAD naming the field it refuses."""
    if payload.prompt and payload.messages:
        raise _payload_error("a generate request takes a prompt or messages, not both", "messages")
    if not payload.prompt and not payload.messages:
        raise _payload_error("a generate request needs a prompt or messages", "prompt")
    for index, stop in enumerate(payload.stop):
        if not stop:
            raise _payload_error(f"stop[{index}] is empty", f"stop[{index}]")
    sampling = payload.sampling
    temperature, top_p = sampling.temperature, sampling.top_p
    if not math.isfinite(temperature) or temperature < 0:
        raise _payload_error(
            f"sampling.temperature must be 0 (greedy) or positive, not {temperature!r}",
            "sampling.temperature",
        )
    if not math.isfinite(top_p) or not 0 <= top_p <= 1:
        raise _payload_error(
            f"sampling.top_p must be in [0, 1] (0 = off), not {top_p!r}", "sampling.top_p"
        )
    body: dict[str, Any] = {
        **(neutral_sampling or {}),
        "model": model,
        "max_tokens": checked_max_tokens(payload.max_tokens, max_new_tokens),
        # Explicit "off" values: a server's own defaults (llama.cpp's top_k 40, top_p 0.95)
        # would otherwise change what the payload asked for.
        "temperature": float(temperature),
        "top_p": float(top_p) if top_p else 1.0,
        "top_k": int(sampling.top_k) if sampling.top_k else top_k_off,
        "stream": payload.stream,
    }
    if payload.stream:
        body["stream_options"] = {"include_usage": True}  # honoured by vLLM, ignored by others
    if payload.stop:
        body["stop"] = list(payload.stop)
    if sampling.seed:
        body["seed"] = int(sampling.seed)
    if payload.messages:
        body["messages"] = [{"role": m.role, "content": m.content} for m in payload.messages]
        return CompletionRequest(path=CHAT_COMPLETIONS, body=body, chat=True)
    body["prompt"] = payload.prompt
    return CompletionRequest(path=COMPLETIONS, body=body, chat=False)


def finish_reason(value: object) -> common_pb2.FinishReason:
    return _FINISH_REASONS.get(str(value), common_pb2.FINISH_REASON_UNSPECIFIED)


def _choice(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GantryError("INVOKE_FAILED", "the server's answer has no choices")
    return choices[0]


def _choice_text(choice: Mapping[str, Any], *, chat: bool, streamed: bool) -> str:
    if not chat:
        text = choice.get("text")
    else:
        message = choice.get("delta" if streamed else "message")
        text = message.get("content") if isinstance(message, dict) else None
    return text if isinstance(text, str) else ""


def _usage(answer: Mapping[str, Any]) -> tuple[int, int] | None:
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return prompt, completion
    return None


def generate_result(answer: Mapping[str, Any], *, chat: bool) -> wg.GenerateResult:
    """The result of a non-streamed completion."""
    choice = _choice(answer)
    usage = _usage(answer)
    return wg.GenerateResult(
        text=_choice_text(choice, chat=chat, streamed=False),
        finish_reason=finish_reason(choice.get("finish_reason")),
        prompt_tokens=usage[0] if usage else 0,
        completion_tokens=usage[1] if usage else 0,
    )


class SseDecoder:
    """Server-sent events from a byte stream, split however it arrives: each event's joined
    `data:` lines, in order. Comments and other fields (event:, id:, retry:) carry nothing we use.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        events = []
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if not newline:
                break
            self._buffer = rest
            text = line.rstrip(b"\r").decode("utf-8", errors="replace")
            if not text:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif text.startswith("data:"):
                self._data.append(text[5:].removeprefix(" "))
        return events


class StreamAccumulator:
    """Folds a streamed completion's events into deltas and the final result.

    Completion tokens are the server's usage when it sends one (vLLM with include_usage);
    otherwise the chunks that carried generated text are counted, which is one per token for
    llama.cpp's server (it may hold back a token that ends inside a UTF-8 character, so the
    count can be low by those), and prompt tokens stay 0 here: the caller asks the server for
    them (`ServerCalls._prompt_tokens`), never guesses.
    """

    def __init__(self, *, chat: bool) -> None:
        self._chat = chat
        self._parts: list[str] = []
        self._chunks = 0
        self._finish: common_pb2.FinishReason = common_pb2.FINISH_REASON_UNSPECIFIED
        self._usage: tuple[int, int] | None = None
        self.done = False

    def event(self, data: str) -> wg.GenerateDelta | None:
        """One event's data; the delta to send on, if it carried text."""
        if data.strip() == SSE_DONE:
            self.done = True
            return None
        try:
            answer = json.loads(data)
        except json.JSONDecodeError as exc:
            raise GantryError(
                "INVOKE_FAILED", f"the server streamed an unreadable event: {exc}"
            ) from exc
        if not isinstance(answer, dict):
            raise GantryError("INVOKE_FAILED", "the server streamed an event that is no object")
        if isinstance(answer.get("error"), dict):
            message = answer["error"].get("message", "an error")
            raise GantryError("INVOKE_FAILED", f"the server failed the generation: {message}")
        self._usage = _usage(answer) or self._usage
        choices = answer.get("choices")
        if not choices:
            return None  # the usage-only chunk
        choice = _choice(answer)
        if choice.get("finish_reason") is not None:
            self._finish = finish_reason(choice.get("finish_reason"))
        text = _choice_text(choice, chat=self._chat, streamed=True)
        if not text:
            return None
        self._parts.append(text)
        self._chunks += 1
        return wg.GenerateDelta(text=text, completion_tokens=self.completion_tokens)

    @property
    def completion_tokens(self) -> int:
        return self._usage[1] if self._usage else self._chunks

    def result(self) -> wg.GenerateResult:
        return wg.GenerateResult(
            text="".join(self._parts),
            finish_reason=self._finish,
            prompt_tokens=self._usage[0] if self._usage else 0,
            completion_tokens=self.completion_tokens,
        )


def error_message(status: int, body: bytes) -> str:
    """What a server said when it refused a request (OpenAI's {"error": {"message"}} or its
    own detail), cut short."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return f"HTTP {status}: {text[:300]}"
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return f"HTTP {status}: {error['message'][:300]}"
        if "detail" in parsed:
            return f"HTTP {status}: {str(parsed['detail'])[:300]}"
    return f"HTTP {status}: {text[:300]}"
