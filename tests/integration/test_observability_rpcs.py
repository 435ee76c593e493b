"""Snapshots, inventory, targeted reclaim and the audit stream over real gRPC.

A real in-process control plane and scheduler, scripted workers (real gRPC clients of the worker
protocol) answering jobs and Embed calls, time on a ManualClock. Both stores run every test.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.serving.capability_degradation import DegradationSettings
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from gantry.v1 import worker_gateway_pb2 as wg
from tests.integration.harness import Harness, restarted_control_plane, wait_for
from tests.integration.pipeline_support import (
    Pipeline,
    make_model_dir,
    pipeline_of,
    refusal,
    two_replicas,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
GRPCURL = REPO_ROOT / ".venv" / "bin" / "grpcurl"
RESIDENT = common_pb2.RESIDENCY_STATE_RESIDENT
COLD = common_pb2.RESIDENCY_STATE_COLD
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
NEW_RPCS = (
    "GetRegistrySnapshot",
    "GetDebugSnapshot",
    "GetInventory",
    "ReclaimResidency",
    "ListAuditEvents",
    "WatchAuditEvents",
)


@pytest.fixture
async def gantry(database_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async for pipeline in pipeline_of(
        database_url, tmp_path, make_model_dir(tmp_path), clock=ManualClock()
    ):
        yield pipeline


def _without_time(snapshot: cp.RegistrySnapshot) -> cp.RegistrySnapshot:
    copy = cp.RegistrySnapshot()
    copy.CopyFrom(snapshot)
    copy.ClearField("taken_at")
    return copy


async def test_snapshots_show_what_was_set_up_and_change_nothing(gantry: Pipeline):
    deployment, _ = await two_replicas(gantry)
    snapshot = await gantry.op.GetRegistrySnapshot(
        cp.GetRegistrySnapshotRequest(), metadata=gantry.md
    )
    assert sorted(n.name for n in snapshot.nodes) == ["left", "right"]
    [listed] = [d for d in snapshot.deployments if d.deployment_id == deployment.deployment_id]
    assert listed.bound and listed.state == cp.DEPLOYMENT_STATE_READY
    assert [(b.capability, b.deployment_id) for b in snapshot.bindings] == [
        ("minilm", deployment.deployment_id)
    ]
    records = {r.residency.residency_id: r for r in snapshot.residencies}
    assert set(records) == {r.residency_id for r in deployment.residencies}
    for record in records.values():
        assert record.residency.state == RESIDENT
        assert record.approval_id == deployment.approval_id
        assert record.profile_id == deployment.profile_id
        assert record.last_load_job_id and not record.last_unload_job_id
        assert [c.kind for c in record.envelope] == [common_pb2.RESOURCE_KIND_RAM]
        assert record.slots > 0
        load = await gantry.op.GetServingJob(
            cp.GetServingJobRequest(job_id=record.last_load_job_id), metadata=gantry.md
        )
        # The job carries its result: the load evidence the worker sent.
        assert load.state == cp.SERVING_JOB_STATE_SUCCEEDED
        assert load.load.pid == record.residency.pid and load.load.dim == 4
    assert snapshot.last_event_id > 0

    debug = await gantry.op.GetDebugSnapshot(cp.GetDebugSnapshotRequest(), metadata=gantry.md)
    assert _without_time(debug.registry) == _without_time(snapshot)
    assert debug.HasField("queue") and not debug.HasField("queue_unavailable")
    assert list(debug.recovery.stale_node_ids) == []
    assert list(debug.recovery.uncertain_residency_ids) == []
    assert list(debug.recovery.pending_deployment_ids) == []
    assert list(debug.recent_failed_jobs) == []

    # Projections only: reading again finds the same registry and no new audit event.
    again = await gantry.op.GetRegistrySnapshot(cp.GetRegistrySnapshotRequest(), metadata=gantry.md)
    assert _without_time(again) == _without_time(snapshot)


async def test_debug_snapshot_says_why_the_queue_is_missing_when_the_scheduler_is_down(
    gantry: Pipeline,
):
    await gantry.harness.scheduler_server.stop(grace=0)
    debug = await gantry.op.GetDebugSnapshot(cp.GetDebugSnapshotRequest(), metadata=gantry.md)
    assert not debug.HasField("queue")
    assert debug.queue_unavailable.reason == "SCHEDULER_UNAVAILABLE"
    assert debug.registry.last_event_id > 0


async def test_inventory_of_a_node_and_of_an_unknown_one(gantry: Pipeline):
    deployment, _ = await two_replicas(gantry)
    node = await gantry.node("left")
    inventory = await gantry.op.GetInventory(
        cp.GetInventoryRequest(node_id=node.node_id), metadata=gantry.md
    )
    assert inventory.node_id == node.node_id and inventory.generation == 1
    assert list(inventory.adapters) == ["sentence_transformers"]
    assert [d.name for d in inventory.resource_domains] == ["host.ram"]
    assert inventory.unmanaged_gpu_processes_unavailable  # said, not claimed to be none
    code, reason = await refusal(
        gantry.op.GetInventory(cp.GetInventoryRequest(node_id=UNKNOWN_ID), metadata=gantry.md)
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")
    code, reason = await refusal(
        gantry.op.GetInventory(cp.GetInventoryRequest(node_id="not an id"), metadata=gantry.md)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_reclaiming_one_of_two_residencies_leaves_the_other_serving(gantry: Pipeline):
    deployment, workers = await two_replicas(gantry)
    left = await gantry.node("left")
    [reclaimed] = [r for r in deployment.residencies if r.node_id == left.node_id]
    [kept] = [r for r in deployment.residencies if r.node_id != left.node_id]

    response = await gantry.op.ReclaimResidency(
        cp.ReclaimResidencyRequest(residency_id=reclaimed.residency_id),
        metadata=gantry.md,
        timeout=20,
    )
    assert response.residency.residency_id == reclaimed.residency_id
    assert response.residency.state == COLD
    assert response.reclaim_verified and response.evidence.process_exited
    assert response.evidence.pid == reclaimed.pid
    assert response.unload_job.job_type == cp.SERVING_JOB_TYPE_UNLOAD
    assert response.unload_job.residency_id == reclaimed.residency_id
    assert response.unload_job.unload.process_exited  # the job carries its result too

    # Only that residency was touched: the worker on the other node got no UNLOAD at all.
    assert [a.WhichOneof("spec") for a in workers["right"].assignments].count("unload") == 0
    after = await gantry.harness.deployment(deployment.deployment_id)
    states = {r.residency_id: r.state for r in after.residencies}
    assert states == {reclaimed.residency_id: COLD, kept.residency_id: RESIDENT}
    assert after.state in (cp.DEPLOYMENT_STATE_READY, cp.DEPLOYMENT_STATE_DEGRADED)

    served_before = len(workers["left"].answered_invokes)
    for _ in range(5):
        answer = await gantry.harness.inference.Embed(
            inf.EmbedRequest(capability="minilm", inputs=["x"]),
            metadata=gantry.harness.client_md,
            timeout=10,
        )
        assert answer.deployment_id == deployment.deployment_id
    assert len(workers["left"].answered_invokes) == served_before  # the reclaimed node: none
    assert len(workers["right"].answered_invokes) >= 5

    listed = await gantry.op.ListAuditEvents(
        cp.ListAuditEventsRequest(
            filter=cp.AuditEventFilter(action="residency.reclaim", subject_kind="residency")
        ),
        metadata=gantry.md,
    )
    [event] = listed.events
    assert event.subject_id == reclaimed.residency_id
    assert event.detail["from_state"] == "RESIDENT"
    assert event.detail["unload_job_id"] == response.unload_job.job_id

    code, reason = await refusal(
        gantry.op.ReclaimResidency(
            cp.ReclaimResidencyRequest(residency_id=reclaimed.residency_id), metadata=gantry.md
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_STATE_TRANSITION")
    code, reason = await refusal(
        gantry.op.ReclaimResidency(
            cp.ReclaimResidencyRequest(residency_id=UNKNOWN_ID), metadata=gantry.md
        )
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND")


async def test_a_reclaim_the_worker_cannot_verify_answers_uncertain_with_the_reason(
    gantry: Pipeline,
):
    deployment, workers = await two_replicas(gantry)
    left = await gantry.node("left")
    [residency] = [r for r in deployment.residencies if r.node_id == left.node_id]
    worker = workers["left"]
    answer = worker.answer

    def unload_without_exit(job: Any) -> Any:
        result = answer(job)
        if job.WhichOneof("spec") == "unload":
            result.unload.process_exited = False
        return result

    worker.answer = unload_without_exit
    response = await gantry.op.ReclaimResidency(
        cp.ReclaimResidencyRequest(residency_id=residency.residency_id),
        metadata=gantry.md,
        timeout=20,
    )
    assert response.residency.state == common_pb2.RESIDENCY_STATE_UNCERTAIN
    assert response.residency.last_failure.reason == "RECLAIM_UNVERIFIED"
    assert not response.reclaim_verified


async def _create_keys(harness: Harness, *names: str) -> None:
    for name in names:
        await harness.operator.CreateApiKey(
            cp.CreateApiKeyRequest(tenant_id="tenant-audit", name=name), metadata=harness.op_md
        )


async def test_list_audit_events_pages_and_filters(gantry: Pipeline):
    harness = gantry.harness
    await _create_keys(harness, *(f"key-{i}" for i in range(5)))
    await harness.register_node("audited")
    keys = cp.AuditEventFilter(action="api_key.create", subject_id="tenant-audit")
    seen: list[cp.AuditEvent] = []
    token = ""
    while True:
        page = await harness.operator.ListAuditEvents(
            cp.ListAuditEventsRequest(page_size=2, page_token=token, filter=keys),
            metadata=harness.op_md,
        )
        assert len(page.events) <= 2
        seen.extend(page.events)
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == 5
    assert [e.event_id for e in seen] == sorted({e.event_id for e in seen})
    assert {(e.action, e.subject_kind, e.subject_id) for e in seen} == {
        ("api_key.create", "tenant", "tenant-audit")
    }
    nodes = await harness.operator.ListAuditEvents(
        cp.ListAuditEventsRequest(filter=cp.AuditEventFilter(subject_kind="node")),
        metadata=harness.op_md,
    )
    assert [e.action for e in nodes.events] == ["node.register"]
    later = await harness.operator.ListAuditEvents(
        cp.ListAuditEventsRequest(filter=keys, after_event_id=seen[2].event_id),
        metadata=harness.op_md,
    )
    assert [e.event_id for e in later.events] == [e.event_id for e in seen[3:]]
    future = cp.AuditEventFilter(since=seen[-1].at)
    future.since.seconds += 3600
    none = await harness.operator.ListAuditEvents(
        cp.ListAuditEventsRequest(filter=future), metadata=harness.op_md
    )
    assert list(none.events) == []
    code, _ = await refusal(
        harness.operator.ListAuditEvents(
            cp.ListAuditEventsRequest(page_token="not-a-token!"), metadata=harness.op_md
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT


class Watch:
    """One WatchAuditEvents call, read event by event."""

    def __init__(self, harness: Harness, after: int, action: str = "api_key.create") -> None:
        self.call = harness.operator.WatchAuditEvents(
            cp.WatchAuditEventsRequest(
                after_event_id=after, filter=cp.AuditEventFilter(action=action)
            ),
            metadata=harness.op_md,
        )

    async def next(self) -> cp.AuditEvent:
        return await asyncio.wait_for(self.call.read(), timeout=10)

    async def names(self, count: int) -> list[str]:
        return [(await self.next()).detail["api_key_id"] for _ in range(count)]


async def _key_ids(harness: Harness, after: int) -> list[str]:
    listed = await harness.operator.ListAuditEvents(
        cp.ListAuditEventsRequest(
            after_event_id=after, filter=cp.AuditEventFilter(action="api_key.create")
        ),
        metadata=harness.op_md,
    )
    return [e.detail["api_key_id"] for e in listed.events]


def _restarted_control_plane(harness: Harness, database_url: str) -> Any:
    return restarted_control_plane(
        harness,
        database_url,
        same_port=False,
        clock=ManualClock(),
        reconciler=ReconcilerSettings(),
        run_reconciler=False,
    )


async def test_watch_streams_the_backlog_then_live_events_and_resumes_after_a_restart(
    gantry: Pipeline, database_url: str
):
    harness = gantry.harness
    await _create_keys(harness, "a", "b")
    backlog = await _key_ids(harness, 0)
    assert len(backlog) == 3  # the harness's own key, then a and b

    watch = Watch(harness, after=0)
    assert await watch.names(3) == backlog
    await _create_keys(harness, "c")
    live = await watch.next()
    assert [live.detail["api_key_id"]] == await _key_ids(harness, live.event_id - 1)
    cursor = live.event_id
    watch.call.cancel()

    await _create_keys(harness, "d")  # while nobody watches
    async with _restarted_control_plane(harness, database_url):
        await _create_keys(harness, "e")
        resumed = Watch(harness, after=cursor)
        expected = await _key_ids(harness, cursor)
        assert len(expected) == 2
        events = [await resumed.next() for _ in range(2)]
        assert [e.detail["api_key_id"] for e in events] == expected
        assert events[0].event_id > cursor and events[1].event_id > events[0].event_id
        # Exactly once: the next event is a new one, not an earlier one again.
        await _create_keys(harness, "f")
        following = await resumed.next()
        assert following.event_id > events[1].event_id
        assert [following.detail["api_key_id"]] == await _key_ids(harness, events[1].event_id)
        resumed.call.cancel()


async def test_watchers_are_bounded_with_a_typed_refusal(gantry: Pipeline):
    harness = gantry.harness
    feed = harness.control_plane.audit_feed
    feed.max_watchers = 1
    first = Watch(harness, after=0)
    await first.next()  # the harness's API key: the first watch holds its slot
    second = Watch(harness, after=0)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await second.next()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    first.call.cancel()
    await wait_for(lambda: feed.watchers == 0, what="the first watcher's slot freed")
    third = Watch(harness, after=0)
    assert (await third.next()).action == "api_key.create"
    third.call.cancel()


@pytest.mark.skipif(not GRPCURL.exists(), reason="grpcurl is installed by `make run`")
async def test_grpcurl_lists_the_new_rpcs_through_reflection(gantry: Pipeline):
    def grpcurl(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(GRPCURL), *arguments], capture_output=True, text=True, timeout=30, check=False
        )

    listed = await asyncio.to_thread(
        grpcurl, "-plaintext", gantry.harness.address, "list", "gantry.v1.ControlPlane"
    )
    assert listed.returncode == 0, listed.stderr
    methods = set(listed.stdout.split())
    for rpc in NEW_RPCS:
        assert f"gantry.v1.ControlPlane.{rpc}" in methods


async def _capability(gantry: Pipeline, capability: str) -> cp.CapabilityHealth | None:
    snapshot = await gantry.op.GetRegistrySnapshot(
        cp.GetRegistrySnapshotRequest(), metadata=gantry.md
    )
    return {c.capability: c for c in snapshot.capabilities}.get(capability)


async def _capability_events(gantry: Pipeline) -> list[tuple[str, str]]:
    listed = await gantry.op.ListAuditEvents(
        cp.ListAuditEventsRequest(filter=cp.AuditEventFilter(subject_kind="capability")),
        metadata=gantry.md,
    )
    return [
        (e.action, e.detail["reason"])
        for e in listed.events
        if e.action in ("capability.degraded", "capability.recovered")
    ]


async def test_a_crash_loop_degrades_its_capability_in_snapshots_and_the_audit_trail(
    gantry: Pipeline,
):
    deployment, workers = await two_replicas(gantry)
    reconciler = gantry.harness.control_plane.reconciler
    worker = workers["left"]
    resident = worker.residents[deployment.deployment_id]
    resident.state = common_pb2.RESIDENCY_STATE_LOADING
    resident.pid = 0
    resident.restart_count = 3
    resident.crash_loop = True
    resident.last_failure.CopyFrom(common_pb2.Failure(reason="RUNTIME_CRASH_LOOP"))
    worker.report_inventory()

    async def looping() -> bool:
        current = await gantry.harness.deployment(deployment.deployment_id)
        return any(r.last_failure.reason == "RUNTIME_CRASH_LOOP" for r in current.residencies)

    await wait_for(looping, what="the crash loop recorded")
    sent = {name: len(w.assignments) for name, w in workers.items()}
    await reconciler.reconcile_once()
    degraded = await _capability(gantry, "minilm")
    assert degraded is not None
    assert degraded.condition == cp.CAPABILITY_CONDITION_DEGRADED
    assert degraded.reason == "RUNTIME_CRASH_LOOP"
    assert await _capability_events(gantry) == [("capability.degraded", "RUNTIME_CRASH_LOOP")]
    # A signal only: no worker heard anything from the evaluation.
    assert {name: len(w.assignments) for name, w in workers.items()} == sent
    assert all(not w.cancelled_jobs for w in workers.values())

    resident.state = RESIDENT
    resident.pid = 9999
    resident.crash_loop = False
    resident.ClearField("last_failure")
    worker.report_inventory()
    await gantry.harness.wait_deployment(deployment.deployment_id, cp.DEPLOYMENT_STATE_READY)
    await reconciler.reconcile_once()
    assert await _capability_events(gantry) == [
        ("capability.degraded", "RUNTIME_CRASH_LOOP"),
        ("capability.recovered", ""),
    ]
    assert await _capability(gantry, "minilm") is None  # healthy with an empty window


async def test_failing_invocations_degrade_their_capability_past_the_threshold(
    gantry: Pipeline,
):
    deployment, workers = await two_replicas(gantry)
    reconciler = gantry.harness.control_plane.reconciler
    reconciler.degradation.settings = DegradationSettings(min_outcomes=4, min_success_rate=0.9)
    for worker in workers.values():
        worker.answer_invokes = False

    async def fail_one() -> None:
        call = asyncio.ensure_future(
            gantry.harness.inference.Embed(
                inf.EmbedRequest(capability="minilm", inputs=["x"]),
                metadata=gantry.harness.client_md,
                timeout=10,
            )
        )
        getters = {asyncio.ensure_future(w.invokes.get()): w for w in workers.values()}
        done, pending = await asyncio.wait(getters, return_when=asyncio.FIRST_COMPLETED)
        for getter in pending:
            getter.cancel()
        [getter] = done
        invoke = getter.result()
        getters[getter].send(
            wg.WorkerMessage(
                invoke_result=wg.InvokeResult(
                    request_id=invoke.request_id,
                    failure=common_pb2.Failure(
                        reason="INVOKE_FAILED",
                        message="scripted failure",
                        failure_class=common_pb2.FAILURE_CLASS_INFRA,
                    ),
                )
            )
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await call

    for _ in range(4):
        await fail_one()
    await reconciler.reconcile_once()
    degraded = await _capability(gantry, "minilm")
    assert degraded is not None
    assert degraded.condition == cp.CAPABILITY_CONDITION_DEGRADED
    assert degraded.reason == "SUCCESS_RATE_LOW"
    assert (degraded.outcomes, degraded.success_rate) == (4, 0.0)
    assert await _capability_events(gantry) == [("capability.degraded", "SUCCESS_RATE_LOW")]
    after = await gantry.harness.deployment(deployment.deployment_id)
    assert [r.state for r in after.residencies] == [RESIDENT, RESIDENT]  # nothing was acted on
