"""KServe v2 tensors decoded and encoded (kserve/tensors.py), the capability mappings' table, and
which KServe methods need a key: pure, no server."""

from __future__ import annotations

import struct

import pytest

from gantry.common.auth import Role, required_role
from gantry.common.errors import GantryError
from gantry.controlplane.serving.kserve.mappings import (
    EMBEDDING,
    GENERATION,
    IMAGE,
    OCR,
    mapping_of,
)
from gantry.controlplane.serving.kserve.tensors import (
    add_outputs,
    bytes_output,
    decode_inputs,
    fp32_values,
)
from gantry.kserve import grpc_service_pb2 as kserve

Tensor = kserve.ModelInferRequest.InferInputTensor


def _bytes_raw(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(value)) + value for value in values)


def _refusal(request: kserve.ModelInferRequest) -> GantryError:
    with pytest.raises(GantryError) as caught:
        decode_inputs(request)
    return caught.value


def test_raw_bytes_and_numbers_decode_in_row_major_order() -> None:
    request = kserve.ModelInferRequest(
        inputs=[
            Tensor(name="text", datatype="BYTES", shape=[2, 1]),
            Tensor(name="max_tokens", datatype="INT32", shape=[1]),
            Tensor(name="temperature", datatype="FP32", shape=[1]),
        ],
        raw_input_contents=[
            _bytes_raw(b"a", "ü".encode()),
            struct.pack("<i", 7),
            struct.pack("<f", 0.5),
        ],
    )
    tensors = decode_inputs(request)
    assert tensors["text"].values == (b"a", "ü".encode())
    assert tensors["text"].shape == (2, 1)
    assert tensors["max_tokens"].values == (7,)
    assert tensors["temperature"].values == (0.5,)


def test_typed_contents_decode_from_the_field_of_their_datatype() -> None:
    request = kserve.ModelInferRequest(
        inputs=[
            Tensor(
                name="text",
                datatype="BYTES",
                shape=[2],
                contents=kserve.InferTensorContents(bytes_contents=[b"x", b"y"]),
            ),
            Tensor(
                name="seed",
                datatype="UINT64",
                shape=[1],
                contents=kserve.InferTensorContents(uint64_contents=[2**63]),
            ),
        ]
    )
    tensors = decode_inputs(request)
    assert tensors["text"].values == (b"x", b"y")
    assert tensors["seed"].values == (2**63,)


@pytest.mark.parametrize(
    ("tensor", "raw", "field"),
    [
        (Tensor(name="text", datatype="BYTES", shape=[2]), _bytes_raw(b"one"), "text"),
        (Tensor(name="text", datatype="BYTES", shape=[1]), b"\x09\x00\x00\x00ab", "text"),
        (Tensor(name="n", datatype="INT32", shape=[2]), struct.pack("<i", 1), "n"),
        (Tensor(name="n", datatype="FP16", shape=[1]), b"\x00\x00", "n"),
        (Tensor(name="n", datatype="INT32", shape=[-1]), b"", "n"),
    ],
)
def test_a_tensor_that_disagrees_with_its_shape_or_type_is_refused_by_name(
    tensor: kserve.ModelInferRequest.InferInputTensor, raw: bytes, field: str
) -> None:
    error = _refusal(kserve.ModelInferRequest(inputs=[tensor], raw_input_contents=[raw]))
    assert error.reason == "INVALID_ARGUMENT"
    assert error.metadata["field"] == field


def test_raw_contents_must_match_the_inputs_one_for_one() -> None:
    error = _refusal(
        kserve.ModelInferRequest(
            inputs=[Tensor(name="a", datatype="BYTES", shape=[1])] * 2,
            raw_input_contents=[_bytes_raw(b"x")],
        )
    )
    assert error.metadata["field"] == "raw_input_contents"


def test_a_tensor_given_twice_is_refused() -> None:
    tensor = Tensor(
        name="text",
        datatype="BYTES",
        shape=[1],
        contents=kserve.InferTensorContents(bytes_contents=[b"x"]),
    )
    assert _refusal(kserve.ModelInferRequest(inputs=[tensor, tensor])).metadata["field"] == "text"


def test_outputs_go_raw_by_default_or_as_typed_contents() -> None:
    outputs = [
        fp32_values("scores", [0.25, 1.0], (2,)),
        bytes_output("text_output", [b"hi"], (1,)),
    ]
    raw = kserve.ModelInferResponse()
    add_outputs(raw, outputs, raw=True)
    assert raw.raw_output_contents == [struct.pack("<2f", 0.25, 1.0), _bytes_raw(b"hi")]
    assert [o.name for o in raw.outputs] == ["scores", "text_output"]
    assert not raw.outputs[0].HasField("contents")

    typed = kserve.ModelInferResponse()
    add_outputs(typed, outputs, raw=False)
    assert not typed.raw_output_contents
    assert list(typed.outputs[0].contents.fp32_contents) == [0.25, 1.0]
    assert list(typed.outputs[1].contents.bytes_contents) == [b"hi"]
    assert list(typed.outputs[0].shape) == [2]


def test_each_adapter_maps_to_its_tensors() -> None:
    assert mapping_of("") is EMBEDDING and mapping_of("sentence_transformers") is EMBEDDING
    assert mapping_of("transformers_causal_lm") is GENERATION
    assert mapping_of("llama_cpp_server") is GENERATION
    assert mapping_of("adopted_openai_endpoint") is GENERATION
    assert mapping_of("transformers_trocr") is OCR
    assert mapping_of("transformers_siglip2") is IMAGE
    assert mapping_of("no_such_adapter") is None
    assert [spec.name for spec in GENERATION.inputs if not spec.optional] == ["text_input"]


def test_an_input_a_capability_does_not_take_is_named() -> None:
    tensors = decode_inputs(
        kserve.ModelInferRequest(
            inputs=[
                Tensor(
                    name="prompt",
                    datatype="BYTES",
                    shape=[1],
                    contents=kserve.InferTensorContents(bytes_contents=[b"x"]),
                )
            ]
        )
    )
    with pytest.raises(GantryError) as caught:
        EMBEDDING.check_names(tensors)
    assert caught.value.metadata["field"] == "prompt"


@pytest.mark.parametrize("method", ["ServerLive", "ServerReady", "ServerMetadata"])
def test_health_and_server_metadata_are_open(method: str) -> None:
    assert required_role(f"/inference.GRPCInferenceService/{method}") is None


@pytest.mark.parametrize(
    "method",
    [
        "ModelReady",
        "ModelMetadata",
        "ModelInfer",
        "RepositoryIndex",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryModelLoad",  # refused UNIMPLEMENTED, but only to a key holder
    ],
)
def test_model_methods_need_a_client_key(method: str) -> None:
    assert required_role(f"/inference.GRPCInferenceService/{method}") is Role.CLIENT
