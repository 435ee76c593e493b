"""`make bench`: what the OpenAI-compatible HTTP API adds over gRPC Embed, in the same `gantry up`.

The two are timed in turns (run.timed_pair) on one sentence at concurrency 1: gRPC Embed through
grpc's C-core client, and POST /v1/embeddings through a minimal keep-alive HTTP/1.1 client on
asyncio streams, so the difference is the server's HTTP path (parsing, JSON, the adapter) and not
a Python HTTP client's own cost. The `openai` SDK's own figure is printed beside it: what a
Python caller pays, client included. Target (issue 14): HTTP adds at most 1 ms p50.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Awaitable, Callable

from tests.bench.served import CAPABILITY, Served
from tests.bench.summary import Summary

TARGET_MS = 1.0


class KeepAliveClient:
    """One HTTP/1.1 connection, one request at a time; a response is read by its Content-Length
    (the API answers embeddings with one, never chunked)."""

    def __init__(self, address: str) -> None:
        self._host, _, port = address.rpartition(":")
        self._port = int(port)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> KeepAliveClient:
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._writer is not None:
            self._writer.close()

    def request(self, path: str, body: dict[str, object], key: str) -> bytes:
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode() + payload

    async def send(self, raw: bytes) -> bytes:
        assert self._reader is not None and self._writer is not None
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await self._reader.readexactly(length)
        if status != b"200":
            raise RuntimeError(f"HTTP {status.decode()}: {body[:200]!r}")
        return body


async def bench_openai_http(
    summary: Summary,
    h: Served,
    iterations: int,
    timed_pair: Callable[
        [Callable[[], Awaitable[object]], Callable[[], Awaitable[object]], int],
        Awaitable[tuple[list[float], list[float]]],
    ],
    report: Callable[[str, list[float]], tuple[float, float]],
) -> None:
    import openai

    from gantry.v1 import inference_pb2 as inf

    if not h.http_address:
        return
    sentence = "Gantry keeps models resident and accounted for."
    key = h.client_md[0][1].removeprefix("Bearer ")
    grpc_request = inf.EmbedRequest(capability=CAPABILITY, inputs=[sentence])

    async def grpc_embed() -> object:
        return await h.inference.Embed(grpc_request, metadata=h.client_md)

    print("OpenAI HTTP API against gRPC Embed, one sentence, concurrency 1 (timed in turns):")
    async with KeepAliveClient(h.http_address) as http:
        raw = http.request(
            "/v1/embeddings",
            {"model": CAPABILITY, "input": sentence, "encoding_format": "base64"},
            key,
        )
        grpc_ms, http_ms = await timed_pair(grpc_embed, lambda: http.send(raw), iterations)
    grpc_p50, _ = report("gRPC Embed (baseline)", grpc_ms)
    http_p50, _ = report("POST /v1/embeddings (keep-alive, base64)", http_ms)
    added = http_p50 - grpc_p50
    print(f"  the HTTP API adds p50 {added:+.2f} ms over gRPC Embed (target <= +{TARGET_MS} ms)")
    summary.add(
        "OpenAI HTTP embeddings over gRPC Embed, p50",
        f"{added:+.2f} ms ({http_p50:.2f})",
        f"gRPC Embed {grpc_p50:.2f} ms",
        f"<= +{TARGET_MS} ms",
        added <= TARGET_MS,
    )
    async with openai.AsyncOpenAI(
        base_url=f"http://{h.http_address}/v1", api_key=key, max_retries=0
    ) as client:

        async def sdk_embed() -> object:
            return await client.embeddings.create(model=CAPABILITY, input=sentence)

        _, sdk_ms = await timed_pair(grpc_embed, sdk_embed, max(20, iterations // 4))
    print(
        f"  the openai SDK (client included, for reference): p50 "
        f"{statistics.median(sdk_ms):.2f} ms (n={len(sdk_ms)})"
    )


async def main() -> int:
    """This figure alone, in a `gantry up` of its own: `python -m tests.bench.openai_http`."""
    import tempfile
    from pathlib import Path

    from tests.bench.run import ITERATIONS, report, timed_pair
    from tests.bench.served import gantry_up, settle

    summary = Summary()
    async with gantry_up(Path(tempfile.mkdtemp(prefix="gantry-bench-http-"))) as h:
        await settle(h.root_pid)
        await bench_openai_http(summary, h, ITERATIONS, timed_pair, report)
    summary.print("Summary (reproduce: python -m tests.bench.openai_http, or make bench)")
    return 0 if all(row.met is not False for row in summary.rows) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
