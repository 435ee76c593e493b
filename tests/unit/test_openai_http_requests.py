"""OpenAI request bodies into Gantry's request messages, and the shape checks that refuse one
naming its parameter; and Gantry's answers as OpenAI's response bodies and events."""

from __future__ import annotations

import base64
import json
import re
import struct
from typing import Any

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.serving.openai_http.requests import (
    EncodingFormat,
    chat_completion_call,
    completion_call,
    embedding_call,
    json_object,
)
from gantry.controlplane.serving.openai_http.responses import (
    SSE_DONE,
    Completion,
    embeddings_body,
    stream_events,
)
from gantry.v1 import common_pb2, inference_pb2
from gantry.worker.model_host.input_lengths import first_overlong


def refused_param(parse: Any, body: Any) -> str:
    with pytest.raises(GantryError) as caught:
        parse(body)
    assert caught.value.reason == "INVALID_ARGUMENT"
    return caught.value.metadata.get("field", "")


def test_an_embedding_body_becomes_an_embed_request_for_the_capability() -> None:
    call = embedding_call({"model": "minilm", "input": ["a", "b"], "encoding_format": "base64"})
    assert call.request.capability == "minilm" and list(call.request.inputs) == ["a", "b"]
    assert call.request.encoding == inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES
    assert call.encoding_format is EncodingFormat.BASE64
    assert list(embedding_call({"model": "m", "input": "one"}).request.inputs) == ["one"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "", "input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": ["ok", [1, 2]]}, "input[1]"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "x", "dimensions": 8}, "dimensions"),
        ({"model": "m", "input": "x", "surprise": True}, "surprise"),
        ({"model": "m", "input": "x", "truncate": "yes"}, "truncate"),
    ],
)
def test_a_malformed_embedding_body_is_refused_naming_its_param(
    body: dict[str, Any], param: str
) -> None:
    assert refused_param(embedding_call, body) == param


def test_token_arrays_as_langchain_sends_them_are_refused_naming_the_first() -> None:
    # OpenAIEmbeddings() with check_embedding_ctx_length on (its default) sends tiktoken ids.
    with pytest.raises(GantryError) as caught:
        embedding_call({"model": "m", "input": [[9906, 1917], [15339]]})
    assert caught.value.metadata["field"] == "input[0]"
    assert caught.value.message == (
        "input[0] is a list; Gantry embeds texts (token arrays are not supported)"
    )


def test_the_option_the_input_too_long_refusal_names_is_one_the_embeddings_body_takes() -> None:
    refusal = first_overlong([3, 600], 512, field="inputs")
    assert refusal is not None and refusal.reason == "INPUT_TOO_LONG"
    named = re.search(r"\(set (\w+) to cut it to the limit\)", refusal.message)
    assert named is not None, refusal.message
    option = named.group(1)
    assert embedding_call({"model": "m", "input": "x", option: True}).request.truncate
    assert not embedding_call({"model": "m", "input": "x", option: False}).request.truncate
    assert not embedding_call({"model": "m", "input": "x"}).request.truncate


def test_a_body_that_is_not_a_json_object_is_refused() -> None:
    with pytest.raises(GantryError, match="not valid JSON"):
        json_object(b"{nope")
    with pytest.raises(GantryError, match="JSON object"):
        json_object(b"[1]")


def test_a_completion_maps_every_setting_gantry_has() -> None:
    call = completion_call(
        {
            "model": "lm",
            "prompt": ["Once"],
            "max_tokens": 12,
            "stop": "\n",
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "presence_penalty": 0.0,
            "frequency_penalty": 0,
            "logprobs": False,
            "user": "someone",
        }
    )
    request = call.request
    assert (request.capability, request.prompt, request.max_tokens) == ("lm", "Once", 12)
    assert list(request.stop) == ["\n"]
    assert request.sampling.seed == 7 and request.sampling.top_p == pytest.approx(0.9)
    assert request.sampling.temperature == pytest.approx(0.5)
    assert call.stream and call.include_usage
    # Omitted sampling settings are greedy (Gantry's default), not OpenAI's temperature 1.
    assert completion_call({"model": "lm", "prompt": "x"}).request.sampling.temperature == 0.0


def test_a_chat_maps_messages_roles_and_text_parts() -> None:
    call = chat_completion_call(
        {
            "model": "lm",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 5,
        }
    )
    assert [(m.role, m.content) for m in call.request.messages] == [
        ("system", "Be brief."),
        ("user", "a\nb"),
    ]
    assert call.request.max_tokens == 5 and not call.stream


@pytest.mark.parametrize("null", [False, True])
def test_an_omitted_max_tokens_is_left_to_the_deployment(null: bool) -> None:
    # 0 is "none named": the control plane gives the call what its deployment allows
    # (generation_validation.max_new_tokens), as `ChatOpenAI()` and the SDK without it expect.
    nulls: dict[str, Any] = {"max_tokens": None} if null else {}
    chat = chat_completion_call(
        {
            "model": "lm",
            "messages": [{"role": "user", "content": "hi"}],
            **nulls,
            **({"max_completion_tokens": None} if null else {}),
        }
    )
    completion = completion_call({"model": "lm", "prompt": "x", **nulls})
    assert chat.request.max_tokens == completion.request.max_tokens == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "lm", "prompt": ["a", "b"]}, "prompt"),
        ({"model": "lm", "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "lm", "prompt": "x", "max_tokens": True}, "max_tokens"),
        ({"model": "lm", "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": "lm", "prompt": "x", "stop": [1]}, "stop"),
        ({"model": "lm", "prompt": "x", "seed": -3}, "seed"),
        ({"model": "lm", "prompt": "x", "n": 3}, "n"),
        ({"model": "lm", "prompt": "x", "stream_options": {"include_usage": True}}, "stream"),
        ({"model": "lm", "prompt": "x", "echo": True}, "echo"),
        # JSON's true is not 1 and 0 is not false, though Python's == says so.
        ({"model": "lm", "prompt": "x", "n": True}, "n"),
        ({"model": "lm", "prompt": "x", "logprobs": 0}, "logprobs"),
        ({"model": "lm", "prompt": "x", "best_of": True}, "best_of"),
    ],
)
def test_a_malformed_completion_is_refused_naming_its_param(
    body: dict[str, Any], param: str
) -> None:
    assert refused_param(completion_call, body) == param


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ("hi", "messages"),
        (["hi"], "messages[0]"),
        ([{"role": 1, "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type"),
        ([{"role": "assistant", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
    ],
)
def test_a_malformed_chat_is_refused_naming_its_param(messages: Any, param: str) -> None:
    assert refused_param(chat_completion_call, {"model": "lm", "messages": messages}) == param


def test_embeddings_are_the_workers_float32_as_floats_or_base64() -> None:
    block = struct.pack("<2f", 0.5, -1.25)
    response = inference_pb2.EmbedResponse(dim=2, vectors=[inference_pb2.Vector(float32_le=block)])
    floats = embeddings_body(response, model="m", encoding_format=EncodingFormat.FLOAT)
    assert floats["data"][0]["embedding"] == [0.5, -1.25]
    assert floats["usage"] == {"prompt_tokens": 0, "total_tokens": 0}
    packed = embeddings_body(response, model="m", encoding_format=EncodingFormat.BASE64)
    assert base64.b64decode(packed["data"][0]["embedding"]) == block


def test_the_last_chunk_ends_the_stream_with_the_finish_reason_usage_and_done() -> None:
    completion = Completion(completion_id="chatcmpl-1", created=1, model="lm", chat=True)
    text = stream_events(completion, inference_pb2.GenerateChunk(text="Hi"), include_usage=True)
    assert [json.loads(event[6:])["choices"][0]["delta"] for event in text] == [{"content": "Hi"}]
    last = inference_pb2.GenerateChunk(
        finish_reason=common_pb2.FINISH_REASON_LENGTH, prompt_tokens=3, completion_tokens=4
    )
    *events, done = stream_events(completion, last, include_usage=True)
    assert done == SSE_DONE
    finished, counted = (json.loads(event[6:]) for event in events)
    assert finished["choices"][0]["finish_reason"] == "length"
    assert counted["choices"] == [] and counted["usage"]["total_tokens"] == 7
