"""Refusals that need only the headers are given before the body is read (issue 26, item 4).

On the HTTP door: a call without a valid key is answered 401, and an authenticated one whose
Content-Length passes the bound 413, while the client has sent nothing of its body; a chunked body
is cut at the bound, answered 413 before its end; each closes the connection, so the unread rest is
never drained. On gRPC: a message past a server's receive limit is refused RESOURCE_EXHAUSTED by
the transport itself, whether or not the call is authenticated.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gantry.common.auth import Principal, Role
from gantry.common.errors import GantryError
from gantry.common.grpc_server import ServiceBinding, create_server, insecure_channel
from gantry.controlplane.serving.openai_http import HttpApi, HttpApiSettings, start_http_api

HANG_GUARD_S = 30.0
BODY_BOUND = 64 * 1024
RECEIVE_LIMIT = 256 * 1024
TOKEN = "good-key"


class _OneKey:
    async def authenticate(self, role: Role, token: str) -> Principal:
        if token != TOKEN:
            raise GantryError("UNAUTHENTICATED", "unknown key")
        return Principal(role=role, subject="tenant-a")


@pytest.fixture
async def door() -> AsyncIterator[HttpApi]:
    api = await start_http_api(
        HttpApiSettings(listen="127.0.0.1:0", max_body_bytes=BODY_BOUND, max_in_flight=4),
        inference=Any,  # type: ignore[arg-type]  # never reached: every call here is refused
        authenticator=_OneKey(),
        database=Any,  # type: ignore[arg-type]
    )
    yield api
    await api.stop()


def _head(key: str | None, length_header: str) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key is not None else ""
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\n{auth}"
        f"content-type: application/json\r\n{length_header}\r\n\r\n"
    ).encode()


# Sent after a refusal: what a client that does not wait for the answer would send next.
SECOND_REQUEST = b"GET /v1/models HTTP/1.1\r\nhost: gantry\r\n\r\n"
LARGE = 8 * 1024 * 1024  # declared in the headers, sent only after the refusal came


def _refused(port: int, sent_first: bytes, sent_after: bytes) -> tuple[int, dict[str, Any], bytes]:
    """Sends `sent_first`, reads one response, then sends `sent_after` (the rest of the body and
    a second request) and reads what else comes until the connection ends. A server that read the
    rest of the body to keep the connection would answer the second request too."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(sent_first)
        status, body = _one_response(sock)
        rest = b""
        try:
            sock.sendall(sent_after)
            while chunk := sock.recv(65536):
                rest += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed, and the unread body made the close a reset: nothing else came
        return status, body, rest


async def _answer(port: int, sent_first: bytes, sent_after: bytes) -> tuple[int, dict[str, Any]]:
    status, body, rest = await asyncio.to_thread(_refused, port, sent_first, sent_after)
    assert rest == b"", "the connection was kept, its body read to the end and thrown away"
    return status, body


async def test_an_unauthenticated_oversize_body_is_refused_401_before_a_byte_of_it(door: HttpApi):
    # 8 MiB declared, none of it sent: the 401 and the close come on the headers alone.
    rest = b"x" * LARGE + SECOND_REQUEST
    for key in ("wrong", None):
        status, body = await _answer(door.port, _head(key, f"content-length: {LARGE}"), rest)
        assert status == 401
        assert body["error"]["code"] == "UNAUTHENTICATED"
        assert body["error"]["type"] == "authentication_error"


async def test_a_declared_length_past_the_bound_is_refused_413_before_a_byte_of_it(door: HttpApi):
    rest = b"x" * LARGE + SECOND_REQUEST
    status, body = await _answer(door.port, _head(TOKEN, f"content-length: {LARGE}"), rest)
    assert status == 413
    assert body["error"]["code"] == "INVALID_ARGUMENT"
    assert body["error"]["type"] == "invalid_request_error"
    assert str(LARGE) in body["error"]["message"]
    assert str(BODY_BOUND) in body["error"]["message"]


async def test_a_chunked_body_is_cut_at_the_bound(door: HttpApi):
    chunk = b"x" * 4096
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    past_the_bound = BODY_BOUND // len(chunk) + 1
    # The answer comes when the bound is passed, before the body's end (0\r\n\r\n) was sent.
    head = _head(TOKEN, "transfer-encoding: chunked")
    rest = framed * past_the_bound + b"0\r\n\r\n" + SECOND_REQUEST
    status, body = await _answer(door.port, head + framed * past_the_bound, rest)
    assert status == 413
    assert body["error"]["code"] == "INVALID_ARGUMENT"
    assert str(BODY_BOUND) in body["error"]["message"]


async def test_a_body_within_the_bound_still_reaches_parsing_on_a_kept_connection(door: HttpApi):
    # Control: a whole body is read (and refused for its content, not its size), and the
    # connection is kept for the next request.
    request = _head(TOKEN, "content-length: 2") + b"{}"
    with socket.create_connection(("127.0.0.1", door.port), timeout=HANG_GUARD_S) as sock:
        for _ in range(2):
            await asyncio.to_thread(sock.sendall, request)
            status, body = await asyncio.to_thread(_one_response, sock)
            assert status == 400 and body["error"]["param"] == "input"


def _one_response(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """One response of a kept-alive connection: its head, then Content-Length bytes of body."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ", 2)[1]), json.loads(body)


@pytest.fixture
async def grpc_port() -> AsyncIterator[int]:
    async def echo(request: bytes, context: object) -> bytes:
        return request[:16]

    def add(servicer: object, server: grpc.aio.Server) -> None:
        handlers = {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("gantry.v1.WorkerGateway", handlers)]
        )

    running = await create_server(
        listen="127.0.0.1:0",
        services=[ServiceBinding("gantry.v1.WorkerGateway", None, add)],
        authenticator=_OneKey(),
        max_receive_bytes=RECEIVE_LIMIT,
    )
    yield running.port
    await running.stop(grace=None)


@pytest.mark.parametrize("key", [TOKEN, "wrong"])
async def test_a_grpc_message_past_the_receive_limit_is_refused_by_the_transport(
    grpc_port: int, key: str
):
    metadata = (("authorization", f"Bearer {key}"),)
    async with insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        echo = channel.unary_unary("/gantry.v1.WorkerGateway/Echo")
        if key == TOKEN:
            assert await echo(b"y" * RECEIVE_LIMIT, metadata=metadata, timeout=HANG_GUARD_S)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await echo(b"y" * (RECEIVE_LIMIT + 1), metadata=metadata, timeout=HANG_GUARD_S)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (caught.value.details() or "")
