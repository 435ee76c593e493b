"""The checks on one Generate or GenerateStream call before anything is scheduled, and the worker
payload they resolve to: pure, no IO.

Every refusal is INVALID_ARGUMENT naming the offending `field` (`prompt`, `messages[2].role`,
`stop[0]`, `sampling.temperature`, `max_tokens`). The texts (the prompt, each message's content)
are bounded as Embed's inputs are (inference_validation: non-empty, `max_input_chars` each,
`max_request_bytes` together); past one of the server's settings the reason is INVALID_PAYLOAD with
the `setting`, its `limit` and the request's `value`.

`checked_generation` runs every check that needs no deployment; once the call's deployment is
known, `CheckedGeneration.for_deployment` resolves its max_tokens (`max_new_tokens`, the one
decision) against that deployment's bound. A call that names no max_tokens means "up to the
model's limit", as vLLM, Ollama and OpenAI read it: it gets as many as its deployment allows
(within the server's `max_tokens`, and `default_max_tokens` when the operator set one), never a
refusal; an explicit count past either bound is refused naming that bound. The payload always
carries the explicit count, so the cost counted for the fair queue is the work the worker may be
asked to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gantry.common.errors import invalid_argument
from gantry.common.inference_limits import (
    DEFAULT_LIMITS,
    DEPLOYMENT_MAX_NEW_TOKENS,
    MAX_CHAT_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    InferenceLimits,
)
from gantry.controlplane.serving.inference_validation import check_text, check_total, over_limit
from gantry.controlplane.serving.work_cost import generate_cost
from gantry.v1 import common_pb2, inference_pb2
from gantry.v1 import worker_gateway_pb2 as wg

CHAT_ROLES = ("system", "user", "assistant")
MAX_TEMPERATURE = 2.0  # past it, softmax(logits / t) is near uniform: noise, never a use
MAX_TOP_P = 1.0


@dataclass(frozen=True, slots=True)
class PlannedGeneration:
    """A call resolved for its deployment: what the worker is sent (an explicit max_tokens), and
    what it costs."""

    payload: wg.GeneratePayload
    cost: int

    @property
    def max_tokens(self) -> int:
        return self.payload.max_tokens


@dataclass(frozen=True, slots=True)
class CheckedGeneration:
    """A call that passed every check that needs no deployment, with the texts its cost counts."""

    request: inference_pb2.GenerateRequest
    stream: bool
    texts: tuple[str, ...]
    limits: InferenceLimits

    def for_deployment(self, adapter: common_pb2.AdapterSettings) -> PlannedGeneration:
        """The worker's payload, with the max_tokens this deployment gives the call, and its
        cost; or the refusal of an explicit count past the deployment's bound."""
        request = self.request
        max_tokens = max_new_tokens(
            request.max_tokens,
            deployment_limit=deployment_max_new_tokens(adapter),
            limits=self.limits,
        )
        payload = wg.GeneratePayload(
            prompt=request.prompt,
            messages=request.messages,
            max_tokens=max_tokens,
            stop=request.stop,
            sampling=request.sampling,
            stream=self.stream,
        )
        return PlannedGeneration(payload=payload, cost=generate_cost(self.texts, max_tokens))


def checked_generation(
    request: inference_pb2.GenerateRequest,
    limits: InferenceLimits = DEFAULT_LIMITS,
    *,
    stream: bool,
) -> CheckedGeneration:
    """The call checked (`stream` as asked), or the first refusal: everything but what needs the
    deployment, so a bad call is refused before its target is looked up."""
    texts = _prompt_texts(request, limits)
    _check_server_max_tokens(request.max_tokens, limits)
    stop = list(request.stop)
    _check_stop(stop)
    _check_sampling(request.sampling)
    return CheckedGeneration(request=request, stream=stream, texts=tuple(texts), limits=limits)


def deployment_max_new_tokens(adapter: common_pb2.AdapterSettings) -> int:
    """The most new tokens one call may ask of a deployment with these adapter settings: its
    profile's max_new_tokens, else the bound every generation adapter applies without one."""
    return adapter.max_new_tokens or DEPLOYMENT_MAX_NEW_TOKENS


def max_new_tokens(asked: int, *, deployment_limit: int, limits: InferenceLimits) -> int:
    """How many new tokens a call may produce: `asked` (0: it named none) against the server's
    limits and its deployment's bound. An explicit count is kept, or refused past either bound,
    naming it (vLLM too refuses an explicit max_tokens past what the model can give). None
    means "up to the model's limit", as vLLM and Ollama clamp it: the smallest of the
    deployment's bound, the server's maximum and the operator's default when one is set."""
    _check_server_max_tokens(asked, limits)
    if asked > deployment_limit:
        raise over_limit(
            f"max_tokens is {asked}; this deployment generates at most {deployment_limit} "
            "tokens per call (its profile's max_new_tokens)",
            setting="max_new_tokens",
            limit=deployment_limit,
            value=asked,
            field="max_tokens",
        )
    if asked:
        return asked
    return min(deployment_limit, limits.max_tokens, limits.default_max_tokens or limits.max_tokens)


def _prompt_texts(request: inference_pb2.GenerateRequest, limits: InferenceLimits) -> list[str]:
    """Exactly one of prompt and messages; the texts the model reads, each checked."""
    messages = list(request.messages)
    if request.prompt and messages:
        raise invalid_argument(
            "set prompt or messages, not both (a prompt is continued as it is; messages are "
            "rendered by the model's chat template)",
            field="messages",
        )
    if not messages:
        if not request.prompt:
            raise invalid_argument("set prompt (a text to continue) or messages", field="prompt")
        check_text(request.prompt, field="prompt", limits=limits)
        check_total([request.prompt], field="prompt", limits=limits)
        return [request.prompt]
    if len(messages) > MAX_CHAT_MESSAGES:
        raise invalid_argument(
            f"{len(messages)} messages in one call; at most {MAX_CHAT_MESSAGES}",
            field="messages",
            limit=str(MAX_CHAT_MESSAGES),
            value=str(len(messages)),
        )
    contents = [message.content for message in messages]
    check_total(contents, field="messages", limits=limits)
    for index, message in enumerate(messages):
        _check_message(message, index, limits)
    return contents


def _check_message(message: common_pb2.ChatMessage, index: int, limits: InferenceLimits) -> None:
    if message.role not in CHAT_ROLES:
        raise invalid_argument(
            f"messages[{index}].role is {message.role[:40]!r}; it must be one of "
            + ", ".join(CHAT_ROLES),
            field=f"messages[{index}].role",
        )
    check_text(message.content, field=f"messages[{index}].content", limits=limits)


def _check_server_max_tokens(asked: int, limits: InferenceLimits) -> None:
    if asked > limits.max_tokens:
        raise over_limit(
            f"max_tokens is {asked}; this server generates at most {limits.max_tokens} tokens "
            "per call",
            setting="max_tokens",
            limit=limits.max_tokens,
            value=asked,
            field="max_tokens",
        )


def _check_stop(stop: list[str]) -> None:
    if len(stop) > MAX_STOP_SEQUENCES:
        raise invalid_argument(
            f"{len(stop)} stop sequences; at most {MAX_STOP_SEQUENCES}",
            field="stop",
            limit=str(MAX_STOP_SEQUENCES),
            value=str(len(stop)),
        )
    for index, sequence in enumerate(stop):
        if not sequence:
            # An empty stop sequence would match before the first token: nothing could be said.
            raise invalid_argument(f"stop[{index}] is an empty string", field=f"stop[{index}]")
        if len(sequence) > MAX_STOP_CHARS:
            raise invalid_argument(
                f"stop[{index}] holds {len(sequence)} characters; at most {MAX_STOP_CHARS}",
                field=f"stop[{index}]",
                limit=str(MAX_STOP_CHARS),
                value=str(len(sequence)),
            )


def _check_sampling(sampling: common_pb2.SamplingSettings) -> None:
    for name, value, ceiling in (
        ("temperature", sampling.temperature, MAX_TEMPERATURE),
        ("top_p", sampling.top_p, MAX_TOP_P),
    ):
        if not math.isfinite(value) or not 0.0 <= value <= ceiling:
            raise invalid_argument(
                f"sampling.{name} is {value:g}; it must be a number from 0 to {ceiling:g}",
                field=f"sampling.{name}",
                limit=f"{ceiling:g}",
            )
