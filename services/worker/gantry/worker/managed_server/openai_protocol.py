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
# Characters relayed per allowed token: the control plane's own bound on a generation's text
# (nodes/wire_bounds.py CHARS_PER_TOKEN; a unit test keeps the two equal). Past it, a result
# would be refused as a worker's protocol fault, so a server's text is cut here first.
RELAY_CHARS_PER_TOKEN = 32
# Events a stream may carry that bring no text (a role chunk, the finish, the usage), beyond one
# per allowed token: an honest server sends a handful; a stream of empty events is cut after.
EXTRA_STREAM_EVENTS = 8
# The longest server-sent event line kept while waiting for its end: an honest event is one
# token's JSON; a line that never ends must not grow the worker's memory without bound.
MAX_EVENT_BYTES = 1024 * 1024
# What of a server's own error text is kept (for the worker's log, or a managed server's caller).
SERVER_TEXT_CHARS = 300

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


class ServerFailed(Exception):
    """A server refused a call (`status`, its HTTP status) or failed it mid-stream (`status` 0),
    with `said`: its own words, cut to SERVER_TEXT_CHARS. Not a GantryError on purpose: whether
    those words may reach a client is the caller's to decide (`ServerCalls._server_failed`), so
    nothing here can hand them on by accident."""

    def __init__(self, status: int, said: str) -> None:
        super().__init__(f"HTTP {status}" if status else "an error event in the stream")
        self.status = status
        self.said = said


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
    What waits for its end (a line, an event's lines) is bounded by MAX_EVENT_BYTES: past it the
    stream is INVOKE_FAILED, never held in memory without end.
    """

    def __init__(self) -> None:
        # The unfinished line's pieces, joined only once its newline comes: a line dripped a
        # byte at a time costs its length, not its length squared.
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._data: list[str] = []
        self._held = 0  # characters of `_data`

    def feed(self, chunk: bytes) -> list[str]:
        events: list[str] = []
        *lines, rest = chunk.split(b"\n")
        if lines:
            lines[0] = b"".join([*self._pending, lines[0]])
            self._pending, self._pending_bytes = [], 0
        for line in lines:
            self._line(line.rstrip(b"\r").decode("utf-8", errors="replace"), events)
        if rest:
            self._pending.append(rest)
            self._pending_bytes += len(rest)
        if self._pending_bytes + self._held > MAX_EVENT_BYTES:
            raise GantryError(
                "INVOKE_FAILED",
                f"the server streamed an event longer than {MAX_EVENT_BYTES} bytes",
            )
        return events

    def _line(self, text: str, events: list[str]) -> None:
        if not text:
            if self._data:
                events.append("\n".join(self._data))
                self._data, self._held = [], 0
        elif text.startswith("data:"):
            self._data.append(text[5:].removeprefix(" "))
            self._held += len(text)


class StreamAccumulator:
    """Folds a streamed completion's events into deltas and the final result.

    Completion tokens are the server's usage when it sends one (vLLM with include_usage);
    otherwise the chunks that carried generated text are counted, which is one per token for
    llama.cpp's server (it may hold back a token that ends inside a UTF-8 character, so the
    count can be low by those), and prompt tokens stay 0 here: the caller asks the server for
    them (`ServerCalls._prompt_tokens`), never guesses.

    With `max_tokens`, a server that streams past it is cut, never followed: the stream is over
    (`done`, `cut`) with finish LENGTH at the first event that would pass one of the bounds, and
    that event is dropped. The bounds are on what is relayed: at most `max_tokens` chunks of text
    (an honest server sends no more, as each carries at least one token), a reported usage of at
    most `max_tokens`, at most RELAY_CHARS_PER_TOKEN characters of text per allowed token, and at
    most EXTRA_STREAM_EVENTS events beyond one per token. So the completion tokens it reports
    never pass `max_tokens`, however the server counts.
    """

    def __init__(self, *, chat: bool, max_tokens: int = 0) -> None:
        self._chat = chat
        self._parts: list[str] = []
        self._chars = 0
        self._chunks = 0
        self._events = 0
        self._max_tokens = max_tokens
        self._finish: common_pb2.FinishReason = common_pb2.FINISH_REASON_UNSPECIFIED
        self._usage: tuple[int, int] | None = None
        self.done = False
        self.cut = False  # ended by Gantry's bound, not by the server

    def event(self, data: str) -> wg.GenerateDelta | None:
        """One event's data; the delta to send on, if it carried text. Nothing once `done`."""
        if self.done:
            return None
        if data.strip() == SSE_DONE:
            self.done = True
            return None
        answer = _event_object(data)
        usage = _usage(answer)
        choices = answer.get("choices")
        choice = _choice(answer) if choices else None
        text = _choice_text(choice, chat=self._chat, streamed=True) if choice else ""
        if self._past_bounds(usage, text):
            self._cut()
            return None
        self._usage = usage or self._usage
        if choice is None:
            return None  # the usage-only chunk
        if choice.get("finish_reason") is not None:
            self._finish = finish_reason(choice.get("finish_reason"))
        if not text:
            return None
        self._parts.append(text)
        self._chars += len(text)
        self._chunks += 1
        return wg.GenerateDelta(text=text, completion_tokens=self.completion_tokens)

    def _past_bounds(self, usage: tuple[int, int] | None, text: str) -> bool:
        """Whether this event would take the stream past `max_tokens` (see the class)."""
        self._events += 1
        limit = self._max_tokens
        if not limit:
            return False
        return (
            (bool(text) and self._chunks >= limit)
            or (usage is not None and usage[1] > limit)
            or self._chars + len(text) > limit * RELAY_CHARS_PER_TOKEN
            or self._events > limit + EXTRA_STREAM_EVENTS
        )

    def _cut(self) -> None:
        self.done = self.cut = True
        self._finish = common_pb2.FINISH_REASON_LENGTH

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


def _event_object(data: str) -> dict[str, Any]:
    """One event's JSON object; a server's error event is ServerFailed (its words kept apart)."""
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
        raise ServerFailed(0, str(message)[:SERVER_TEXT_CHARS])
    return answer


def server_words(body: bytes) -> str:
    """What a server said when it refused a request (OpenAI's {"error": {"message"}} or its
    own detail), cut to SERVER_TEXT_CHARS."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text[:SERVER_TEXT_CHARS]
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:SERVER_TEXT_CHARS]
        if "detail" in parsed:
            return str(parsed["detail"])[:SERVER_TEXT_CHARS]
    return text[:SERVER_TEXT_CHARS]
