"""Errors mapped to gRPC by the interceptor of a served server: a GantryError becomes its status
code with exactly one ErrorInfo, an unexpected exception INTERNAL without a traceback, and a
stream that fails midway ends with a typed status.

The reasons and their round trip are tested in tests/unit/test_error_mapping.py; these serve gRPC
on a port, which the unit guard refuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from gantry.common.errors import ERROR_DOMAIN, GantryError
from gantry.common.grpc_server import insecure_channel
from gantry.common.interceptors import GantryServerInterceptor
from gantry.common.status import error_from_rpc


def _raise_gantry(request: bytes, context: object) -> bytes:
    raise GantryError("ARTIFACT_MISMATCH", "config.json changed", path="config.json")


async def _raise_unexpected(request: bytes, context: object) -> bytes:
    raise ValueError("secret internals /etc/passwd")


async def _stream_then_fail(request: bytes, context: object) -> AsyncIterator[bytes]:
    yield b"first"
    raise GantryError("RUNTIME_CRASHED", "host died")


async def _gantry_async(request: bytes, context: object) -> bytes:
    _raise_gantry(request, context)
    return b""


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server(interceptors=[GantryServerInterceptor(None)])
    handlers = {
        "Typed": grpc.unary_unary_rpc_method_handler(_gantry_async),
        "Unexpected": grpc.unary_unary_rpc_method_handler(_raise_unexpected),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream_then_fail),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.T", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop(None)


def _info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None and len(status.details) == 1
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return info


async def test_a_gantry_error_becomes_its_code_with_one_error_info(channel: grpc.aio.Channel):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await channel.unary_unary("/test.T/Typed")(b"")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = _info(caught.value)
    assert (info.reason, info.domain) == ("ARTIFACT_MISMATCH", ERROR_DOMAIN)
    assert info.metadata["path"] == "config.json"
    assert info.metadata["failure_class"] == "CONFIG"
    rebuilt = error_from_rpc(caught.value)
    assert rebuilt.reason == "ARTIFACT_MISMATCH" and rebuilt.metadata == {"path": "config.json"}


async def test_an_unexpected_exception_is_internal_without_a_traceback(channel: grpc.aio.Channel):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await channel.unary_unary("/test.T/Unexpected")(b"")
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "passwd" not in (caught.value.details() or "")
    assert "Traceback" not in (caught.value.details() or "")
    assert _info(caught.value).reason == "INTERNAL"


async def test_a_stream_that_fails_midway_ends_with_a_typed_status(channel: grpc.aio.Channel):
    call = channel.unary_stream("/test.T/Stream")(b"")
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for message in call:
            received.append(message)
    assert received == [b"first"]
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _info(caught.value).reason == "RUNTIME_CRASHED"
