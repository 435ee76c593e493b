"""Abandoned embeds and reranks stop between two chunks of their forward pass in a model host.

An embed's inputs (a rerank's documents) run in chunks of at most the profile's batch size (here
2 inputs); a request its caller cancelled, or that passed its timeout, runs no chunk after the one
in progress, and the work queued behind it is served. The slow test hook makes each chunk holding
it take a while, so a request of many chunks is still running when the test gives up on it.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.model_host.serving import TEST_HOOK_SLOW_INPUT
from tests.integration.harness import forked_host
from tests.integration.polling import wait_until
from tests.integration.test_model_host import _assert_same_embeddings, _vectors

CHUNK_INPUTS = 2
CHUNKS = 20
# Every chunk holds the slow input, so each of the CHUNKS takes TEST_HOOK_SLOW_S.
LONG_EMBED = [TEST_HOOK_SLOW_INPUT, "a long embed"] * CHUNKS
T = TypeVar("T")
STOPPED = re.compile(r"stopped (cancelled|expired) request (\d+) after (\d+) of its (\d+) inputs")


def _spec(
    model_directory: Path, deployment_id: str, adapter: str = "sentence_transformers"
) -> HostLaunchSpec:
    return HostLaunchSpec(
        deployment_id=deployment_id,
        model_directory=model_directory,
        adapter=common_pb2.AdapterSettings(
            adapter=adapter, device="cpu", max_batch_size=CHUNK_INPUTS
        ),
        python_executable=sys.executable,
        env={},
        load_timeout_s=90,
        test_hooks=True,
    )


def _stopped(host: ModelHost) -> list[tuple[str, int, int]]:
    """(why, inputs run, inputs asked) of each request the host stopped mid-run."""
    found = (STOPPED.search(line) for line in host.stderr_tail())
    return [(m.group(1), int(m.group(3)), int(m.group(4))) for m in found if m is not None]


def _slow_chunks(host: ModelHost) -> int:
    return sum("test hook: slow forward pass" in line for line in host.stderr_tail())


async def _started(host: ModelHost) -> None:
    await wait_until(lambda: _slow_chunks(host) >= 1, 30, "the long request's first chunk")


async def _cancel_with_a_caller_behind(
    host: ModelHost, long: Coroutine[Any, Any, object], second: Coroutine[Any, Any, T]
) -> T:
    """Start `long`, send `second` once `long`'s first chunk runs, cancel `long`: `second`'s
    answer."""
    long_task = asyncio.create_task(long)
    await _started(host)
    second_task = asyncio.create_task(second)
    await wait_until(lambda: host.pending_count == 2, 10, "the second request to be sent")
    long_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long_task
    return await second_task


def _assert_stopped_mid_run(host: ModelHost, *whys: str) -> None:
    """The host stopped the long request, for one of `whys`, before its last chunk."""
    stopped = _stopped(host)
    assert len(stopped) == 1, host.stderr_tail()
    why, ran, asked = stopped[0]
    assert why in whys
    assert asked == len(LONG_EMBED)
    assert CHUNK_INPUTS <= ran < asked
    assert ran % CHUNK_INPUTS == 0
    # Each chunk run logged the slow hook once: the ones after the stop never ran.
    assert _slow_chunks(host) == ran // CHUNK_INPUTS < CHUNKS
    assert host.pending_count == 0


async def test_a_cancelled_embed_stops_between_chunks_and_the_next_caller_is_served(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-abandon-cancel"))
    try:
        result = await _cancel_with_a_caller_behind(
            host,
            host.embed(LONG_EMBED, trace_context={}, timeout_s=600),
            host.embed(["queued behind"], trace_context={}, timeout_s=600),
        )
        assert result.count == 1
        _assert_stopped_mid_run(host, "cancelled")
    finally:
        await host.stop()


async def test_an_embed_past_its_timeout_stops_between_chunks_and_is_answered_deadline_exceeded(
    tiny_model_dir: Path,
) -> None:
    host = await forked_host(_spec(tiny_model_dir, "dep-abandon-deadline"))
    try:
        with pytest.raises(GantryError) as timed_out:
            await host.embed(LONG_EMBED, trace_context={}, timeout_s=2)
        assert timed_out.value.reason == "DEADLINE_EXCEEDED"
        result = await host.embed(["served next"], trace_context={}, timeout_s=600)
        assert result.count == 1
        # The caller that gave up also sent a CancelRequest: either rule may stop it first.
        _assert_stopped_mid_run(host, "expired", "cancelled")
    finally:
        await host.stop()


async def test_live_requests_batched_across_chunks_get_their_own_vectors(
    tiny_model_dir: Path,
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(tiny_model_dir), device="cpu", local_files_only=True)
    host = await forked_host(_spec(tiny_model_dir, "dep-abandon-batch"))
    try:
        # The slow request holds the host while the three others queue up into one batch of
        # 3 x 3 inputs, run as chunks of 2 that straddle the requests.
        slow = asyncio.create_task(
            host.embed([TEST_HOOK_SLOW_INPUT], trace_context={}, timeout_s=600)
        )
        await _started(host)
        texts = [[f"request {r} input {i}" for i in range(3)] for r in range(3)]
        calls = [host.embed(t, trace_context={}, timeout_s=600) for t in texts]
        results = await asyncio.gather(*calls)
        await slow
        for request_texts, result in zip(texts, results, strict=True):
            _assert_same_embeddings(
                _vectors(result), reference.encode(request_texts, convert_to_numpy=True)
            )
        assert _stopped(host) == []
    finally:
        await host.stop()


async def test_a_cancelled_rerank_stops_between_chunks_and_the_next_caller_is_served(
    tiny_cross_encoder_dir: Path,
) -> None:
    host = await forked_host(
        _spec(tiny_cross_encoder_dir, "dep-abandon-rerank", "sentence_transformers_cross_encoder")
    )
    try:
        result = await _cancel_with_a_caller_behind(
            host,
            host.rerank("a query", LONG_EMBED, trace_context={}, timeout_s=600),
            host.rerank("a query", ["queued behind"], trace_context={}, timeout_s=600),
        )
        assert len(result.scores) == 1
        _assert_stopped_mid_run(host, "cancelled")
    finally:
        await host.stop()
