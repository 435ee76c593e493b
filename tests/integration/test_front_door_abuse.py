"""Hostile input at the standard-protocol front doors, on an in-process Gantry serving the tiny
causal LM over HTTP (port 0) and KServe v2 gRPC: what protobuf or Python cannot hold (a lone
surrogate in a JSON string, JSON nested past the parser's depth, an integer past any float, an
INT64 tensor past a uint32 field) is a typed refusal naming the field, never INTERNAL (HTTP 500)
with a traceback in the log, and the door answers the next call as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx2
import pytest

from gantry.common.status import error_info_of
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc
from tests.integration.generation_support import tiny_lm_ready
from tests.integration.harness import Harness, running_gantry

CAPABILITY = "tiny-lm"


@pytest.fixture
async def gantry(
    sqlite_url: str, tmp_path: Path, tiny_causal_lm_dir: Path
) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root, http_listen="127.0.0.1:0") as harness:
        await tiny_lm_ready(harness, tiny_causal_lm_dir, capability=CAPABILITY, max_new_tokens=8)
        yield harness


def _base_url(harness: Harness) -> str:
    assert harness.control_plane.http_api is not None
    return f"http://127.0.0.1:{harness.control_plane.http_api.port}/v1"


def _no_unexpected_failures(caplog: pytest.LogCaptureFixture) -> None:
    unexpected = [r.getMessage() for r in caplog.records if "unexpected failure" in r.getMessage()]
    assert unexpected == []


# (route, raw body, the refusal's param)
_HOSTILE_BODIES = [
    ("/embeddings", rb'{"model": "tiny-lm", "input": "\ud800"}', None),
    ("/embeddings", b'{"model": "tiny-lm", "input": "\xed\xa0\x80"}', None),  # its UTF-8 form
    ("/embeddings", rb'{"model": "\udfff", "input": "hi"}', None),
    ("/embeddings", '{"model": "tiny-lm", "input": "\\ud800"}'.encode("utf-16"), None),
    ("/completions", rb'{"model": "tiny-lm", "prompt": "a\udc00b"}', None),
    ("/completions", rb'{"model": "tiny-lm", "prompt": "hi", "stop": ["\ud800"]}', None),
    ("/chat/completions", rb'{"model": "tiny-lm", "messages": [{"role": "\ud800"}]}', None),
    ("/chat/completions", rb'{"\ud800": 1}', None),
    ("/embeddings", b"[" * 100_000, None),
    ("/completions", b'{"model": "tiny-lm", "prompt": "hi", "temperature": 1' + b"0" * 400 + b"}",
     "temperature"),
    ("/completions", b'{"model": "tiny-lm", "prompt": "hi", "top_p": -1' + b"0" * 400 + b"}",
     "top_p"),
]  # fmt: skip


async def test_hostile_json_is_a_400_in_the_openai_shape(
    gantry: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    key = {"authorization": f"Bearer {gantry.api_key}", "content-type": "application/json"}
    async with httpx2.AsyncClient(base_url=_base_url(gantry), timeout=60) as http:
        for route, body, param in _HOSTILE_BODIES:
            refused = await http.post(route, content=body, headers=key)
            assert refused.status_code == 400, (route, body[:60], refused.text)
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "INVALID_ARGUMENT")
            assert error["param"] == param, (body[:60], error)

        # A surrogate pair is one ordinary character, and the door still answers.
        fine = await http.post(
            "/completions",
            content=rb'{"model": "tiny-lm", "prompt": "\ud83d\ude00", "max_tokens": 2}',
            headers=key,
        )
        assert fine.status_code == 200, fine.text
    _no_unexpected_failures(caplog)


def _generation_call(
    *extra: kserve.ModelInferRequest.InferInputTensor,
) -> kserve.ModelInferRequest:
    request = kserve.ModelInferRequest(model_name=CAPABILITY)
    request.inputs.add(
        name="text_input",
        datatype="BYTES",
        shape=[1],
        contents=kserve.InferTensorContents(bytes_contents=[b"The weather"]),
    )
    for tensor in extra:
        request.inputs.append(tensor)
    return request


def _int64(name: str, value: int) -> kserve.ModelInferRequest.InferInputTensor:
    return kserve.ModelInferRequest.InferInputTensor(
        name=name,
        datatype="INT64",
        shape=[1],
        contents=kserve.InferTensorContents(int64_contents=[value]),
    )


async def test_an_integer_tensor_past_its_gantry_field_is_invalid_argument(
    gantry: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    stub = kserve_grpc.GRPCInferenceServiceStub(gantry.channel)
    for name in ("max_tokens", "top_k"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(_generation_call(_int64(name, 2**40)), metadata=gantry.client_md)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        info = error_info_of(caught.value)
        assert info is not None and info.reason == "INVALID_ARGUMENT"
        assert info.metadata["field"] == name

    answered = await stub.ModelInfer(
        _generation_call(_int64("max_tokens", 2)), metadata=gantry.client_md
    )
    assert [output.name for output in answered.outputs] == ["text_output", "finish_reason"]
    _no_unexpected_failures(caplog)


async def test_bytes_that_are_not_a_request_message_are_invalid_argument(
    gantry: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # Field 1 (model_name / capability, strings) holding bytes that are not UTF-8, and a length
    # past the end of the message: once gRPC's UNKNOWN with a DecodeError traceback in the log.
    caplog.set_level(logging.ERROR)
    for path in ("/inference.GRPCInferenceService/ModelInfer", "/gantry.v1.Inference/Generate"):
        for raw in (b"\x0a\x02\xff\xfe", b"\x0a\x05ab"):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gantry.channel.unary_unary(path)(raw, metadata=gantry.client_md, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
            info = error_info_of(caught.value)
            assert info is not None and info.reason == "INVALID_ARGUMENT"
    _no_unexpected_failures(caplog)
