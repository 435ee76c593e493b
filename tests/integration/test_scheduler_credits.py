"""Credits end to end between a real in-process scheduler and real scheduler links (each link a
control-plane replica's stream), with the control plane's credit pool: granted after a success,
used with no scheduler round trip, revoked when another replica's work has to wait, and taken
back when a stream ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gantry.common.grpc_server import RunningServer
from gantry.controlplane.platform.scheduler_link import SchedulerLink
from gantry.controlplane.serving.credits import CreditPool
from gantry.scheduler.policy.core import CoreSettings
from gantry.scheduler.server import start_scheduler
from gantry.scheduler.service import SchedulerSettings
from gantry.v1 import common_pb2, scheduler_pb2
from tests.integration.harness import wait_for
from tests.integration.test_scheduler_link import TOKEN, _snapshot, one_residency_cluster, scheduler

__all__ = ["scheduler"]  # the link tests' in-process scheduler fixture, used here too

SUCCESS = scheduler_pb2.WORK_OUTCOME_SUCCESS


def _work(work_id: str, tenant: str) -> scheduler_pb2.WorkSubmitted:
    return scheduler_pb2.WorkSubmitted(
        work_id=work_id,
        tenant_id=tenant,
        deployment_id="d1",
        priority=common_pb2.PRIORITY_INTERACTIVE,
        cost=5,
        inputs=1,
    )


async def _replica(server: RunningServer) -> tuple[SchedulerLink, CreditPool]:
    link = SchedulerLink(
        address=f"127.0.0.1:{server.port}",
        service_token=TOKEN,
        cluster_state=one_residency_cluster(2),
    )
    pool = CreditPool(link)
    link.start()
    await link.wait_connected(10)
    return link, pool


async def _earn_credit(server: RunningServer, link: SchedulerLink, pool: CreditPool) -> None:
    """A success through the queue earns the link a credit for (d1, tenant a)."""
    await link.dispatch(_work("w1", "a"), timeout=5)
    link.work_finished("w1", SUCCESS)

    async def held() -> bool:
        return (await _snapshot(server)).credits == 1 and len(pool) == 1

    await wait_for(held, timeout=10, what="the link holding a credit")


Replicas = tuple[SchedulerLink, CreditPool, SchedulerLink]


@pytest.fixture
async def replicas(scheduler: RunningServer) -> AsyncIterator[Replicas]:
    """Two control-plane replicas' links to the one scheduler; the first has earned a credit."""
    first, first_pool = await _replica(scheduler)
    second, _ = await _replica(scheduler)
    try:
        await _earn_credit(scheduler, first, first_pool)
        yield first, first_pool, second
    finally:
        await second.stop()
        await first.stop()


async def test_a_credit_is_used_without_asking_revoked_for_another_replica_and_reclaimed(
    scheduler: RunningServer, replicas: Replicas
) -> None:
    first, first_pool, second = replicas
    credit = first_pool.take("d1", "a", 1)
    assert credit is not None and (credit.residency_id, credit.node_id) == ("r1", "n1")
    first_pool.finish(credit, "w2", SUCCESS, reason="", cost=5)

    async def counted() -> bool:
        snapshot = await _snapshot(scheduler)
        return snapshot.credited_total == 1 and snapshot.credits == 1

    await wait_for(counted, timeout=10, what="the credited call counted, its credit held")
    tenant = next(t for t in (await _snapshot(scheduler)).tenants if t.tenant_id == "a")
    assert (tenant.served_total, tenant.served_cost) == (2, 10)

    # The credit holds one of r1's two slots: the second replica's b1 takes the other, and
    # b2 waits, which revokes the credit; the first replica returns it (idle), and b2 goes.
    await second.dispatch(_work("b1", "b"), timeout=5)
    b2 = await second.dispatch(_work("b2", "b"), timeout=5)
    assert b2.residency_id == "r1"
    assert len(first_pool) == 0 and first_pool.take("d1", "a", 1) is None
    snapshot = await _snapshot(scheduler)
    assert (snapshot.credits, snapshot.in_flight) == (0, 2)


async def test_a_replica_whose_stream_ends_leaves_no_credit_behind(
    scheduler: RunningServer, replicas: Replicas
) -> None:
    first, first_pool, _ = replicas
    await first.stop()

    async def reclaimed() -> bool:
        snapshot = await _snapshot(scheduler)
        return snapshot.credits == 0 and all(r.in_flight == 0 for r in snapshot.residencies)

    await wait_for(reclaimed, timeout=10, what="the ended stream's credit taken back")
    assert len(first_pool) == 0


async def _no_credit_after_successes(server: RunningServer, link: SchedulerLink) -> None:
    for i in range(3):
        await link.dispatch(_work(f"w{i}", "a"), timeout=5)
        link.work_finished(f"w{i}", SUCCESS)
    # Anything sent after the finishes is answered after they were applied.
    await link.dispatch(_work("last", "a"), timeout=5)
    snapshot = await _snapshot(server)
    assert (snapshot.credits, snapshot.credited_total) == (0, 0)


async def test_credits_off_grants_none() -> None:
    server, _ = await start_scheduler(
        listen="127.0.0.1:0",
        service_token=TOKEN,
        settings=SchedulerSettings(core=CoreSettings(credits_per_tenant=0)),
    )
    link, pool = await _replica(server)
    try:
        await _no_credit_after_successes(server, link)
        assert len(pool) == 0
    finally:
        await link.stop()
        await server.stop(grace=0.1)


async def test_a_link_nobody_takes_credits_on_is_granted_none(scheduler: RunningServer) -> None:
    # As an older control plane's: its snapshot does not say it takes credits.
    link = SchedulerLink(
        address=f"127.0.0.1:{scheduler.port}",
        service_token=TOKEN,
        cluster_state=one_residency_cluster(2),
    )
    link.start()
    try:
        await link.wait_connected(10)
        await _no_credit_after_successes(scheduler, link)
    finally:
        await link.stop()
