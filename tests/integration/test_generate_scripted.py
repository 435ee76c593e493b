"""Generate and GenerateStream through the real control plane and scheduler, against a scripted
worker stream (a real gRPC client of WorkerGateway.Connect whose answers each test decides).

What the control plane does with what a worker says: the payload always names max_tokens and the
fair queue is charged the prompt's bytes plus 4 per token; streamed text reaches the client a
chunk per delta, in order, as it arrives; a client that goes away, runs out of time or stops
reading has its invocation cancelled on the worker, and the scheduler hears one WorkFinished that
never blames the residency; an answer that does not add up is INVOKE_FAILED and does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.common.inference_limits import DEPLOYMENT_MAX_NEW_TOKENS
from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import inference_pb2 as inf
from tests.integration.generation_support import (
    BACKLOG,
    STOP,
    generated,
    progress,
    queue_snapshot,
    scripted_generation,
    settled,
)
from tests.integration.harness import Harness
from tests.integration.scripted_worker import ScriptedWorker


@pytest.fixture
async def serving(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    async for pair in scripted_generation(sqlite_url, tmp_path, tiny_model_dir):
        yield pair


async def _refusal(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    assert info is not None, caught.value
    return caught.value.code(), info.reason, dict(info.metadata)


async def test_generate_sends_an_explicit_max_tokens_and_charges_prompt_bytes_plus_four_per_token(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.Generate(
        inf.GenerateRequest(capability="tiny", prompt="Hello"), metadata=harness.client_md
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    assert invoke.deployment_id == worker.deployment_id
    assert invoke.generate.prompt == "Hello" and not invoke.generate.stream
    # None named: the deployment's bound (its profile names none: the adapters'), filled in.
    assert invoke.generate.max_tokens == DEPLOYMENT_MAX_NEW_TOKENS
    worker.send(generated(invoke.request_id, " world", tokens=2))
    response = await call
    assert (response.text, response.finish_reason) == (" world", STOP)
    assert (response.prompt_tokens, response.completion_tokens) == (3, 2)
    assert response.deployment_id == worker.deployment_id and response.node_id
    snapshot = await settled(harness, "the Generate finished")
    (tenant,) = [t for t in snapshot.tenants if t.tenant_id == "tenant-a"]
    assert tenant.served_cost == len(b"Hello") + 4 * DEPLOYMENT_MAX_NEW_TOKENS


async def test_generate_stream_writes_each_delta_as_it_arrives_then_the_finish(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    request = inf.GenerateRequest(
        capability="tiny",
        messages=[common_pb2.ChatMessage(role="user", content="Hi")],
        max_tokens=5,
        stop=["\n"],
    )
    call = harness.inference.GenerateStream(request, metadata=harness.client_md, timeout=30)
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    assert invoke.generate.stream and invoke.generate.max_tokens == 5
    assert list(invoke.generate.stop) == ["\n"]
    assert [m.content for m in invoke.generate.messages] == ["Hi"]
    chunks = aiter(call)
    # Each delta reaches the client before the worker has said anything more.
    worker.send(progress(invoke.request_id, "Hel", 1))
    assert (await asyncio.wait_for(anext(chunks), 10)).text == "Hel"
    worker.send(progress(invoke.request_id, "", 2))  # a token with no text yet: no chunk
    worker.send(progress(invoke.request_id, "lo", 3))
    assert (await asyncio.wait_for(anext(chunks), 10)).text == "lo"
    worker.send(progress(invoke.request_id, " there", 4))
    worker.send(generated(invoke.request_id, "Hello there", tokens=4))
    rest = [chunk async for chunk in chunks]
    assert [chunk.text for chunk in rest] == [" there", ""]
    last = rest[-1]
    assert last.finish_reason == STOP
    assert (last.prompt_tokens, last.completion_tokens) == (3, 4)
    assert last.deployment_id == worker.deployment_id and last.node_id
    await settled(harness, "the stream finished", cancelled_total=0, infra_failures_total=0)


async def test_a_client_that_cancels_mid_stream_cancels_the_invocation_once(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.GenerateStream(
        inf.GenerateRequest(capability="tiny", prompt="Tell me a story"),
        metadata=harness.client_md,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    worker.send(progress(invoke.request_id, "Once", 1))
    assert (await asyncio.wait_for(call.read(), 10)).text == "Once"
    call.cancel()
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=10)
    assert cancel.request_id == invoke.request_id
    snapshot = await settled(harness, "one CANCELLED WorkFinished", cancelled_total=1)
    assert snapshot.infra_failures_total == 0
    assert all(r.infra_failures == 0 for r in snapshot.residencies)
    # The worker's late words change nothing.
    worker.send(progress(invoke.request_id, " upon", 2))
    worker.send(generated(invoke.request_id, "Once upon", tokens=2))
    assert worker.cancels.empty()


async def test_a_stream_past_its_deadline_is_deadline_exceeded_and_cancelled_on_the_worker(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.GenerateStream(
        inf.GenerateRequest(capability="tiny", prompt="slow"),
        metadata=harness.client_md,
        timeout=1.5,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    worker.send(progress(invoke.request_id, "s", 1))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=10)
    assert cancel.request_id == invoke.request_id
    await settled(harness, "the expired stream finished", infra_failures_total=0)


async def test_a_client_that_stops_reading_is_client_too_slow_and_frees_its_work_at_once(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.GenerateStream(
        inf.GenerateRequest(capability="tiny", prompt="A long answer, please"),
        metadata=harness.client_md,
        timeout=60,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    # 48 MiB of text the client does not read: far past what HTTP/2 flow control lets through,
    # so the control plane's write waits and the deltas behind it fill the backlog.
    piece = "x" * (512 * 1024)
    for tokens in range(1, 97):
        worker.send(progress(invoke.request_id, piece, tokens))
    cancel = await asyncio.wait_for(worker.cancels.get(), timeout=30)
    assert cancel.request_id == invoke.request_id
    # The scheduler hears of it while the client still reads nothing, and not as the residency's
    # failure (nor as a cancel: the client did not go away).
    await settled(harness, "the stalled stream finished", infra_failures_total=0, cancelled_total=0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    info = error_info_of(caught.value)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info is not None and info.reason == "CLIENT_TOO_SLOW"
    assert info.metadata["limit"] == str(BACKLOG)


async def test_a_stream_whose_deltas_do_not_add_up_is_invoke_failed_against_the_residency(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.GenerateStream(
        inf.GenerateRequest(capability="tiny", prompt="Hi"), metadata=harness.client_md, timeout=30
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    worker.send(progress(invoke.request_id, "ab", 1))
    worker.send(generated(invoke.request_id, "abc", tokens=2))
    texts = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for chunk in call:
            texts.append(chunk.text)
    assert texts == ["ab"]
    info = error_info_of(caught.value)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert info is not None and info.reason == "INVOKE_FAILED"
    await settled(harness, "an INFRA WorkFinished", infra_failures_total=1)


async def test_a_generate_answered_past_its_max_tokens_is_invoke_failed(
    serving: tuple[Harness, ScriptedWorker],
):
    harness, worker = serving
    call = harness.inference.Generate(
        inf.GenerateRequest(capability="tiny", prompt="Hi", max_tokens=2),
        metadata=harness.client_md,
    )
    invoke = await asyncio.wait_for(worker.invokes.get(), timeout=10)
    worker.send(generated(invoke.request_id, "a b c", tokens=3))
    code, reason, _ = await _refusal(call)
    assert (code, reason) == (grpc.StatusCode.INTERNAL, "INVOKE_FAILED")
    await settled(harness, "an INFRA WorkFinished", infra_failures_total=1)


@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
async def test_bad_requests_are_refused_naming_the_field_before_anything_is_scheduled(
    serving: tuple[Harness, ScriptedWorker], rpc: str
):
    harness, worker = serving
    user = common_pb2.ChatMessage(role="user", content="Hi")

    async def refused(**fields: Any) -> tuple[grpc.StatusCode, str, dict[str, str]]:
        request = inf.GenerateRequest(capability="tiny", **fields)
        if rpc == "Generate":
            return await _refusal(harness.inference.Generate(request, metadata=harness.client_md))

        async def read_all() -> None:
            async for _ in harness.inference.GenerateStream(request, metadata=harness.client_md):
                pass

        return await _refusal(read_all())

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    code, reason, metadata = await refused()
    assert (code, reason, metadata["field"]) == (invalid, "INVALID_ARGUMENT", "prompt")
    code, reason, metadata = await refused(prompt="a", messages=[user])
    assert (code, metadata["field"]) == (invalid, "messages")
    code, reason, metadata = await refused(
        messages=[common_pb2.ChatMessage(role="bot", content="x")]
    )
    assert metadata["field"] == "messages[0].role"
    code, reason, metadata = await refused(prompt="a", max_tokens=5000)
    assert (code, reason) == (invalid, "INVALID_PAYLOAD")
    assert (metadata["field"], metadata["limit"], metadata["value"]) == (
        "max_tokens",
        "4096",
        "5000",
    )
    code, reason, metadata = await refused(
        prompt="a", sampling=common_pb2.SamplingSettings(temperature=float("nan"))
    )
    assert metadata["field"] == "sampling.temperature"
    assert worker.invokes.empty()
    snapshot = await queue_snapshot(harness)
    assert snapshot.dispatched_total == 0
