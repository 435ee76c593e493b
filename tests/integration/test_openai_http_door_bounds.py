"""The HTTP door's connection bounds, on a real listener: at its cap a new connection takes the
place of the longest idle one (or is shed, reset before anything is read, when every connection
is mid-request), one that does not finish its headers in time is closed, a body that does not
arrive in time is refused, and one tenant's calls in flight do not count against another's."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gantry.common.auth import Principal, Role
from gantry.common.errors import GantryError
from gantry.common.tls import ServerTls, create_local_ca, issue
from gantry.controlplane.serving.openai_http import (
    DoorBounds,
    HttpApi,
    HttpApiSettings,
    start_http_api,
)
from gantry.controlplane.serving.openai_http.connections import connection_cap
from tests.integration.polling import wait_until

HANG_GUARD_S = 30.0
REQUEST = (
    b"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\ncontent-type: application/json\r\n"
    b"content-length: 2\r\n\r\n{}"
)


class _Keys:
    """Key "a" is tenant-a's, "b" tenant-b's; any other is refused."""

    async def authenticate(self, role: Role, token: str) -> Principal:
        if token not in ("a", "b"):
            raise GantryError("UNAUTHENTICATED", "unknown key")
        return Principal(role=role, subject=f"tenant-{token}")


async def _door(max_in_flight: int = 4, *, tls: ServerTls | None = None, **bounds: Any) -> HttpApi:
    return await start_http_api(
        HttpApiSettings(
            listen="127.0.0.1:0",
            max_body_bytes=1024,
            max_in_flight=max_in_flight,
            tls=tls,
            bounds=DoorBounds(**bounds),
        ),
        inference=Any,  # type: ignore[arg-type]  # never reached: every call here is refused
        authenticator=_Keys(),
        database=Any,  # type: ignore[arg-type]
    )


def _post_head(key: str, content_length: int) -> bytes:
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\nconnection: close\r\n"
        f"authorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {content_length}\r\n\r\n"
    ).encode()


@pytest.fixture
async def held() -> AsyncIterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
    return sock


async def _read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (b'' for a close with nothing said)."""

    def read() -> bytes:
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)

    return await asyncio.to_thread(read)


async def _answer(port: int) -> bytes:
    with _connect(port) as client:
        client.sendall(REQUEST)
        client.shutdown(socket.SHUT_WR)
        return await _read_to_end(client)


async def test_at_its_cap_a_new_connection_takes_the_place_of_the_longest_idle_one(
    held: list[socket.socket],
) -> None:
    api = await _door(max_connections=5, header_timeout_s=HANG_GUARD_S * 4)
    try:
        oldest = _connect(api.port)
        await wait_until(
            lambda: api.open_connections() == 1, HANG_GUARD_S, "the first connection held"
        )
        held.append(oldest)
        held.extend(_connect(api.port) for _ in range(4))
        await wait_until(lambda: api.open_connections() == 5, HANG_GUARD_S, "five connections held")

        answer = await _answer(api.port)  # a sixth, with a whole request
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert await _read_to_end(oldest) == b""  # closed to make room, nothing said
        assert (api.counters.evicted, api.counters.shed) == (1, 0)
    finally:
        await api.stop()


async def test_at_its_cap_with_every_connection_mid_request_a_new_one_is_shed(
    held: list[socket.socket],
) -> None:
    api = await _door(max_connections=3, max_in_flight=10, body_timeout_s=HANG_GUARD_S * 4)
    try:
        for _ in range(3):  # each mid-request: headers in, body never finished
            busy = _connect(api.port)
            held.append(busy)
            busy.sendall(_post_head("a", 100) + b"{")
        await wait_until(
            lambda: api.in_flight.count("tenant-a") == 3, HANG_GUARD_S, "three calls mid-body"
        )
        with _connect(api.port) as shed:
            assert await _read_to_end(shed) == b""  # reset before anything was read
        assert (api.counters.shed, api.counters.evicted) == (1, 0)
        assert api.open_connections() == 3
    finally:
        await api.stop()


async def test_idle_and_trickling_connections_are_closed_at_the_header_timeout(
    held: list[socket.socket],
) -> None:
    api = await _door(header_timeout_s=0.3)
    try:
        idle = _connect(api.port)
        trickling = _connect(api.port)
        held.extend([idle, trickling])
        trickling.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: gantry\r\n")  # never ends
        assert await _read_to_end(idle) == b""
        assert await _read_to_end(trickling) == b""

        # A kept-alive connection owes its next request's headers in the same time: the first
        # is answered, the half-sent second one is cut (uvicorn's keep-alive timer alone stops
        # counting as soon as a byte arrives).
        kept = _connect(api.port)
        held.append(kept)
        kept.sendall(REQUEST)
        kept.sendall(b"POST /v1/embeddings HTTP/1.1\r\n")
        answered = await _read_to_end(kept)
        assert answered.startswith(b"HTTP/1.1 401") and answered.count(b"HTTP/1.1") == 1
        assert api.counters.header_timeouts == 3
        assert api.open_connections() == 0
    finally:
        await api.stop()


async def test_a_tls_connection_that_never_says_hello_is_closed_at_the_header_timeout(
    held: list[socket.socket], tmp_path: Path
) -> None:
    # The door's own timers start once a handshake is done; until then only the handshake's
    # bound holds the connection (asyncio's default: 60 s, past this test's guard).
    create_local_ca(tmp_path)
    server = issue(tmp_path, "door")
    tls = ServerTls(cert_chain_file=server.cert_file, private_key_file=server.key_file)
    api = await _door(header_timeout_s=0.3, tls=tls)
    try:
        silent = _connect(api.port)
        held.append(silent)
        assert await _read_to_end(silent) == b""
        # A client that does say hello is served over TLS as before (in a thread: the door
        # answers on this loop).
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))

        def call() -> bytes:
            with (
                socket.create_connection(("127.0.0.1", api.port), timeout=HANG_GUARD_S) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped,
            ):
                wrapped.sendall(REQUEST)
                return wrapped.recv(4096)

        answered = await asyncio.to_thread(call)
        assert answered.startswith(b"HTTP/1.1 401")
    finally:
        await api.stop()


async def test_a_door_full_of_idle_connections_still_answers_a_whole_request(
    held: list[socket.socket],
) -> None:
    api = await _door(header_timeout_s=HANG_GUARD_S * 4)
    try:
        held.extend(_connect(api.port) for _ in range(500))
        await wait_until(
            lambda: api.open_connections() == 500, HANG_GUARD_S, "500 idle connections held"
        )
        answer = await _answer(api.port)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert (api.counters.shed, api.counters.evicted) == (0, 0)
    finally:
        await api.stop()


async def test_a_trickled_body_is_refused_client_too_slow_at_the_body_timeout(
    held: list[socket.socket],
) -> None:
    api = await _door(body_timeout_s=0.3)
    try:
        slow = _connect(api.port)
        held.append(slow)
        slow.sendall(_post_head("a", 100) + b'{"input": ')  # the rest never comes
        answer = await _read_to_end(slow)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        assert b"CLIENT_TOO_SLOW" in answer
    finally:
        await api.stop()


async def test_one_tenants_slow_bodies_fill_its_own_bound_and_not_anothers(
    held: list[socket.socket],
) -> None:
    api = await _door(max_in_flight=2, body_timeout_s=HANG_GUARD_S * 4)
    try:
        for _ in range(2):  # tenant-a's two slots, each held by a body that never ends
            slow = _connect(api.port)
            held.append(slow)
            slow.sendall(_post_head("a", 100) + b"{")
        await wait_until(
            lambda: api.in_flight.count("tenant-a") == 2, HANG_GUARD_S, "tenant-a's two calls held"
        )

        def call(key: str) -> bytes:
            return _post_head(key, 1) + b"{"

        with _connect(api.port) as third:
            third.sendall(call("a"))
            refused = await _read_to_end(third)
        assert refused.startswith(b"HTTP/1.1 429") and b"QUEUE_FULL" in refused, refused[:300]
        with _connect(api.port) as other:
            other.sendall(call("b"))
            answered = await _read_to_end(other)
        # tenant-b's call got past the bound to its body's check (not JSON: 400), not a 429.
        assert answered.startswith(b"HTTP/1.1 400"), answered[:300]
    finally:
        await api.stop()


def test_the_cap_leaves_half_the_descriptors_to_the_rest_of_the_process() -> None:
    assert connection_cap(16_384, descriptor_limit=20_000) == 10_000
    assert connection_cap(100, descriptor_limit=20_000) == 100
    assert connection_cap(16_384, descriptor_limit=1) == 1
