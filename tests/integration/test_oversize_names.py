"""Issue 26, item 9: a 1 MiB model name on every inference door gets its typed refusal (NOT_FOUND,
with its ErrorInfo) and a bounded message. Echoed whole, the name made the status's trailer
larger than gRPC's metadata limit, and the client got RESOURCE_EXHAUSTED without an ErrorInfo."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from gantry.common.status import error_info_of
from gantry.kserve import grpc_service_pb2 as kserve
from gantry.kserve import grpc_service_pb2_grpc as kserve_grpc
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry

# ASCII, and a name whose every character gRPC's status message percent-encodes (3 bytes each).
NAMES = {"ascii": "m" * (1 << 20), "non-ascii": "é" * (1 << 19)}
# What a refusal's message may take: the name is echoed as an excerpt with its length.
MESSAGE_CHARS = 400


@pytest.fixture
async def gantry(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(sqlite_url, tmp_path, http_listen="127.0.0.1:0") as harness:
        yield harness


def _assert_not_found(failure: grpc.aio.AioRpcError, name: str) -> None:
    assert failure.code() == grpc.StatusCode.NOT_FOUND, failure.code()
    info = error_info_of(failure)
    assert info is not None and info.reason == "NOT_FOUND"
    details = failure.details() or ""
    assert len(details) < MESSAGE_CHARS and f"({len(name)} characters)" in details, details
    assert all(len(value) < MESSAGE_CHARS for value in info.metadata.values())


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
async def test_gantry_embed_with_a_huge_capability(gantry: Harness, name: str):
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gantry.inference.Embed(
            inf.EmbedRequest(capability=name, inputs=["a text"]), metadata=gantry.client_md
        )
    _assert_not_found(refused.value, name)


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
async def test_kserve_model_infer_and_metadata_with_a_huge_model_name(gantry: Harness, name: str):
    stub = kserve_grpc.GRPCInferenceServiceStub(gantry.channel)
    infer = kserve.ModelInferRequest(
        model_name=name,
        inputs=[
            kserve.ModelInferRequest.InferInputTensor(
                name="text",
                datatype="BYTES",
                shape=[1, 1],
                contents=kserve.InferTensorContents(bytes_contents=[b"a text"]),
            )
        ],
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ModelInfer(infer, metadata=gantry.client_md)
    _assert_not_found(refused.value, name)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ModelMetadata(kserve.ModelMetadataRequest(name=name), metadata=gantry.client_md)
    _assert_not_found(refused.value, name)


@pytest.mark.parametrize("name", NAMES.values(), ids=NAMES.keys())
async def test_openai_embeddings_with_a_huge_model(gantry: Harness, name: str):
    api = gantry.control_plane.http_api
    assert api is not None
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{api.port}/v1",
        headers={"Authorization": f"Bearer {gantry.api_key}"},
        timeout=60,
    ) as http:
        response = await http.post("/embeddings", json={"model": name, "input": "a text"})
    assert response.status_code == 404, response.text[:500]
    error = response.json()["error"]
    assert error["code"] == "NOT_FOUND"
    assert len(error["message"]) < MESSAGE_CHARS and f"({len(name)} characters)" in error["message"]
    assert len(response.content) < 2 * MESSAGE_CHARS
