"""A refused credential reads the same whether its id exists or not (issue 26, item 9).

An unknown id, a revoked key and a wrong secret get one status, one reason and one message on
every role's door, so a caller without the secret cannot probe which ids exist.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.status import error_info_of
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.v1 import worker_gateway_pb2_grpc
from tests.integration.harness import Harness, running_gantry

Refusal = tuple[grpc.StatusCode, str, str]


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        yield harness


def _unknown_id(token: str) -> str:
    """The same kind and secret under an id nobody holds."""
    kind, token_id, secret = token.split("_", 2)
    return f"{kind}_{'z' * len(token_id)}_{secret}"


def _wrong_secret(token: str) -> str:
    return token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")


async def _refusal(call: Awaitable[object]) -> Refusal:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return caught.value.code(), info.reason if info else "", caught.value.details() or ""


async def _worker_refusal(gantry: Harness, credential: str) -> Refusal:
    stub = worker_gateway_pb2_grpc.WorkerGatewayStub(gantry.channel)

    async def hello():  # type: ignore[no-untyped-def]
        yield wg.WorkerMessage(generation=1, hello=wg.Hello())

    async def drain() -> None:
        async for _ in stub.Connect(hello(), metadata=auth_metadata(credential)):
            pass

    return await _refusal(drain())


def _assert_one_refusal(refusals: list[Refusal]) -> None:
    assert refusals[0][:2] == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert all(refusal == refusals[0] for refusal in refusals), refusals


async def test_unknown_and_wrong_client_keys_get_one_refusal(gantry: Harness) -> None:
    created = await gantry.operator.CreateApiKey(
        cp.CreateApiKeyRequest(tenant_id="tenant-r", name="probe"), metadata=gantry.op_md
    )
    revoked = await gantry.operator.CreateApiKey(
        cp.CreateApiKeyRequest(tenant_id="tenant-r", name="gone"), metadata=gantry.op_md
    )
    await gantry.operator.RevokeApiKey(
        cp.RevokeApiKeyRequest(api_key_id=revoked.api_key_id), metadata=gantry.op_md
    )
    request = inf.EmbedRequest(capability="nothing", inputs=["x"])
    presented = [_unknown_id(created.api_key), _wrong_secret(created.api_key), revoked.api_key]
    refusals = [
        await _refusal(gantry.inference.Embed(request, metadata=auth_metadata(key)))
        for key in presented
    ]
    _assert_one_refusal(refusals)


async def test_unknown_and_wrong_operator_tokens_get_one_refusal(gantry: Harness) -> None:
    presented = [_unknown_id(gantry.operator_token), _wrong_secret(gantry.operator_token)]
    refusals = [
        await _refusal(
            gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=auth_metadata(token))
        )
        for token in presented
    ]
    _assert_one_refusal(refusals)


async def test_unknown_and_wrong_node_credentials_get_one_refusal(gantry: Harness) -> None:
    credential = await gantry.register_node("probed-node")
    refusals = [
        await _worker_refusal(gantry, forged)
        for forged in (_unknown_id(credential), _wrong_secret(credential))
    ]
    _assert_one_refusal(refusals)
