"""The HTTP listener's life: it answers on the port it bound (port 0 picks one), refuses a call
without a key before reading its body, fails its start in one line on a taken port, and stops."""

from __future__ import annotations

import socket
from typing import Any

import httpx2
import pytest

from gantry.common.auth import Principal, Role
from gantry.common.errors import GantryError
from gantry.controlplane.serving.openai_http import HttpApiSettings, HttpListenError, start_http_api
from gantry.controlplane.serving.openai_http.server import parse_listen


class _Keys:
    async def authenticate(self, role: Role, token: str) -> Principal:
        if token != "good":
            raise GantryError("UNAUTHENTICATED", "unknown key")
        return Principal(role=role, subject="tenant-a")


def _settings(listen: str) -> HttpApiSettings:
    return HttpApiSettings(listen=listen, max_body_bytes=1024, max_in_flight=4)


async def test_the_listener_answers_refuses_without_a_key_and_stops() -> None:
    api = await start_http_api(
        _settings("127.0.0.1:0"),
        inference=Any,  # type: ignore[arg-type]  # never reached: every call here is refused
        authenticator=_Keys(),
        database=Any,  # type: ignore[arg-type]
    )
    try:
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{api.port}/v1") as http:
            refused = await http.post("/embeddings", content=b"{")
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "UNAUTHENTICATED"
            too_large = await http.post(
                "/embeddings", content=b"x" * 2048, headers={"authorization": "Bearer good"}
            )
            assert too_large.status_code == 413
    finally:
        await api.stop()
    await api.stop()  # idempotent
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", api.port))  # the port is free again


async def test_a_taken_port_fails_the_start_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HttpListenError, match=f"cannot listen on 127.0.0.1:{port}"):
            await start_http_api(
                _settings(f"127.0.0.1:{port}"),
                inference=Any,  # type: ignore[arg-type]
                authenticator=_Keys(),
                database=Any,  # type: ignore[arg-type]
            )


@pytest.mark.parametrize("listen", ["8080", "localhost:", "host:99999", ":80"])
def test_a_listen_address_must_be_host_and_port(listen: str) -> None:
    with pytest.raises(HttpListenError):
        parse_listen(listen)


def test_ipv6_hosts_lose_their_brackets() -> None:
    assert parse_listen("[::1]:8080") == ("::1", 8080)
