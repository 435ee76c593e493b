"""Credentials that can be cut off: revoked keys, rotated node credentials, bounded generations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry
from tests.integration.scripted_worker import ScriptedWorker


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        yield harness


async def _reason(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return caught.value.code(), info.reason if info else ""


async def test_a_revoked_api_key_is_refused_at_once_and_listed_without_its_secret(
    gantry: Harness,
):
    created = await gantry.operator.CreateApiKey(
        cp.CreateApiKeyRequest(tenant_id="tenant-b", name="ci"), metadata=gantry.op_md
    )
    embed = gantry.inference.Embed
    request = inf.EmbedRequest(capability="nothing", inputs=["x"])
    # Authenticated (the capability is unknown): the key works, and is now cached.
    assert await _reason(embed(request, metadata=auth_metadata(created.api_key))) == (
        grpc.StatusCode.NOT_FOUND,
        "NOT_FOUND",
    )
    revoked = await gantry.operator.RevokeApiKey(
        cp.RevokeApiKeyRequest(api_key_id=created.api_key_id), metadata=gantry.op_md
    )
    assert revoked.HasField("revoked_at")
    assert await _reason(embed(request, metadata=auth_metadata(created.api_key))) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "UNAUTHENTICATED",
    )
    listed = await gantry.operator.ListApiKeys(
        cp.ListApiKeysRequest(tenant_id="tenant-b"), metadata=gantry.op_md
    )
    assert [(k.api_key_id, k.name) for k in listed.api_keys] == [(created.api_key_id, "ci")]
    assert created.api_key not in str(listed)
    assert await _reason(
        gantry.operator.RevokeApiKey(
            cp.RevokeApiKeyRequest(api_key_id="00000000-0000-4000-8000-000000000000"),
            metadata=gantry.op_md,
        )
    ) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


async def test_a_rotated_node_credential_cuts_off_the_old_holder_at_once(gantry: Harness):
    old_credential = await gantry.register_node("rotated")
    holder = ScriptedWorker(generation=5)
    await holder.start(gantry.channel, old_credential)
    node_id = holder.welcome.node_id if holder.welcome else ""
    rotated = await gantry.operator.RotateNodeCredential(
        cp.RotateNodeCredentialRequest(node_id=node_id), metadata=gantry.op_md
    )
    assert rotated.credential and rotated.credential != old_credential
    await asyncio.wait_for(holder.ended.wait(), 10)  # the old stream is closed
    again = ScriptedWorker(generation=6)
    await again.start(gantry.channel, old_credential, wait=False)
    await asyncio.wait_for(again.ended.wait(), 10)
    assert again.end_error is not None
    assert again.end_error.code() == grpc.StatusCode.UNAUTHENTICATED
    fresh = ScriptedWorker(generation=7)
    await fresh.start(gantry.channel, rotated.credential)
    await fresh.stop()


async def test_a_generation_from_the_future_cannot_fence_the_node(gantry: Harness):
    """A Hello names a generation; the control plane issues one. A forged 2**63-1 gets the next
    issued value, and the next Hello (the real worker's) gets a newer one and the node."""
    credential = await gantry.register_node("fenced-by-nobody")
    forged = ScriptedWorker(generation=2**63 - 1)
    await forged.start(gantry.channel, credential)
    assert forged.welcome is not None and 0 < forged.welcome.accepted_generation < 2**32
    real = ScriptedWorker(generation=42)
    await real.start(gantry.channel, credential)
    assert real.generation > forged.generation
    await asyncio.wait_for(forged.ended.wait(), 10)  # the newest Hello wins
    assert forged.end_error is not None
    assert error_info_of(forged.end_error).reason == "STALE_GENERATION"  # type: ignore[union-attr]
    nodes = await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
    node = {n.name: n for n in nodes.nodes}["fenced-by-nobody"]
    assert node.generation == real.generation and node.state == common_pb2.NODE_STATE_CONNECTED
    await real.stop()


async def test_a_token_that_is_no_credential_is_told_what_the_call_needs(gantry: Harness):
    """Not "a operator token is required" for a token that was given: what is needed, and why
    the one given is not it."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=auth_metadata("nonsense"))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.details() == (
        "this call needs an operator token, and the bearer token given is not one "
        "(malformed, or of an unknown kind)"
    )
