"""The reconciler's survey (deployments/reconcile_survey.py): a pass asks in one statement which
rules have rows to act on, and a rule with none opens no transaction; each answer turns yes when
its rows appear.

Real control plane and scheduler on port 0, a scripted worker on a real stream, both stores; time
is a ManualClock and the test runs the reconciler's passes itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import update

from gantry.common.clock import ManualClock
from gantry.common.metrics import metrics_enabled
from gantry.controlplane.deployments import reconcile_survey as survey
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.platform.models import Node
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from tests.integration.db_events import BEGIN, counted, queries
from tests.integration.harness import Harness, gantry_on_a_manual_clock, wait_for
from tests.integration.scripted_worker import ScriptedWorker

SETTINGS = ReconcilerSettings(heartbeat_interval_s=5.0, stale_after_heartbeats=3.0)
# An idle pass's transactions: one, the two surveys with the degradation signal and the state
# gauges (three before a quiet pass asked them together; before the survey each rule began its
# own: nine here, with metrics off). Its last-seen flush adds one when due (not here: the clock
# stands still).
IDLE_PASS_TRANSACTIONS = 1
# And its statements: the surveys (one), the degradation signal (one) and, where metrics are on,
# the state gauges (one). Five before the surveys and the degradation's two questions were each
# asked as one statement (issue 29: an idle pass's event-loop CPU went from 4.0-4.6 ms to
# 2.2-2.8 ms, each statement about half a millisecond to a millisecond of it).
IDLE_PASS_STATEMENTS = (2, 3)
NODE_STATE_CONNECTED = common_pb2.NODE_STATE_CONNECTED


@pytest.fixture
async def harness(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Harness, ManualClock]]:
    async with gantry_on_a_manual_clock(database_url, tmp_path, SETTINGS) as (harness, clock):
        yield harness, clock


async def _connected_worker(harness: Harness) -> tuple[str, ScriptedWorker]:
    credential = await harness.register_node("surveyed")
    worker = ScriptedWorker()
    await worker.start(harness.channel, credential)
    listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
    node_id = {n.name: n for n in listed.nodes}["surveyed"].node_id

    async def connected() -> bool:
        listed = await harness.operator.ListNodes(cp.ListNodesRequest(), metadata=harness.op_md)
        return {n.name: n for n in listed.nodes}["surveyed"].state == NODE_STATE_CONNECTED

    await wait_for(connected, what="the scripted worker CONNECTED")
    return node_id, worker


async def _first(harness: Harness, clock: ManualClock) -> survey.FirstRules:
    now = clock.now()
    async with harness.control_plane.database.transaction() as session:
        first, _ = await survey.all_rules(
            session,
            now=now,
            seen_before=now - dt.timedelta(seconds=SETTINGS.stale_after_s),
            gone_before=now - dt.timedelta(seconds=SETTINGS.absence_grace_s),
            absent_before=now - dt.timedelta(seconds=SETTINGS.absence_grace_s),
        )
        return first


async def test_an_idle_pass_asks_once_and_opens_no_transaction_per_rule(
    harness: tuple[Harness, ManualClock],
):
    gantry, clock = harness
    _, worker = await _connected_worker(gantry)
    try:
        reconciler = gantry.control_plane.reconciler
        await reconciler.reconcile_once()  # the first pass flushes what the Hello left
        assert await _first(gantry, clock) == survey.FirstRules(
            expired_leases=False, stale_rows=False, absent=False
        )
        async with gantry.control_plane.database.transaction() as session:
            assert await survey.later_rules(session) == survey.LaterRules(
                unplaced=False, adopted=False, uncertain=False, draining=False, queued_jobs=False
            )
        with (
            counted(gantry.control_plane.database, BEGIN) as begun,
            queries(gantry.control_plane.database) as sent,
        ):
            await reconciler.reconcile_once()
        assert begun[0] == IDLE_PASS_TRANSACTIONS, begun[0]
        assert len(sent) == IDLE_PASS_STATEMENTS[metrics_enabled()], sent
    finally:
        await worker.stop()


async def test_stale_and_absent_rows_are_answered_yes_and_then_acted_on(
    harness: tuple[Harness, ManualClock],
):
    gantry, clock = harness
    node_id, worker = await _connected_worker(gantry)
    reconciler = gantry.control_plane.reconciler

    async def node_state() -> int:
        listed = await gantry.operator.ListNodes(cp.ListNodesRequest(), metadata=gantry.op_md)
        return {n.node_id: n for n in listed.nodes}[node_id].state

    try:
        await reconciler.reconcile_once()
        async with gantry.control_plane.database.transaction() as session:
            await session.execute(
                update(Node)
                .where(Node.node_id == node_id)
                .values(last_seen_at=clock.now() - dt.timedelta(seconds=SETTINGS.stale_after_s + 1))
            )
        assert (await _first(gantry, clock)).stale_rows
        # Silent past the grace: the pass disconnects it, and nothing is stale any more...
        clock.advance(SETTINGS.stale_after_s + 1)
        await reconciler.reconcile_once()
        assert await node_state() == common_pb2.NODE_STATE_DISCONNECTED
        assert await _first(gantry, clock) == survey.FirstRules(
            expired_leases=False, stale_rows=False, absent=False
        )
        # ...until it has been away past the absence grace.
        clock.advance(SETTINGS.absence_grace_s)
        assert await _first(gantry, clock) == survey.FirstRules(
            expired_leases=False, stale_rows=False, absent=True
        )
    finally:
        await worker.stop()
