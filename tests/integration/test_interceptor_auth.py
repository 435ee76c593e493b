"""Authentication happens before the handler, for every handler shape, and fails closed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gantry.common.auth import Principal, Role, current_principal
from gantry.common.errors import GantryError
from gantry.common.grpc_server import SERVER_OPTIONS, insecure_channel
from gantry.common.interceptors import GantryServerInterceptor
from gantry.common.status import error_from_rpc

TOKEN = "gop_id_secret"


class _OneToken:
    async def authenticate(self, role: Role, token: str) -> Principal:
        if token != TOKEN:
            raise GantryError("UNAUTHENTICATED", "no")
        return Principal(role=role, subject="someone")


@pytest.fixture
async def served() -> AsyncIterator[tuple[grpc.aio.Channel, list[str]]]:
    ran: list[str] = []

    async def upload(requests: AsyncIterator[bytes], context: object) -> bytes:
        async for _ in requests:
            pass
        ran.append(current_principal().subject)
        return b"ok"

    async def echo(request: bytes, context: object) -> bytes:
        ran.append(current_principal().subject)
        return request

    server = grpc.aio.server(
        interceptors=[GantryServerInterceptor(_OneToken())], options=SERVER_OPTIONS
    )
    handlers = {
        "Upload": grpc.stream_unary_rpc_method_handler(upload),
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
    }
    # A ControlPlane method name, so the operator role is required.
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("gantry.v1.ControlPlane", handlers)]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel, ran
    await server.stop(None)


async def _requests() -> AsyncIterator[bytes]:
    yield b"a"
    yield b"b"


async def test_a_client_streaming_call_needs_a_token(served):
    channel, ran = served
    upload = channel.stream_unary("/gantry.v1.ControlPlane/Upload")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await upload(_requests())
    assert error_from_rpc(caught.value).reason == "UNAUTHENTICATED"
    assert ran == []
    answer = await upload(_requests(), metadata=(("authorization", f"Bearer {TOKEN}"),))
    assert answer == b"ok" and ran == ["someone"]


async def test_a_refused_call_never_reaches_its_handler(served):
    channel, ran = served
    echo = channel.unary_unary("/gantry.v1.ControlPlane/Echo")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await echo(b"\xff\xfe not even protobuf", metadata=(("authorization", "Bearer nope"),))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ran == []


async def test_service_limits_refuse_oversize_requests_and_excess_calls_before_the_handler():
    import asyncio

    from gantry.common.interceptors import ServiceLimit

    release, entered = asyncio.Event(), asyncio.Event()
    ran: list[bytes] = []

    async def hold(request: bytes, context: object) -> bytes:
        ran.append(request)
        entered.set()
        await release.wait()
        return b"done"

    limits = {"/gantry.v1.Inference/": ServiceLimit(max_request_bytes=100, max_in_flight=1)}
    server = grpc.aio.server(
        interceptors=[GantryServerInterceptor(_OneToken(), limits=limits)], options=SERVER_OPTIONS
    )
    handlers = {"Hold": grpc.unary_unary_rpc_method_handler(hold)}
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("gantry.v1.Inference", handlers)]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    try:
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/gantry.v1.Inference/Hold")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"x" * 101, metadata=metadata, timeout=5)
            oversize = error_from_rpc(caught.value)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert oversize.metadata["limit_bytes"] == "100" and ran == []
            first = asyncio.ensure_future(call(b"first", metadata=metadata))
            await asyncio.wait_for(entered.wait(), 10)  # the first call is inside its handler
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"second", metadata=metadata, timeout=5)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_from_rpc(caught.value).metadata["limit"] == "1"
            release.set()
            assert await first == b"done"
            assert await call(b"third", metadata=metadata, timeout=5) == b"done"
    finally:
        await server.stop(None)


async def test_bytes_that_do_not_parse_are_invalid_argument_before_the_handler():
    # Corrupt wire data, or a string field holding invalid UTF-8, used to reach grpc's own
    # deserializer and come back UNKNOWN ("Unexpected DecodeError") with a traceback logged.
    from gantry.v1 import inference_pb2 as inf

    ran: list[str] = []

    async def embed(request: inf.EmbedRequest, context: object) -> inf.EmbedRequest:
        ran.append(request.capability)
        return request

    async def stream(request: inf.EmbedRequest, context: object) -> AsyncIterator[inf.EmbedRequest]:
        ran.append(request.capability)
        yield request

    server = grpc.aio.server(
        interceptors=[GantryServerInterceptor(_OneToken())], options=SERVER_OPTIONS
    )
    parse = inf.EmbedRequest.FromString
    write = inf.EmbedRequest.SerializeToString
    handlers = {
        "Embed": grpc.unary_unary_rpc_method_handler(embed, parse, write),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, parse, write),
    }
    for service in ("gantry.v1.Inference", "inference.GRPCInferenceService", "gantry.v1.Scheduler"):
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (capability, a string), two bytes that are not UTF-8
    truncated = b"\x0a\x05ab"  # a length past the end of the message
    try:
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            for path in (
                "/gantry.v1.Inference/Embed",
                "/inference.GRPCInferenceService/Embed",
                "/gantry.v1.Scheduler/Embed",  # no byte limit: parsed all the same
            ):
                for raw in (bad_utf8, truncated):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await channel.unary_unary(path)(raw, metadata=metadata, timeout=5)
                    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
                    assert "does not parse" in error_from_rpc(caught.value).message
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in channel.unary_stream("/gantry.v1.Inference/Stream")(
                    bad_utf8, metadata=metadata, timeout=5
                ):
                    pass
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert ran == []
            good = write(inf.EmbedRequest(capability="tiny"))
            echoed = await channel.unary_unary("/gantry.v1.Inference/Embed")(
                good, metadata=metadata, timeout=5
            )
            assert parse(echoed).capability == "tiny" and ran == ["tiny"]
    finally:
        await server.stop(None)
