"""The scheduler on the whole serving path: client -> control plane -> scheduler -> worker stream.

The worker is a scripted stream that holds every invocation until the test answers it, so the
tests see exactly which calls reach it, which wait in the scheduler's queue and which are refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gantry.common.status import error_info_of
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.scripted_worker import ScriptedWorker, serving_tiny

TENANT = "tenant-a"  # the harness's client key belongs to it


@pytest.fixture
async def serving(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> AsyncIterator[tuple[Harness, ScriptedWorker]]:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        # Four calls at once per model host, so a test can fill its slots with a few calls.
        async with serving_tiny(harness, tiny_model_dir, max_concurrency=4) as worker:
            yield harness, worker


async def _snapshot(harness: Harness) -> scheduler_pb2.QueueSnapshot:
    return await harness.operator.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=harness.op_md
    )


async def test_calls_past_the_residencys_slots_wait_in_the_queue_and_go_when_one_frees(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    calls = [
        asyncio.ensure_future(
            harness.inference.Embed(
                inf.EmbedRequest(capability="tiny", inputs=[f"call {i}"]),
                metadata=harness.client_md,
                timeout=20,
            )
        )
        for i in range(5)
    ]
    # The residency takes 4 at once (its slots): the fifth waits in the scheduler.
    held = [await asyncio.wait_for(worker.invokes.get(), timeout=5) for _ in range(4)]

    async def fifth_is_queued() -> bool:
        return (await _snapshot(harness)).queued == 1

    await wait_for(fifth_is_queued, timeout=5, what="the fifth call queued in the scheduler")
    snapshot = await _snapshot(harness)
    assert (snapshot.queued, snapshot.in_flight) == (1, 4)
    (residency,) = snapshot.residencies
    assert (residency.in_flight, residency.slots) == (4, 4)
    assert worker.invokes.empty()
    worker.answer_embed(held[0])
    fifth = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    for invoke in [*held[1:], fifth]:
        worker.answer_embed(invoke)
    answers = await asyncio.gather(*calls)
    assert all(answer.dim == 1 for answer in answers)
    (tenant,) = [t for t in (await _snapshot(harness)).tenants if t.tenant_id == TENANT]
    assert (tenant.served_total, tenant.queued, tenant.in_flight) == (5, 0, 0)


async def test_a_tenant_policy_set_by_an_operator_bounds_the_tenants_calls_at_once(
    serving: tuple[Harness, ScriptedWorker],
) -> None:
    harness, worker = serving
    await harness.operator.SetTenantPolicy(
        cp.SetTenantPolicyRequest(
            policy=common_pb2.TenantPolicy(
                tenant_id=TENANT,
                max_concurrency=1,
                allowed_priorities=[common_pb2.PRIORITY_INTERACTIVE],
            )
        ),
        metadata=harness.op_md,
    )
    first = asyncio.ensure_future(
        harness.inference.Embed(
            inf.EmbedRequest(capability="tiny", inputs=["first"]),
            metadata=harness.client_md,
            timeout=20,
        )
    )
    held = await asyncio.wait_for(worker.invokes.get(), timeout=5)
    refusals = []
    for request in (
        inf.EmbedRequest(capability="tiny", inputs=["second"]),
        inf.EmbedRequest(capability="tiny", inputs=["batch"], priority=common_pb2.PRIORITY_BATCH),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await harness.inference.Embed(request, metadata=harness.client_md, timeout=5)
        refusals.append((caught.value.code(), error_info_of(caught.value).reason))
    assert refusals == [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "TENANT_QUOTA_EXCEEDED"),
        (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
    ]
    worker.answer_embed(held)
    assert (await first).dim == 1
    (tenant,) = [t for t in (await _snapshot(harness)).tenants if t.tenant_id == TENANT]
    assert (tenant.served_total, tenant.rejected_total) == (1, 2)
