"""Embedding rows framed as wire bytes parse to exactly the vectors built field by field."""

from __future__ import annotations

import numpy as np
import pytest

from gantry.common.errors import GantryError
from gantry.controlplane.serving.vector_wire import vectors_wire
from gantry.v1 import inference_pb2, worker_gateway_pb2

FLOATS = inference_pb2.VECTOR_ENCODING_FLOAT_LIST
BYTES = inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES


def _block(count: int, dim: int) -> worker_gateway_pb2.EmbedResult:
    rows = np.random.default_rng(count * 1000 + dim).standard_normal((count, dim)).astype("<f4")
    return worker_gateway_pb2.EmbedResult(count=count, dim=dim, float32_le=rows.tobytes())


def _parsed(result: worker_gateway_pb2.EmbedResult, encoding: int) -> inference_pb2.EmbedResponse:
    response = inference_pb2.EmbedResponse()
    response.MergeFromString(vectors_wire(result, encoding))
    return response


@pytest.mark.parametrize(("count", "dim"), [(1, 384), (32, 384), (3, 1), (2, 40), (1024, 16)])
def test_float_list_rows_parse_to_the_floats_of_the_block(count: int, dim: int) -> None:
    result = _block(count, dim)
    expected = np.frombuffer(result.float32_le, dtype="<f4").reshape(count, dim)
    vectors = _parsed(result, FLOATS).vectors
    assert len(vectors) == count
    assert np.array_equal(np.array([list(v.values) for v in vectors], dtype="<f4"), expected)
    assert all(not v.float32_le for v in vectors)


@pytest.mark.parametrize(("count", "dim"), [(1, 384), (32, 384), (200, 40)])
def test_bytes_rows_are_the_block_rows_unchanged(count: int, dim: int) -> None:
    result = _block(count, dim)
    row = dim * 4
    vectors = _parsed(result, BYTES).vectors
    assert [v.float32_le for v in vectors] == [
        result.float32_le[i * row : (i + 1) * row] for i in range(count)
    ]
    assert all(not v.values for v in vectors)


def test_the_wire_form_equals_the_message_built_field_by_field() -> None:
    result = _block(5, 384)
    rows = np.frombuffer(result.float32_le, dtype="<f4").reshape(5, 384)
    built = inference_pb2.EmbedResponse(
        vectors=[inference_pb2.Vector(values=row.tolist()) for row in rows]
    )
    assert vectors_wire(result, FLOATS) == built.SerializeToString()


def test_a_block_that_disagrees_with_count_and_dim_is_the_workers_fault() -> None:
    result = worker_gateway_pb2.EmbedResult(count=2, dim=4, float32_le=bytes(28))
    with pytest.raises(GantryError) as refused:
        vectors_wire(result, FLOATS)
    assert refused.value.reason == "INVOKE_FAILED"


def test_rows_of_width_zero_are_empty_vectors_one_per_input() -> None:
    result = worker_gateway_pb2.EmbedResult(count=3, dim=0, float32_le=b"")
    assert len(_parsed(result, FLOATS).vectors) == 3


@pytest.mark.parametrize("inputs", [1, 3])
def test_a_vector_count_other_than_the_inputs_is_the_worker_failing(inputs: int) -> None:
    from gantry.controlplane.serving.inference_service import embedding_response

    assert len(embedding_response(_block(2, 4), FLOATS, inputs=2).vectors) == 2
    with pytest.raises(GantryError) as caught:
        embedding_response(_block(2, 4), FLOATS, inputs=inputs)
    assert caught.value.reason == "INVOKE_FAILED"
    assert f"2 vectors for {inputs} inputs" in caught.value.message
