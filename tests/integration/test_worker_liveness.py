"""Worker liveness kept in memory: heartbeats write no row, `last_seen_at` is flushed in batches,
and staleness of a stream held here is decided from what was heard, never from an unflushed row.

Real control plane and scheduler on port 0, scripted workers on real streams; time is a
ManualClock and the test runs the reconciler's passes itself.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.platform.state_machines import NodeState
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.harness import Harness, gantry_on_a_manual_clock, wait_for
from tests.integration.scripted_worker import ScriptedWorker

SETTINGS = ReconcilerSettings(heartbeat_interval_s=5.0, stale_after_heartbeats=3.0)


@dataclass
class Fleet:
    harness: Harness
    clock: ManualClock
    workers: list[ScriptedWorker]

    async def connect(self, name: str) -> tuple[str, ScriptedWorker]:
        credential = await self.harness.register_node(name)
        worker = ScriptedWorker()
        await worker.start(self.harness.channel, credential)
        self.workers.append(worker)
        return (await self.node(name)).node_id, worker

    async def node(self, name: str) -> cp.Node:
        listed = await self.harness.operator.ListNodes(
            cp.ListNodesRequest(), metadata=self.harness.op_md
        )
        return {n.name: n for n in listed.nodes}[name]

    async def beat(self, worker: ScriptedWorker, node_id: str) -> None:
        """A heartbeat, waited for until the control plane heard it at the current time."""
        worker.heartbeat()
        now = self.clock.now()
        liveness = self.harness.control_plane.liveness

        def heard() -> bool:
            last = liveness.last_heard(node_id)
            return last is not None and last.heard_at >= now

        await wait_for(heard, what=f"the heartbeat of {node_id} at {now}")

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.harness.control_plane.reconciler.reconcile_once()

    async def last_seen_in_database(self, node_id: str) -> dt.datetime | None:
        async with self.harness.control_plane.database.transaction() as session:
            return (await nodes.get_node(session, node_id)).last_seen_at


@pytest.fixture
async def fleet(database_url: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with gantry_on_a_manual_clock(database_url, tmp_path, SETTINGS) as (harness, clock):
        fleet = Fleet(harness=harness, clock=clock, workers=[])
        try:
            yield fleet
        finally:
            for worker in fleet.workers:
                await worker.stop()


async def test_heartbeats_write_no_row_and_last_seen_advances_in_batches(fleet: Fleet):
    node_id, worker = await fleet.connect("beating")
    connected_at = fleet.clock.now()
    assert await fleet.last_seen_in_database(node_id) == connected_at  # the Hello wrote it
    for step in range(1, 4):
        fleet.clock.advance(1)
        await fleet.beat(worker, node_id)
        # Heard, and not written: a heartbeat without jobs costs no transaction.
        assert await fleet.last_seen_in_database(node_id) == connected_at, step
    heard_at = fleet.clock.now()
    await fleet.advance(0)  # the first flush is due at once
    assert await fleet.last_seen_in_database(node_id) == heard_at
    fleet.clock.advance(1)
    await fleet.beat(worker, node_id)
    await fleet.advance(0)  # within the flush interval: nothing written yet
    assert await fleet.last_seen_in_database(node_id) == heard_at
    await fleet.advance(SETTINGS.heartbeat_interval_s)
    assert await fleet.last_seen_in_database(node_id) == heard_at + dt.timedelta(seconds=1)
    assert (await fleet.node("beating")).last_seen_at.ToDatetime(dt.UTC) == heard_at + (
        dt.timedelta(seconds=1)
    )


async def test_a_silent_worker_is_disconnected_within_the_grace_while_a_beating_one_stays(
    fleet: Fleet,
):
    silent_id, silent = await fleet.connect("silent")
    beating_id, beating = await fleet.connect("beating")
    step = SETTINGS.heartbeat_interval_s
    # Up to the grace: both CONNECTED (the silent one was last heard at its Hello).
    for _ in range(int(SETTINGS.stale_after_s // step)):
        await fleet.beat(beating, beating_id)
        await fleet.advance(step)
    assert (await fleet.node("silent")).state == common_pb2.NODE_STATE_CONNECTED
    await fleet.beat(beating, beating_id)
    await fleet.advance(0.001)  # just past the grace
    silent_node = await fleet.node("silent")
    assert silent_node.state == common_pb2.NODE_STATE_DISCONNECTED
    # The row keeps the last time it was heard, so the absence grace counts from there.
    assert silent_node.last_seen_at.ToDatetime(dt.UTC) == fleet.clock.now() - dt.timedelta(
        seconds=SETTINGS.stale_after_s + 0.001
    )
    assert (await fleet.node("beating")).state == common_pb2.NODE_STATE_CONNECTED
    await asyncio.wait_for(silent.ended.wait(), 5)  # its stream was closed, not left hanging
    assert not fleet.harness.control_plane.liveness.tracks(silent_id)
    assert fleet.harness.control_plane.liveness.tracks(beating_id)


async def test_an_unflushed_last_seen_never_makes_a_live_stream_stale(fleet: Fleet):
    node_id, worker = await fleet.connect("live")
    long_ago = fleet.clock.now() - dt.timedelta(hours=1)
    async with fleet.harness.control_plane.database.transaction() as session:
        (await nodes.get_node(session, node_id)).last_seen_at = long_ago  # as if never flushed
    await fleet.beat(worker, node_id)
    fleet.clock.advance(1)
    await fleet.harness.control_plane.reconciler.reconcile_once()
    assert (await fleet.node("live")).state == common_pb2.NODE_STATE_CONNECTED
    assert not worker.ended.is_set()


async def test_a_connected_row_without_a_stream_here_is_judged_by_its_last_seen(fleet: Fleet):
    """After a restart (or on another replica's node) no stream is known: the row decides."""
    name = "elsewhere"
    await fleet.harness.register_node(name)
    node_id = (await fleet.node(name)).node_id
    async with fleet.harness.control_plane.database.transaction() as session:
        row = await nodes.get_node(session, node_id)
        await nodes.set_node_state(
            session, row, NodeState.CONNECTED, generation=1, last_seen_at=fleet.clock.now()
        )
    await fleet.advance(SETTINGS.stale_after_s)
    assert (await fleet.node(name)).state == common_pb2.NODE_STATE_CONNECTED
    await fleet.advance(0.001)
    assert (await fleet.node(name)).state == common_pb2.NODE_STATE_DISCONNECTED


async def test_a_reconnect_within_the_generation_stays_live_after_the_old_stream_ends(
    fleet: Fleet,
):
    credential = await fleet.harness.register_node("reconnecting")
    first = ScriptedWorker(generation=1)
    await first.start(fleet.harness.channel, credential)
    second = ScriptedWorker(generation=first.generation)  # the same process, dialing again
    await second.start(fleet.harness.channel, credential)
    fleet.workers += [first, second]
    await asyncio.wait_for(first.ended.wait(), 5)  # replaced: the control plane closed it
    assert second.generation == first.generation  # kept: the same process reconnected
    node_id = (await fleet.node("reconnecting")).node_id
    step = SETTINGS.heartbeat_interval_s
    for _ in range(int(SETTINGS.stale_after_s // step) + 2):
        await fleet.beat(second, node_id)
        await fleet.advance(step)
    assert (await fleet.node("reconnecting")).state == common_pb2.NODE_STATE_CONNECTED
    assert not second.ended.is_set()
