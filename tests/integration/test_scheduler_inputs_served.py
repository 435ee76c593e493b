"""A call's inputs on the whole serving path (issue 26): the control plane tells the scheduler how
many inputs an Embed has, and a residency's slots are counted in inputs, so a model host taking 4
inputs at once holds one 3-text Embed and a 2-text one waits in the scheduler's queue.

The worker is a scripted stream that holds every invocation until the test answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gantry.v1 import inference_pb2 as inf
from gantry.v1 import scheduler_pb2
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker, serving_tiny


@pytest.fixture
async def serving(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        async with serving_tiny(harness, tiny_model_dir, max_concurrency=4) as worker:
            yield harness, worker


async def _snapshot(harness: Harness) -> scheduler_pb2.QueueSnapshot:
    return await harness.operator.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=harness.op_md
    )


def _embed(harness: Harness, inputs: int) -> asyncio.Future[inf.EmbedResponse]:
    request = inf.EmbedRequest(capability="tiny", inputs=[f"text {i}" for i in range(inputs)])
    return asyncio.ensure_future(
        harness.inference.Embed(request, metadata=harness.client_md, timeout=20)
    )


async def test_an_embed_takes_a_slot_per_input_and_what_does_not_fit_waits(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    three = _embed(harness, 3)
    held = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    assert len(held.embed.inputs) == 3
    two = _embed(harness, 2)

    async def two_is_queued() -> bool:
        return (await _snapshot(harness)).queued == 1

    await wait_for(two_is_queued, timeout=5, what="the 2-text Embed queued in the scheduler")
    (residency,) = (await _snapshot(harness)).residencies
    assert (residency.in_flight, residency.slots) == (3, 4)  # slots held, not calls
    assert worker.invokes.empty()
    worker.answer_embed(held)
    second = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    assert len(second.embed.inputs) == 2
    worker.answer_embed(second)
    assert [(await three).dim, (await two).dim] == [1, 1]
