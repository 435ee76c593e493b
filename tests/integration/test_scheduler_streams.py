"""One scheduler, several control planes: real Connect streams to a real in-process scheduler
(port 0), one per control-plane replica, all feeding one core. Each call's answer comes back on
the stream that sent it, a second stream's snapshot keeps the first's waiting work, a stream that
closes takes only its own work with it, and the number of streams is bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gantry.common.auth import auth_metadata
from gantry.common.clock import ManualClock
from gantry.common.grpc_server import RunningServer, insecure_channel
from gantry.common.status import error_info_of
from gantry.scheduler.policy.core import CoreSettings
from gantry.scheduler.server import start_scheduler
from gantry.scheduler.service import SchedulerService, SchedulerSettings
from gantry.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.integration.scheduler_driver import TOKEN, Driver, cluster

Scheduler = tuple[RunningServer, SchedulerService, scheduler_pb2_grpc.SchedulerStub]


@pytest.fixture
async def scheduler() -> AsyncIterator[Scheduler]:
    # A clock that never moves: no tick expires, ages or advises anything behind the tests' backs.
    settings = SchedulerSettings(core=CoreSettings(breaker_threshold=1), max_streams=2)
    server, service = await start_scheduler(
        listen="127.0.0.1:0", service_token=TOKEN, settings=settings, clock=ManualClock()
    )
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield server, service, scheduler_pb2_grpc.SchedulerStub(channel)
    await server.stop(grace=0.1)


async def connected(stub: scheduler_pb2_grpc.SchedulerStub, slots: int) -> Driver:
    """A control plane's stream, past its snapshot (one residency r1 of d1 with `slots`)."""
    driver = Driver(stub)
    driver.send(cluster_state=cluster(("r1", "n1", slots)))
    await driver.barrier()
    return driver


async def snapshot(stub: scheduler_pb2_grpc.SchedulerStub) -> scheduler_pb2.QueueSnapshot:
    return await stub.GetQueueSnapshot(
        scheduler_pb2.GetQueueSnapshotRequest(), metadata=auth_metadata(TOKEN)
    )


async def test_each_answer_comes_back_on_the_stream_that_sent_the_call(
    scheduler: Scheduler,
) -> None:
    _, _, stub = scheduler
    a = await connected(stub, slots=1)
    a.submit("a-1", "t1")
    assert (await a.read_kind("dispatch")).dispatch.work_id == "a-1"
    a.submit("a-2", "t1")  # waits for the one slot
    await a.barrier()

    b = await connected(stub, slots=1)  # its snapshot must not forget a-2
    b.submit("b-1", "t2")
    await b.barrier()  # nothing but the barrier's answer: b-1 waits too
    b.submit("a-2", "t2")  # an id queued from a: refused here, and a's answer stays a's
    duplicate = (await b.read_kind("rejected")).rejected
    assert (duplicate.work_id, duplicate.failure.reason) == ("a-2", "ALREADY_EXISTS")
    assert (await snapshot(stub)).queued == 2

    a.finish("a-1")
    assert (await a.read_kind("dispatch")).dispatch.work_id == "a-2"
    a.finish("a-2")  # a's input frees the slot; the answer goes to b, whose call it is
    assert (await b.read_kind("dispatch")).dispatch.work_id == "b-1"
    await a.barrier()  # and a got nothing of b's
    state = await snapshot(stub)
    assert state.control_plane_connected and (state.queued, state.in_flight) == (0, 1)
    a.close()
    b.close()


async def test_a_closed_stream_takes_its_own_work_and_the_others_is_served_later(
    scheduler: Scheduler,
) -> None:
    _, service, stub = scheduler
    a = await connected(stub, slots=2)
    b = await connected(stub, slots=2)
    a.submit("a-run", "t1")
    assert (await a.read_kind("dispatch")).dispatch.work_id == "a-run"
    b.submit("b-run", "t2")
    assert (await b.read_kind("dispatch")).dispatch.work_id == "b-run"
    a.submit("a-wait", "t1")
    b.submit("b-wait", "t2")
    b.submit("b-later", "t2")
    await a.barrier()
    await b.barrier()

    # a's stream ends: a-wait leaves unanswered, a-run's slot is freed and b-wait takes it.
    assert [o.WhichOneof("kind") for o in await a.closed()] == []
    assert (await b.read_kind("dispatch")).dispatch.work_id == "b-wait"
    assert service.streams == 1
    state = await snapshot(stub)
    assert (state.queued, state.in_flight) == (1, 2)
    assert [r.in_flight for r in state.residencies] == [2]
    assert list(state.breakers) == []  # no outcome was made up for a-run

    b.finish("b-run")  # b-later, still queued, goes once a slot frees
    assert (await b.read_kind("dispatch")).dispatch.work_id == "b-later"
    b.close()


async def test_breaker_moves_go_to_every_stream(scheduler: Scheduler) -> None:
    _, _, stub = scheduler
    a = await connected(stub, slots=1)
    b = await connected(stub, slots=1)
    a.submit("a-1", "t1")
    assert (await a.read_kind("dispatch")).dispatch.work_id == "a-1"
    a.finish("a-1", scheduler_pb2.WORK_OUTCOME_INFRA_FAILURE)  # threshold 1: it opens
    for driver in (a, b):
        moved = await driver.read()
        assert moved.WhichOneof("kind") == "breaker_changed", moved
        assert moved.breaker_changed.state == scheduler_pb2.BREAKER_STATE_OPEN
    a.close()
    b.close()


async def test_a_stream_past_the_bound_is_refused_queue_full(scheduler: Scheduler) -> None:
    _, service, stub = scheduler
    a = await connected(stub, slots=1)
    b = await connected(stub, slots=1)
    third = Driver(stub)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await third.read()
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    info = error_info_of(refused.value)
    assert info is not None and info.reason == "QUEUE_FULL" and info.metadata["limit"] == "2"
    await b.closed()
    assert service.streams == 1
    again = await connected(stub, slots=1)  # room again
    assert service.streams == 2
    a.close()
    again.close()
