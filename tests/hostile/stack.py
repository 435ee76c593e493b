"""The chaos suite's Gantry of real processes, with what an attacker's tests need on top: the
OpenAI HTTP door served, a second tenant to be the victim, a deployment whose embeds run in short
chunks (so abandoned work can stop between two), and readers of the control plane's descriptors
and memory from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx2

from gantry.common.auth import auth_metadata
from gantry.common.status import error_info_of
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2
from tests.chaos.cluster import Cluster, Service, wait_until
from tests.ports import free_port

CAPABILITY = "shared"
# The profile's batch size: an embed runs in chunks of this many inputs, and the model host
# checks between two chunks whether anyone still wants the rest.
CHUNK_INPUTS = 2
# Long enough that the held connections are still held when the test has finished checking that
# the door answers; the default (10 s) would close them under a slow machine's feet.
HTTP_HEADER_TIMEOUT_S = 120
HANG_GUARD_S = 30.0


@dataclass
class HostileStack(Cluster):
    """`Cluster` with the HTTP door on, and a second tenant ("victim") with its own key."""

    http_port: int = 0
    victim_key: str = ""

    def _service(self, role: str, arguments: list[str], *, name: str = "") -> Service:
        if role == "controlplane":
            self.http_port = free_port()
            arguments = [
                *arguments,
                "--http-listen", f"127.0.0.1:{self.http_port}",
                "--http-header-timeout-s", str(HTTP_HEADER_TIMEOUT_S),
            ]  # fmt: skip
        return super()._service(role, arguments, name=name)

    async def start(self) -> None:
        await super().start()
        key = await self.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="victim", name="victim"),
            metadata=self.op_md,
            timeout=10,
        )
        self.victim_key = key.api_key

    @property
    def control_plane_pid(self) -> int:
        assert self.control_plane is not None
        return self.control_plane.pid

    async def deploy_chunked(self, source: Path, capability: str) -> str:
        """The tiny embedder through every gate, its embeds run CHUNK_INPUTS inputs at a time."""
        return await self.register_and_deploy(source, capability, max_batch_size=CHUNK_INPUTS)

    async def victim_embed(self, *, timeout_s: float = HANG_GUARD_S) -> None:
        """The other tenant's small Embed over gRPC, answered with its vector."""
        answer = await self.inference.Embed(
            inference_pb2.EmbedRequest(capability=CAPABILITY, inputs=["still served?"]),
            metadata=auth_metadata(self.victim_key),
            timeout=timeout_s,
        )
        assert len(answer.vectors) == 1 and answer.dim > 0

    async def victim_http_embed(self) -> None:
        """The other tenant's small embedding over the HTTP door, on a new connection."""
        async with httpx2.AsyncClient(
            base_url=f"http://127.0.0.1:{self.http_port}/v1", timeout=HANG_GUARD_S
        ) as http:
            answer = await http.post(
                "/embeddings",
                json={"model": CAPABILITY, "input": ["still served?"]},
                headers={"authorization": f"Bearer {self.victim_key}"},
            )
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["data"]) == 1

    async def both_doors_serve_the_victim(self) -> None:
        await self.victim_embed()
        await self.victim_http_embed()

    def worker_log_lines(self, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        assert self.worker is not None
        text = self.worker.log_path.read_text(encoding="utf-8", errors="replace")
        return [m for line in text.splitlines() if (m := pattern.search(line)) is not None]


# -- the control plane's process, read from /proc -------------------------------------------


def open_descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def resident_bytes(pid: int) -> int:
    """VmRSS of `pid`, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


async def settles_near(
    read: Callable[[], int],
    baseline: int,
    margin: int,
    *,
    what: str,
    timeout_s: float = HANG_GUARD_S,
) -> None:
    """Poll `read()` until it is at most `baseline + margin`."""
    seen: list[int] = []

    def near() -> bool:
        seen[:] = [read()]
        return seen[0] <= baseline + margin

    await wait_until(
        near,
        timeout_s=timeout_s,
        what=f"{what} back within {margin} of its baseline {baseline}",
        interval_s=0.1,
        last=lambda: seen,
    )


# -- raw wire helpers -----------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    reason: str  # the ErrorInfo reason; "" when the status carries none
    metadata: dict[str, str]
    details: str


async def refused(call: Any) -> Refusal:
    """How a gRPC call that must fail failed."""
    try:
        await call
    except grpc.aio.AioRpcError as error:
        info = error_info_of(error)
        return Refusal(
            code=error.code(),
            reason=info.reason if info is not None else "",
            metadata=dict(info.metadata) if info is not None else {},
            details=error.details() or "",
        )
    raise AssertionError("the call was answered; it should have been refused")


def http_head(key: str, length_header: str, path: str = "/v1/embeddings") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\n{length_header}\r\n\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """One HTTP/1.1 response with a Content-Length body: its status and JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response head: {data[:300]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed before the whole response body"
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def _send_then_read(port: int, chunks: Sequence[bytes]) -> tuple[int, dict[str, Any]]:
    """Send `chunks` until the server answers or stops reading, then read its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S) as sock:
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break  # refused mid-body: the answer is already waiting
        return _read_response(sock)


async def raw_http(port: int, chunks: Sequence[bytes]) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(_send_then_read, port, chunks)


# -- connections held open ------------------------------------------------------------------


def open_held(port: int, count: int, first_bytes: bytes) -> list[socket.socket]:
    """`count` connections to `port`, each having sent `first_bytes` (b"" for idle ones)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
            held.append(sock)
            if first_bytes:
                sock.sendall(first_bytes)
    except BaseException:
        close_all(held)
        raise
    return held


def close_all(held: list[socket.socket]) -> None:
    for sock in held:
        with contextlib.suppress(OSError):
            sock.close()
    held.clear()
