"""gantry.client's methods as data: one per gantry.v1.Inference RPC (from the operations table),
on both clients, streaming where the RPC streams; the requests they build; and the vectors of an
EmbedResponse as a float32 array, from bytes or from a float list, bit for bit."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from gantry.client import AsyncClient, Client, calls
from gantry.client.vectors import MalformedVectors, vectors_of
from gantry.common.operations import OPERATIONS
from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf


def test_every_inference_rpc_is_a_method_of_both_clients_named_in_snake_case() -> None:
    declared = {method.name for method in inf.DESCRIPTOR.services_by_name["Inference"].methods}
    assert {operation.rpc for operation in OPERATIONS} == declared
    assert set(calls.RPCS) == {calls.snake_case(rpc) for rpc in declared}
    assert calls.snake_case("GenerateStream") == "generate_stream"
    assert calls.snake_case("EmbedImage") == "embed_image"
    for name, rpc in calls.RPCS.items():
        assert rpc.path == f"/gantry.v1.Inference/{rpc.operation.rpc}"
        blocking, awaited = getattr(Client, name), getattr(AsyncClient, name)
        if rpc.operation.streaming:
            assert not inspect.iscoroutinefunction(awaited)
        else:
            assert inspect.iscoroutinefunction(awaited) and not inspect.iscoroutinefunction(
                blocking
            )
        # The two clients take the same arguments.
        assert inspect.signature(blocking).parameters.keys() == (
            inspect.signature(awaited).parameters.keys()
        )


def test_embed_asks_for_little_endian_bytes() -> None:
    call = calls.embed("minilm", ("a", "b"), truncate=True)
    assert call.rpc is calls.RPCS["embed"]
    assert call.request == inf.EmbedRequest(
        capability="minilm",
        inputs=["a", "b"],
        truncate=True,
        encoding=inf.VECTOR_ENCODING_FLOAT32_LE_BYTES,
    )


def test_rerank_results_name_their_documents() -> None:
    call = calls.rerank("rank", "q", ["x", "y", "z"], top_n=2, truncate=False)
    response = inf.RerankResponse(
        results=[inf.RankedDocument(index=2, score=0.75), inf.RankedDocument(index=0, score=0.5)]
    )
    assert call.shape(response) == [calls.Ranked(2, "z", 0.75), calls.Ranked(0, "x", 0.5)]
    assert call.request.top_n == 2


def test_a_generation_takes_chat_messages_as_mappings_and_sampling_settings() -> None:
    options: calls.Generation = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stop": ["\n"],
        "temperature": 0.5,
        "top_k": 3,
        "seed": 7,
    }
    request = calls.generate_request("chat", "", options)
    assert request.messages[0].role == "user" and request.messages[0].content == "hi"
    assert (request.max_tokens, list(request.stop)) == (8, ["\n"])
    assert (request.sampling.top_k, request.sampling.seed) == (3, 7)
    assert calls.generate_stream(request).rpc.operation.streaming
    with pytest.raises(TypeError, match="max_tokenz"):
        calls.generate_request("chat", "", {"max_tokenz": 3})  # type: ignore[typeddict-unknown-key]
    # Each option left out keeps the proto's default.
    assert calls.generate_request("chat", "p", {}) == inf.GenerateRequest(
        capability="chat", prompt="p", sampling=common_pb2.SamplingSettings()
    )


VECTORS = np.array([[1.5, -2.0, 3.25], [0.0, 1e-30, -7.0]], dtype=np.float32)


def test_bytes_vectors_are_the_rows_bit_for_bit() -> None:
    response = inf.EmbedResponse(
        vectors=[inf.Vector(float32_le=row.astype("<f4").tobytes()) for row in VECTORS],
        dim=3,
        encoding=inf.VECTOR_ENCODING_FLOAT32_LE_BYTES,
    )
    got = vectors_of(response)
    assert got.dtype == np.float32 and got.shape == (2, 3) and got.flags.writeable
    np.testing.assert_array_equal(got, VECTORS)


def test_float_list_vectors_read_the_same() -> None:
    response = inf.EmbedResponse(
        vectors=[inf.Vector(values=row.tolist()) for row in VECTORS], dim=3
    )
    np.testing.assert_array_equal(vectors_of(response), VECTORS)


def test_no_vectors_is_an_empty_array_of_the_dim() -> None:
    response = inf.EmbedResponse(dim=4, encoding=inf.VECTOR_ENCODING_FLOAT32_LE_BYTES)
    assert vectors_of(response).shape == (0, 4)


@pytest.mark.parametrize(
    "response",
    [
        inf.EmbedResponse(
            vectors=[inf.Vector(float32_le=b"\x00" * 8)],
            dim=3,
            encoding=inf.VECTOR_ENCODING_FLOAT32_LE_BYTES,
        ),
        inf.EmbedResponse(vectors=[inf.Vector(values=[1.0, 2.0])], dim=3),
    ],
)
def test_vectors_that_disagree_with_dim_are_refused(response: inf.EmbedResponse) -> None:
    with pytest.raises(MalformedVectors):
        vectors_of(response)
