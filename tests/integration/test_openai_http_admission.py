"""The OpenAI HTTP API goes through the scheduler's admission and the worker's cancellation as
gantry.v1.Inference does: one code path below the protocol adapter. A scripted worker holds each
invocation until the test answers it, so the test sees which call runs, which waits, which is
refused, and which the worker is told to drop when its HTTP client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import openai
import pytest

from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, running_gantry
from tests.integration.metrics_scrape import metrics_port, scrape
from tests.integration.scripted_worker import SILENT_WORKER, ScriptedWorker, serving_tiny

TENANT = "tenant-a"  # the harness's client key belongs to it
MODEL = "tiny"


@pytest.fixture
async def serving(
    database_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(
        database_url, root, http_listen="127.0.0.1:0", reconciler=SILENT_WORKER
    ) as harness:
        async with serving_tiny(harness, tiny_model_dir, max_concurrency=1) as worker:
            yield harness, worker


def base_url(harness: Harness) -> str:
    assert harness.control_plane.http_api is not None
    return f"http://127.0.0.1:{harness.control_plane.http_api.port}/v1"


def sdk(harness: Harness) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url(harness), api_key=harness.api_key, max_retries=0)


async def test_a_flood_past_the_tenants_queue_depth_is_429_queue_full(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    port = metrics_port()
    before = await scrape(port)
    await harness.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(
            policy=common_pb2.TenantPolicy(tenant_id=TENANT, max_queue_depth=1)
        ),
        metadata=harness.op_md,
    )
    async with sdk(harness) as client:

        def embed(text: str) -> asyncio.Future[object]:
            return asyncio.ensure_future(client.embeddings.create(model=MODEL, input=text))

        running = embed("first")
        held = await asyncio.wait_for(worker.invokes.get(), timeout=10)  # the one slot is taken
        waiting = embed("second")
        # The second waits in the queue (depth 1) before the flood.
        await harness.wait_queued(TENANT, 1)
        flood = [embed(f"flood {i}") for i in range(5)]
        refusals = []
        for call in flood:
            with pytest.raises(openai.RateLimitError) as caught:
                await call
            refusals.append((caught.value.status_code, caught.value.code))
        assert refusals == [(429, "QUEUE_FULL")] * 5
        worker.answer_embed(held)
        worker.answer_embed(await asyncio.wait_for(worker.invokes.get(), timeout=10))
        for call in (running, waiting):
            answered = await call
            assert answered.data[0].embedding == [1.0]  # type: ignore[attr-defined]

    after = await scrape(port)
    door = "gantry_front_door_calls_total"
    labels = {"protocol": "openai_http", "method": "/v1/embeddings"}
    assert after.value(door, code="OK", **labels) - before.value(door, code="OK", **labels) == 2
    full = {"code": "RESOURCE_EXHAUSTED", "reason": "QUEUE_FULL", **labels}
    assert after.value(door, **full) - before.value(door, **full) == 5
    # The same calls counted as the Inference operation they became: one path below the door.
    embeds = {"operation": "Embed", "reason": "QUEUE_FULL"}
    calls = "gantry_invocations_total"
    assert after.value(calls, **embeds) - before.value(calls, **embeds) == 5


async def test_a_client_that_leaves_a_stream_cancels_the_invocation(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    async with sdk(harness) as client:
        stream = await _opened_stream(client, worker)
        invoke, chunks = stream
        assert invoke.generate.stream and invoke.generate.max_tokens == 64
        await chunks.close()  # the client goes away mid-stream
    cancelled = await asyncio.wait_for(worker.cancels.get(), timeout=10)
    assert cancelled.request_id == invoke.request_id


async def _opened_stream(
    client: openai.AsyncOpenAI, worker: ScriptedWorker
) -> tuple[wg.Invoke, openai.AsyncStream]:  # type: ignore[type-arg]
    """A chat stream whose first text chunk has arrived; the invocation is still held."""
    opening = asyncio.ensure_future(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say hello"}],
            max_tokens=64,
            stream=True,
        )
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    worker.send(
        wg.WorkerMessage(
            invoke_progress=wg.InvokeProgress(
                request_id=invoke.request_id,
                generate=wg.GenerateDelta(text="Hello", completion_tokens=1),
            )
        )
    )
    chunks = await opening
    texts = []
    async for chunk in chunks:
        texts.append(chunk.choices[0].delta.content)
        if chunk.choices[0].delta.content:
            break
    assert texts == ["", "Hello"]  # the role chunk, then the text as the worker sent it
    return invoke, chunks


async def test_a_client_that_leaves_before_its_embedding_cancels_the_invocation(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    async with httpx2.AsyncClient(base_url=base_url(harness)) as http:
        call = asyncio.ensure_future(
            http.post(
                "/embeddings",
                json={"model": MODEL, "input": "never answered"},
                headers={"authorization": f"Bearer {harness.api_key}"},
            )
        )
        invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
        call.cancel()  # the connection closes with the request unanswered
        with pytest.raises(asyncio.CancelledError):
            await call
    cancelled = await asyncio.wait_for(worker.cancels.get(), timeout=10)
    assert cancelled.request_id == invoke.request_id
