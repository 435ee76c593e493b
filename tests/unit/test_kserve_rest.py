"""The Open Inference Protocol's REST spelling <-> the gRPC door's messages (kserve/rest.py): JSON
and binary tensors in, JSON and binary outputs back, errors as KServe's `{"error": ...}`; and the
Triton extensions' pure parts: the model configuration, the embedding's stated width, and
ModelStreamInfer's responses (kserve/streaming.py)."""

from __future__ import annotations

import json
import struct

import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.serving.kserve import rest
from gantry.controlplane.serving.kserve.mappings import (
    EMBEDDING,
    RERANK,
    probed_width,
    stated_outputs,
)
from gantry.controlplane.serving.kserve.service import config_of
from gantry.controlplane.serving.kserve.streaming import (
    FINAL_PARAMETER,
    chunk_response,
    stream_error,
)
from gantry.controlplane.serving.kserve.tensors import decode_inputs, fp32_values
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf


def _body(document: dict) -> bytes:
    return json.dumps(document).encode()


def _length_prefixed(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(value)) + value for value in values)


def test_json_data_become_the_raw_inputs_the_grpc_door_decodes() -> None:
    call = rest.infer_request(
        "embed",
        "",
        _body(
            {
                "id": "r1",
                "inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": [["a"], ["bé"]]},
                    {"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [7]},
                    {"name": "temperature", "datatype": "FP32", "shape": [1], "data": [0.5]},
                ],
                "parameters": {"priority": "BATCH", "truncate": True},
            }
        ),
        None,
    )
    assert call.request.model_name == "embed" and call.request_id == "r1"
    assert call.request.parameters["priority"].string_param == "BATCH"
    assert call.request.parameters["truncate"].bool_param is True
    # The gRPC door is always asked for raw outputs; the REST caller's choice is kept apart.
    assert call.request.parameters["binary_data_output"].bool_param is True
    assert call.binary_outputs == frozenset()
    tensors = decode_inputs(call.request)
    assert tensors["text"].values == (b"a", "bé".encode())
    assert tensors["text"].shape == (2, 1)
    assert tensors["max_tokens"].values == (7,)
    assert tensors["temperature"].values == (0.5,)


def test_binary_inputs_are_sliced_from_the_tail_in_input_order() -> None:
    head = _body(
        {
            "inputs": [
                {
                    "name": "query",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 8},
                },
                {"name": "documents", "datatype": "BYTES", "shape": [1], "data": ["doc"]},
                {
                    "name": "seed",
                    "datatype": "UINT64",
                    "shape": [1],
                    "parameters": {"binary_data_size": 8},
                },
            ],
            "outputs": [{"name": "scores", "parameters": {"binary_data": True}}],
        }
    )
    body = head + _length_prefixed(b"whyy") + struct.pack("<Q", 2**63)
    call = rest.infer_request("rerank", "1", body, str(len(head)))
    tensors = decode_inputs(call.request)
    assert tensors["query"].values == (b"whyy",)
    assert tensors["documents"].values == (b"doc",)
    assert tensors["seed"].values == (2**63,)
    assert [output.name for output in call.request.outputs] == ["scores"]
    assert call.binary_outputs == frozenset({"scores"})
    assert call.request.model_version == "1"


@pytest.mark.parametrize(
    ("document", "header_length", "tail", "field"),
    [
        ({"inputs": []}, None, b"", "inputs"),
        ({"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1]}]}, None, b"", "t"),
        (
            {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": [1]}]},
            None,
            b"",
            "t",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "INT32", "shape": [1], "data": [1.5]}]},
            None,
            b"",
            "t",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "INT8", "shape": [1], "data": [300]}]},
            None,
            b"",
            "t",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "FP32", "shape": [1], "data": [True]}]},
            None,
            b"",
            "t",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "BF16", "shape": [1], "data": [1.0]}]},
            None,
            b"",
            "t",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "BYTES", "shape": "1", "data": ["a"]}]},
            None,
            b"",
            "t",
        ),
        (
            {
                "inputs": [
                    {
                        "name": "t",
                        "datatype": "BYTES",
                        "shape": [1],
                        "parameters": {"binary_data_size": 99},
                    }
                ]
            },
            "auto",
            b"\x00",
            "t",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}]},
            "auto",
            b"unclaimed",
            "body",
        ),
        (
            {"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}]},
            "x",
            b"",
            rest.HEADER_LENGTH,
        ),
    ],
)
def test_a_malformed_request_is_invalid_argument_naming_what(
    document: dict, header_length: str | None, tail: bytes, field: str
) -> None:
    head = _body(document)
    length = str(len(head)) if header_length == "auto" else header_length
    with pytest.raises(GantryError) as caught:
        rest.infer_request("m", "", head + tail, length)
    assert caught.value.reason == "INVALID_ARGUMENT"
    assert caught.value.metadata["field"] == field


def test_a_body_that_is_not_json_is_refused() -> None:
    with pytest.raises(GantryError) as caught:
        rest.infer_request("m", "", b"{not json", None)
    assert caught.value.reason == "INVALID_ARGUMENT"


def _answer() -> kserve.ModelInferResponse:
    answer = kserve.ModelInferResponse(
        model_name="embed",
        id="r1",
        parameters={
            "deployment_id": kserve.InferParameter(string_param="d1"),
            "node_id": kserve.InferParameter(string_param="n1"),
        },
    )
    vectors = fp32_values("embedding", [0.25, -1.5, 3.0, 0.1], (2, 2))
    answer.outputs.add(name="embedding", datatype="FP32", shape=[2, 2])
    answer.raw_output_contents.append(vectors.raw)
    answer.outputs.add(name="text", datatype="BYTES", shape=[1])
    answer.raw_output_contents.append(_length_prefixed("ü".encode()))
    return answer


def test_outputs_are_json_data_unless_asked_binary() -> None:
    spelled = rest.infer_response(_answer(), frozenset())
    assert spelled.header_length is None and spelled.content_type == rest.JSON_TYPE
    document = json.loads(spelled.body)
    assert document["model_name"] == "embed" and document["id"] == "r1"
    assert document["parameters"] == {"deployment_id": "d1", "node_id": "n1"}
    embedding, text = document["outputs"]
    assert embedding["shape"] == [2, 2] and embedding["datatype"] == "FP32"
    # float32 values, as JSON doubles that read back as the same float32s.
    assert struct.pack("<4f", *embedding["data"]) == _answer().raw_output_contents[0]
    assert text["data"] == ["ü"]


def test_binary_outputs_follow_the_json_part_in_order() -> None:
    answer = _answer()
    for wanted in (frozenset({"*"}), frozenset({"embedding", "text"})):
        spelled = rest.infer_response(answer, wanted)
        assert spelled.content_type == rest.BINARY_TYPE
        head = json.loads(spelled.body[: spelled.header_length])
        sizes = [output["parameters"]["binary_data_size"] for output in head["outputs"]]
        assert sizes == [16, 6] and "data" not in head["outputs"][0]
        assert spelled.body[spelled.header_length :] == b"".join(answer.raw_output_contents)
    mixed = rest.infer_response(answer, frozenset({"text"}))
    head = json.loads(mixed.body[: mixed.header_length])
    assert (
        "data" in head["outputs"][0] and head["outputs"][1]["parameters"]["binary_data_size"] == 6
    )


def test_metadata_and_config_state_the_tensors() -> None:
    metadata = kserve.ModelMetadataResponse(name="embed", platform="gantry")
    metadata.inputs.add(name="text", datatype="BYTES", shape=[-1])
    metadata.outputs.add(name="embedding", datatype="FP32", shape=[-1, 384])
    assert rest.model_metadata(metadata) == {
        "name": "embed",
        "versions": [],
        "platform": "gantry",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}],
    }
    config = config_of(metadata)  # the gRPC door's ModelConfig, spelled in REST below
    assert config.input[0].data_type == kserve.TYPE_STRING
    document = rest.model_config(kserve.ModelConfigResponse(config=config))
    assert document["backend"] == "gantry" and document["platform"] == "gantry"
    assert document["max_batch_size"] == 0
    assert document["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert document["output"] == [
        {"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1, 384]}
    ]


def test_the_repository_index_body_may_be_empty() -> None:
    assert rest.index_ready_only(b"") is False
    assert rest.index_ready_only(b'{"ready": true}') is True
    with pytest.raises(GantryError):
        rest.index_ready_only(b'{"ready": "yes"}')


def test_an_error_is_kserve_shaped_with_gantry_reason() -> None:
    refused = rest.rest_error(GantryError("QUEUE_FULL", "try again", tenant_id="t"), 429)
    assert refused.status == 429
    assert refused.body == {"error": "try again", "code": "QUEUE_FULL", "param": None}
    assert refused.headers == {rest.REASON_HEADER: "QUEUE_FULL"}
    field = rest.rest_error(GantryError("INVALID_ARGUMENT", "bad", field="text"), 400)
    assert field.body["param"] == "text"


def test_an_embedding_width_is_stated_from_its_probe_shape() -> None:
    assert probed_width(EMBEDDING.kind, [1, 384]) == 384
    # Not stated: another kind, a shape that is not [1, dim], a width that is no width.
    assert probed_width(RERANK.kind, [1, 384]) == 0
    assert probed_width(EMBEDDING.kind, [384]) == 0
    assert probed_width(EMBEDDING.kind, [1, 0]) == 0
    assert probed_width(EMBEDDING.kind, []) == 0
    (embedding,) = stated_outputs(EMBEDDING, 384)
    assert embedding.shape == (-1, 384)
    assert stated_outputs(EMBEDDING, 0) == EMBEDDING.outputs
    assert stated_outputs(RERANK, 384) == RERANK.outputs


def test_a_generation_chunk_is_one_decoupled_response_the_last_one_final() -> None:
    request = kserve.ModelInferRequest(model_name="lm", id="s1")
    middle = chunk_response(request, inf.GenerateChunk(text="Hel"), raw=True).infer_response
    assert middle.model_name == "lm" and middle.id == "s1"
    assert middle.parameters[FINAL_PARAMETER].bool_param is False
    assert [output.name for output in middle.outputs] == ["text_output"]
    assert middle.raw_output_contents == [_length_prefixed(b"Hel")]
    last = chunk_response(
        request,
        inf.GenerateChunk(
            finish_reason=common_pb2.FINISH_REASON_LENGTH, deployment_id="d1", node_id="n1"
        ),
        raw=False,
    ).infer_response
    assert last.parameters[FINAL_PARAMETER].bool_param is True
    assert last.parameters["deployment_id"].string_param == "d1"
    assert [output.name for output in last.outputs] == ["text_output", "finish_reason"]
    assert list(last.outputs[1].contents.bytes_contents) == [b"length"]


def test_a_refused_stream_request_carries_its_reason_first() -> None:
    request = kserve.ModelInferRequest(model_name="lm", id="s2")
    answer = stream_error(request, GantryError("QUEUE_FULL", "try again"))
    assert answer.error_message == "QUEUE_FULL: try again"
    assert answer.infer_response.id == "s2"
