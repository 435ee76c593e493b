"""The scheduler over its real Connect stream (in-process server on port 0), driven the way the
control plane drives it: fairness under saturation, admission, deadlines and circuit breakers."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest

from gantry.common.auth import auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.grpc_server import RunningServer, insecure_channel
from gantry.scheduler.policy.core import CoreSettings
from gantry.scheduler.server import start_scheduler
from gantry.scheduler.service import SchedulerService, SchedulerSettings
from gantry.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.integration.scheduler_driver import GIB, TOKEN, Driver, cluster


@pytest.fixture
async def scheduler() -> AsyncIterator[
    tuple[RunningServer, SchedulerService, scheduler_pb2_grpc.SchedulerStub, ManualClock]
]:
    clock = ManualClock()
    settings = SchedulerSettings(
        core=CoreSettings(
            global_queue_depth=50, breaker_threshold=3, breaker_cooldown_seconds=30.0
        ),
        tick_seconds=0.5,
    )
    server, service = await start_scheduler(
        listen="127.0.0.1:0", service_token=TOKEN, settings=settings, clock=clock
    )
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield server, service, scheduler_pb2_grpc.SchedulerStub(channel), clock
    await server.stop(grace=0.1)


async def test_two_tenants_weighted_1_to_3_on_one_slow_deployment_are_served_about_1_to_3(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, _, stub, _ = scheduler
    driver = Driver(stub)
    policies = [
        common_pb2.TenantPolicy(tenant_id="light", weight=1, max_queue_depth=40),
        common_pb2.TenantPolicy(tenant_id="heavy", weight=3, max_queue_depth=40),
    ]
    driver.send(cluster_state=cluster(("r1", "n1", 1), policies=policies))
    driver.submit("first", "light")
    running = (await driver.read_kind("dispatch")).dispatch.work_id
    for i in range(24):
        driver.submit(f"light-{i}", "light")
        driver.submit(f"heavy-{i}", "heavy")
    served: Counter[str] = Counter()
    for _ in range(24):  # the one slot frees one call at a time: the deployment is saturated
        driver.finish(running)
        running = (await driver.read_kind("dispatch")).dispatch.work_id
        served[running.split("-")[0]] += 1
    assert served["heavy"] == pytest.approx(18, abs=2), served
    driver.close()


async def test_a_flood_past_the_queue_depth_is_refused_at_once_while_queued_work_completes(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, service, stub, _ = scheduler
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", 1)))
    for i in range(60):  # 1 runs, 50 wait (the global depth), 9 are refused
        driver.submit(f"w{i}", "flood")
    outputs = [await driver.read() for _ in range(10)]
    assert outputs[0].dispatch.work_id == "w0"
    refused = [o.rejected for o in outputs[1:]]
    assert [r.work_id for r in refused] == [f"w{i}" for i in range(51, 60)]
    assert {r.failure.reason for r in refused} == {"QUEUE_FULL"}
    done = ["w0"]
    for _ in range(50):
        driver.finish(done[-1])
        done.append((await driver.read_kind("dispatch")).dispatch.work_id)
    assert done == [f"w{i}" for i in range(51)]
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )
    assert (snapshot.queued, snapshot.in_flight, snapshot.rejected_total) == (0, 1, 9)
    assert service.core.queued == 0
    driver.close()


async def test_a_huge_request_does_not_delay_another_tenants_small_requests(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, _, stub, _ = scheduler
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", 1)))
    driver.submit("big-0", "big", cost=1024 * 100_000)
    running = (await driver.read_kind("dispatch")).dispatch.work_id
    driver.submit("big-1", "big", cost=1024 * 100_000)
    for i in range(10):
        driver.submit(f"small-{i}", "small", cost=200)
    order = []
    for _ in range(11):
        driver.finish(running)
        running = (await driver.read_kind("dispatch")).dispatch.work_id
        order.append(running)
    assert order[:10] == [f"small-{i}" for i in range(10)] and order[10] == "big-1"
    driver.close()


async def test_queued_work_past_its_deadline_is_answered_deadline_exceeded(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, _, stub, clock = scheduler
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", 1)))
    driver.submit("busy", "t")
    await driver.read_kind("dispatch")
    driver.submit("late", "t", timeout=2.0)
    await driver.barrier()  # "late" is queued before the time moves
    clock.advance(2.5)
    rejected = (await driver.read_kind("rejected")).rejected
    assert (rejected.work_id, rejected.failure.reason) == ("late", "DEADLINE_EXCEEDED")
    driver.close()


async def test_breakers_open_on_infra_failures_ignore_bad_requests_spill_over_and_half_open(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, _, stub, clock = scheduler
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", 1), ("r2", "n2", 1)))

    async def one_call(work_id: str, outcome_on: dict[str, int]) -> str:
        driver.submit(work_id, "t")
        dispatch = (await driver.read_kind("dispatch")).dispatch
        driver.finish(
            work_id, outcome_on.get(dispatch.residency_id, scheduler_pb2.WORK_OUTCOME_SUCCESS)
        )
        return dispatch.residency_id

    bad_request = {"r1": scheduler_pb2.WORK_OUTCOME_REQUEST_FAILURE}
    for i in range(8):  # bad requests say nothing about r1's health
        await one_call(f"bad-{i}", bad_request)
    infra = {"r1": scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE}
    failures = 0
    i = 0
    while failures < 3:
        i += 1
        failures += await one_call(f"infra-{i}", infra) == "r1"
    opened = (await driver.read_kind("breaker_changed")).breaker_changed
    while opened.deployment_id != "d1":  # the node's breaker and the pair's both open
        opened = (await driver.read_kind("breaker_changed")).breaker_changed
    assert (opened.node_id, opened.state) == ("n1", scheduler_pb2.BREAKER_STATE_OPEN)
    # Spill-over: while r1 is open every call goes to r2.
    assert {await one_call(f"spill-{j}", {}) for j in range(4)} == {"r2"}
    clock.advance(31.0)
    half_open = (await driver.read_kind("breaker_changed")).breaker_changed
    assert half_open.state == scheduler_pb2.BREAKER_STATE_HALF_OPEN
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )
    assert {b.state for b in snapshot.breakers if b.node_id == "n1"} == {
        scheduler_pb2.BREAKER_STATE_HALF_OPEN
    }
    driver.close()


async def test_a_tenant_policy_applies_without_a_restart_and_shows_in_the_snapshot(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, _, stub, _ = scheduler
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", 4)))
    driver.send(
        tenant_policies=scheduler_pb2.TenantPolicies(
            policies=[common_pb2.TenantPolicy(tenant_id="capped", max_concurrency=1)]
        )
    )
    driver.submit("one", "capped")
    assert (await driver.read()).dispatch.work_id == "one"
    driver.submit("two", "capped")
    refused = (await driver.read()).rejected
    assert (refused.work_id, refused.failure.reason) == ("two", "TENANT_QUOTA_EXCEEDED")
    snapshot = await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )
    (tenant,) = [t for t in snapshot.tenants if t.tenant_id == "capped"]
    assert (tenant.in_flight, tenant.rejected_total) == (1, 1)
    (ram,) = snapshot.ledger
    assert (ram.domain.name, ram.reserved_bytes, ram.available_bytes) == (
        "host.ram",
        GIB,
        14 * GIB,
    )
    driver.close()


async def test_a_refused_placement_names_every_nodes_reason(
    scheduler,  # type: ignore[no-untyped-def]
) -> None:
    _, _, stub, _ = scheduler
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", 1), ("r2", "n2", 1)))
    driver.send(
        place_deployment=scheduler_pb2.PlaceDeployment(
            request_id="p1",
            deployment_id="big",
            replicas=1,
            claims=[common_pb2.ResourceClaim(kind=common_pb2.RESOURCE_KIND_RAM, bytes=20 * GIB)],
            required_labels=["adapter:st"],
        )
    )
    refused = (await driver.read()).rejected
    assert refused.failure.reason == "NO_CAPACITY"
    assert [(r.node_id, r.reason) for r in refused.node_refusals] == [
        ("n1", "NO_CAPACITY"),
        ("n2", "NO_CAPACITY"),
    ]
    driver.close()
