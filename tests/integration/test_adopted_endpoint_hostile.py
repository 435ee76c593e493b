"""Adopted endpoints against a server that misbehaves: a real HTTP server started by the test (a
thread of this process, stdlib http.server on 127.0.0.1 port 0, outside Gantry) is adopted for two
capabilities. For one it answers every call HTTP 500 with a secret-looking body: the client gets
Gantry's typed error naming the status, over gRPC and the OpenAI HTTP door, and the body goes
only to the worker's log. For the other it streams text chunks forever, whatever max_tokens
said: Gantry relays max_tokens of them, ends the stream with finish "length" and closes the
connection, which the server sees as its write failing. A third's stream ends with [DONE] and no
finish reason (as llama.cpp's server cuts one when another request arrives): the call fails
INVOKE_FAILED saying so. And AdoptEndpoint refuses a URL naming this control plane's own
listeners, storing nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gantry.common.status import error_info_of
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, wait_for

LEAKY, ENDLESS, CUT = "leaky-model", "endless-model", "cut-model"
# What a server's error may carry: its paths, another caller's prompt, a stack trace.
SECRET = "Traceback (most recent call last): /srv/secret-weights/w.gguf prompt='tenant-b wrote'"
MAX_TOKENS = 6


@dataclass
class HostileServer:
    port: int
    closed: threading.Event = field(default_factory=threading.Event)  # an endless stream's end
    chunks_sent: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(state: HostileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            models = [{"id": name, "object": "model"} for name in (LEAKY, ENDLESS, CUT)]
            self._json(200, {"object": "list", "data": models})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            if body.get("model") == LEAKY:
                self._json(500, {"error": {"message": SECRET}})
            elif body.get("stream") and body.get("model") == CUT:
                self._stream_cut()
            elif body.get("stream"):
                self._stream_forever()
            else:  # the prompt's token count, asked after a stream that carried no usage
                usage = {"prompt_tokens": 3, "completion_tokens": 1}
                self._json(
                    200, {"choices": [{"text": "x", "finish_reason": "length"}], "usage": usage}
                )

        def _stream_cut(self) -> None:
            """As llama.cpp's server ends a stream when another request arrives (its
            interrupt_requests): two chunks, then [DONE] with no finish reason."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chunk = json.dumps({"choices": [{"text": "ha", "finish_reason": None}]})
            self.wfile.write(f"data: {chunk}\n\ndata: {chunk}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True

        def _stream_forever(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chunk = json.dumps({"choices": [{"text": "ha", "finish_reason": None}]})
            try:
                while True:  # never a finish, never [DONE]: only the reader can end it
                    self.wfile.write(f"data: {chunk}\n\n".encode())
                    self.wfile.flush()
                    state.chunks_sent += 1
            except OSError:
                state.closed.set()  # the reader closed the connection
            self.close_connection = True

    return Handler


@pytest.fixture
def hostile_server() -> Iterator[HostileServer]:
    state = HostileServer(port=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="hostile-server", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
async def harness(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Harness]:
    async with running_gantry(sqlite_url, tmp_path, http_listen="127.0.0.1:0") as running:
        yield running


async def _adopt(harness: Harness, server: HostileServer, model: str, capability: str) -> None:
    adopted = await harness.operator.AdoptEndpoint(
        cp.AdoptEndpointRequest(
            node="hostile-node", url=server.url, model=model, capability=capability
        ),
        metadata=harness.op_md,
    )
    await harness.wait_deployment(adopted.deployment_id, cp.DEPLOYMENT_STATE_READY, timeout=60)


def _door(harness: Harness) -> httpx.AsyncClient:
    assert harness.control_plane.http_api is not None
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{harness.control_plane.http_api.port}",
        headers={"Authorization": f"Bearer {harness.api_key}"},
        timeout=60,
    )


async def test_a_servers_error_body_reaches_only_the_log_and_an_endless_stream_is_cut(
    harness: Harness, hostile_server: HostileServer, caplog: pytest.LogCaptureFixture
) -> None:
    await harness.start_worker(await harness.register_node("hostile-node"))
    await _adopt(harness, hostile_server, LEAKY, "leaky")
    await _adopt(harness, hostile_server, ENDLESS, "endless")

    # The 500's body: never the client's, over gRPC or HTTP; the status is named.
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await harness.inference.Generate(
            inf.GenerateRequest(capability="leaky", prompt="hi", max_tokens=4),
            metadata=harness.client_md,
            timeout=60,
        )
    info = error_info_of(failed.value)
    assert info is not None and info.reason == "INVOKE_FAILED"
    assert "HTTP 500" in (failed.value.details() or "")
    async with _door(harness) as door:
        answered = await door.post(
            "/v1/completions", json={"model": "leaky", "prompt": "hi", "max_tokens": 4}
        )
    assert answered.status_code == 500
    error = answered.json()["error"]
    assert error["code"] == "INVOKE_FAILED" and "HTTP 500" in error["message"]
    for said in (answered.text, failed.value.details() or "", str(info)):
        assert "secret" not in said and "tenant-b" not in said
    assert "/srv/secret-weights" in caplog.text  # the worker's log keeps it for its operator

    # A stream that never ends: cut at max_tokens, ended "length", the connection closed.
    async with (
        _door(harness) as door,
        door.stream(
            "POST",
            "/v1/completions",
            json={"model": "endless", "prompt": "hi", "max_tokens": MAX_TOKENS, "stream": True},
        ) as streamed,
    ):
        assert streamed.status_code == 200
        events = [
            line.removeprefix("data: ")
            async for line in streamed.aiter_lines()
            if line.startswith("data: ")
        ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(chunk["choices"][0]["text"] for chunk in chunks if chunk["choices"])
    assert text == "ha" * MAX_TOKENS
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    await wait_for(hostile_server.closed.is_set, what="the endless stream's connection closed")


async def test_a_stream_the_server_ends_without_a_finish_reason_fails_saying_so(
    harness: Harness, hostile_server: HostileServer
) -> None:
    await harness.start_worker(await harness.register_node("hostile-node"))
    await _adopt(harness, hostile_server, CUT, "cut")
    chunks: list[inf.GenerateChunk] = []
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async for chunk in harness.inference.GenerateStream(
            inf.GenerateRequest(capability="cut", prompt="hi", max_tokens=MAX_TOKENS),
            metadata=harness.client_md,
            timeout=60,
        ):
            chunks.append(chunk)
    info = error_info_of(failed.value)
    assert info is not None and info.reason == "INVOKE_FAILED", failed.value
    assert "without a finish reason" in (failed.value.details() or ""), failed.value
    assert "--interrupt_requests false" in (failed.value.details() or ""), failed.value


async def test_the_control_planes_own_listeners_are_never_adopted(
    database_url: str, tmp_path: Path
) -> None:
    async with running_gantry(database_url, tmp_path, http_listen="127.0.0.1:0") as harness:
        await harness.start_worker(await harness.register_node("here-node"))  # this machine
        await harness.register_node("silent-node")  # no hostname reported yet: taken as here
        assert harness.control_plane.http_api is not None
        ports = (harness.control_plane.port, harness.control_plane.http_api.port)
        for node in ("here-node", "silent-node"):
            for port in ports:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await harness.operator.AdoptEndpoint(
                        cp.AdoptEndpointRequest(
                            node=node,
                            url=f"http://127.0.0.1:{port}/v1",
                            model="m",
                            capability="loop",
                        ),
                        metadata=harness.op_md,
                    )
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                info = error_info_of(refused.value)
                assert info is not None and info.reason == "INVALID_ARGUMENT"
                assert info.metadata["field"] == "url" and info.metadata["port"] == str(port)
        assert not (
            await harness.operator.ListEndpoints(cp.ListEndpointsRequest(), metadata=harness.op_md)
        ).endpoints
        assert not (
            await harness.operator.ListDeployments(
                cp.ListDeploymentsRequest(), metadata=harness.op_md
            )
        ).deployments
