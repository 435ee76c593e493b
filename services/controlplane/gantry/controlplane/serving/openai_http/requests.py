"""OpenAI request bodies -> Gantry's gRPC request messages. Pure: no IO.

Only the shape is checked here (JSON types, which fields exist, values the protocol fixes); every
rule about the values themselves (empty texts, lengths, counts, max_tokens, stop sequences,
temperature and top_p ranges) is the Inference handlers' own validation, run on the message this
builds, so an HTTP caller is refused exactly as a gRPC caller is. Each refusal here is
INVALID_ARGUMENT naming the OpenAI `param`.

A field OpenAI defines that Gantry cannot honour is refused unless it holds its default (`n: 1`
is fine, `n: 2` is not); a field OpenAI does not define is refused, as OpenAI refuses it, except
Gantry's own `truncate` on /v1/embeddings (EmbedRequest.truncate: cut a text past the model's
token limit instead of refusing it INPUT_TOO_LONG, whose message names it). Omitted sampling
settings mean greedy decoding (Gantry's default), not OpenAI's temperature 1; an omitted
max_tokens means as many as the deployment allows (generation_validation.max_new_tokens).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gantry.common.errors import GantryError, invalid_argument
from gantry.v1 import common_pb2, inference_pb2

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
# OpenAI's "developer" messages are its newer name for system messages.
_ROLE_ALIASES = {"developer": "system"}
# Fields each endpoint accepts only at their default (None: absent or null is the default too).
_COMMON_DEFAULTS: Mapping[str, tuple[object, ...]] = {
    "n": (1,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "logprobs": (False,),
}
_COMPLETION_DEFAULTS: Mapping[str, tuple[object, ...]] = {
    **_COMMON_DEFAULTS,
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
}
_CHAT_DEFAULTS: Mapping[str, tuple[object, ...]] = {
    **_COMMON_DEFAULTS,
    "top_logprobs": (0,),
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True, False),
}
_GENERATION_FIELDS = frozenset(
    {"model", "max_tokens", "stop", "temperature", "top_p", "seed", "stream", "stream_options"}
    | {"user", "metadata", "store", "service_tier"}  # bookkeeping Gantry has no use for
)
_EMBEDDING_FIELDS = frozenset(
    {"model", "input", "encoding_format", "user", "dimensions"}
    | {"truncate"}  # Gantry's own, as gRPC's EmbedRequest and KServe's parameter name it
)
# A lone surrogate (U+D800-U+DFFF) is not text, and protobuf (and the JSON error) cannot encode
# one, but json.loads makes one from a \uD800 escape, or (it decodes with "surrogatepass") from
# its UTF-8 form ED A0-BF xx. Either sign in a UTF-8 body, or any other encoding, has the parsed
# strings checked; a surrogate pair is an ordinary character.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_UTF8 = ("utf-8", "utf-8-sig")


class EncodingFormat(enum.Enum):
    FLOAT = "float"
    BASE64 = "base64"  # little-endian float32, as OpenAI encodes it


@dataclass(frozen=True, slots=True)
class EmbeddingCall:
    request: inference_pb2.EmbedRequest
    encoding_format: EncodingFormat


@dataclass(frozen=True, slots=True)
class GenerationCall:
    request: inference_pb2.GenerateRequest
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts


def json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
        if _MAYBE_SURROGATE.search(body) or json.detect_encoding(body) not in _UTF8:
            json.dumps(parsed, ensure_ascii=False).encode("utf-8")  # every string is text
    except UnicodeEncodeError:
        raise invalid_argument(
            "the request body holds a string with a lone surrogate (\\ud800-\\udfff), which is "
            "not Unicode text"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_argument(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise invalid_argument("the request body is not valid JSON: nested too deeply") from None
    if not isinstance(parsed, dict):
        raise invalid_argument(f"the request body must be a JSON object, not {_json_type(parsed)}")
    return parsed


def embedding_call(body: Mapping[str, Any]) -> EmbeddingCall:
    _refuse_unknown(body, _EMBEDDING_FIELDS, {})
    if body.get("dimensions") is not None:
        raise invalid_argument(
            "dimensions is not supported: the deployment's model fixes the vector size",
            field="dimensions",
        )
    raw_format = _optional(body, "encoding_format", str) or EncodingFormat.FLOAT.value
    try:
        encoding_format = EncodingFormat(raw_format)
    except ValueError:
        raise invalid_argument(
            f"encoding_format is {raw_format[:40]!r}; it must be 'float' or 'base64'",
            field="encoding_format",
        ) from None
    raw_input = _required(body, "input")
    if isinstance(raw_input, str):
        inputs = [raw_input]
    elif isinstance(raw_input, list):
        for index, item in enumerate(raw_input):
            if not isinstance(item, str):
                raise invalid_argument(
                    f"input[{index}] is {_json_type(item)}; Gantry embeds texts (token arrays "
                    "are not supported)",
                    field=f"input[{index}]",
                )
        inputs = raw_input
    else:
        raise invalid_argument(
            f"input is {_json_type(raw_input)}; it must be a string or a list of strings",
            field="input",
        )
    request = inference_pb2.EmbedRequest(
        capability=_model(body),
        inputs=inputs,
        truncate=bool(_optional(body, "truncate", bool)),
        # The vectors travel as one block either way; the HTTP door writes them as asked.
        encoding=inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES,
    )
    return EmbeddingCall(request=request, encoding_format=encoding_format)


def completion_call(body: Mapping[str, Any]) -> GenerationCall:
    """POST /v1/completions: `prompt` continued as it is."""
    _refuse_unknown(body, _GENERATION_FIELDS | {"prompt"}, _COMPLETION_DEFAULTS)
    prompt = _required(body, "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # a batch of one prompt
    if not isinstance(prompt, str):
        raise invalid_argument(
            "prompt must be a string (or a list of one string; batches of prompts and token "
            "arrays are not supported)",
            field="prompt",
        )
    request = inference_pb2.GenerateRequest(prompt=prompt)
    return _generation(body, request, max_tokens_field="max_tokens")


def chat_completion_call(body: Mapping[str, Any]) -> GenerationCall:
    """POST /v1/chat/completions: `messages` rendered by the model's own chat template."""
    _refuse_unknown(
        body, _GENERATION_FIELDS | {"messages", "max_completion_tokens"}, _CHAT_DEFAULTS
    )
    raw_messages = _required(body, "messages")
    if not isinstance(raw_messages, list):
        raise invalid_argument(
            f"messages is {_json_type(raw_messages)}; it must be a list", field="messages"
        )
    messages = [_chat_message(message, index) for index, message in enumerate(raw_messages)]
    request = inference_pb2.GenerateRequest(messages=messages)
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else ""
    return _generation(body, request, max_tokens_field=field or "max_tokens")


def _generation(
    body: Mapping[str, Any], request: inference_pb2.GenerateRequest, *, max_tokens_field: str
) -> GenerationCall:
    request.capability = _model(body)
    request.max_tokens = _whole(body, max_tokens_field, UINT32_MAX)
    request.stop.extend(_stop(body))
    temperature = _number(body, "temperature")
    top_p = _number(body, "top_p")
    request.sampling.CopyFrom(
        common_pb2.SamplingSettings(
            temperature=temperature, top_p=top_p, seed=_whole(body, "seed", UINT64_MAX)
        )
    )
    stream = bool(_optional(body, "stream", bool))
    options = _optional(body, "stream_options", dict) or {}
    if options and not stream:
        raise invalid_argument("stream_options is only allowed with stream: true", field="stream")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise invalid_argument(
            "stream_options.include_usage must be a boolean", field="stream_options"
        )
    return GenerationCall(request=request, stream=stream, include_usage=include_usage)


def _chat_message(message: object, index: int) -> common_pb2.ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid_argument(f"{where} must be an object", field=where)
    unknown = set(message) - {"role", "content", "name"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid_argument(
            f"{where}.{name} is not supported (text messages only)", field=f"{where}.{name}"
        )
    role = message.get("role")
    if not isinstance(role, str):
        raise invalid_argument(f"{where}.role must be a string", field=f"{where}.role")
    return common_pb2.ChatMessage(
        role=_ROLE_ALIASES.get(role, role), content=_message_text(message.get("content"), where)
    )


def _message_text(content: object, where: str) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_argument(
            f"{where}.content must be a string or a list of text parts", field=f"{where}.content"
        )
    texts = []
    for part_index, part in enumerate(content):
        part_where = f"{where}.content[{part_index}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            raise invalid_argument(
                f"{part_where} must be a text part ({{'type': 'text', 'text': ...}}); "
                "Gantry's chat models read text only",
                field=f"{part_where}.type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid_argument(f"{part_where}.text must be a string", field=part_where)
        texts.append(text)
    return "\n".join(texts)


def _model(body: Mapping[str, Any]) -> str:
    model = _required(body, "model")
    if not isinstance(model, str) or not model:
        raise invalid_argument(
            "model must name a capability (a non-empty string; GET /v1/models lists them)",
            field="model",
        )
    return model


def _stop(body: Mapping[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        return stop
    raise invalid_argument("stop must be a string or a list of strings", field="stop")


def _number(body: Mapping[str, Any], name: str) -> float:
    value = body.get(name)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_argument(f"{name} must be a number, not {_json_type(value)}", field=name)
    try:
        return float(value)
    except OverflowError:  # an integer past any float (JSON's numbers are unbounded)
        raise invalid_argument(f"{name} is too large to be a number", field=name) from None


def _whole(body: Mapping[str, Any], name: str, ceiling: int) -> int:
    value = body.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ceiling:
        raise invalid_argument(
            f"{name} must be a whole number from 0 to {ceiling}, not {json.dumps(value)[:40]}",
            field=name,
        )
    return value


def _required(body: Mapping[str, Any], name: str) -> Any:
    if body.get(name) is None:
        raise invalid_argument(f"{name} is required", field=name)
    return body[name]


def _optional(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise invalid_argument(
            f"{name} must be {_JSON_NAMES.get(kind, kind.__name__)}, not {_json_type(value)}",
            field=name,
        )
    return value


def _refuse_unknown(
    body: Mapping[str, Any], known: frozenset[str], defaults: Mapping[str, tuple[object, ...]]
) -> None:
    for name, value in body.items():
        if name in defaults:
            # Compared with its JSON type: `true == 1` and `0 == false` in Python, not in JSON.
            if value is not None and not any(
                type(value) is type(allowed) and value == allowed for allowed in defaults[name]
            ):
                raise GantryError(
                    "INVALID_ARGUMENT",
                    f"{name} {json.dumps(value)[:60]} is not supported; leave it out "
                    f"(or {json.dumps(defaults[name][0])})",
                    field=name,
                )
        elif name not in known:
            raise invalid_argument(f"unrecognized request argument: {name[:60]}", field=name[:60])


_JSON_NAMES: Mapping[type, str] = {
    str: "a string",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _JSON_NAMES.get(type(value), type(value).__name__)
