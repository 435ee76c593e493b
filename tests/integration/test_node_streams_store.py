"""`node_streams` on SQLite and PostgreSQL (nodes/store.py): which replicas hold a node's stream,
how fresh, of which generation; and the hub closing a stream the database's generation moved past.
A node is connected while ANY replica holds a fresh stream of its current generation."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from gantry.common.errors import GantryError
from gantry.controlplane.nodes import store as nodes
from gantry.controlplane.nodes.goodbyes import settle_ends
from gantry.controlplane.nodes.liveness import SeenBatch
from gantry.controlplane.nodes.sessions import WorkerHub
from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import recorded
from gantry.controlplane.platform.models import StateTransition
from gantry.controlplane.platform.state_machines import NodeState

NOW = dt.datetime(2026, 12, 5, 9, 0, tzinfo=dt.UTC)
GRACE = dt.timedelta(seconds=9)


async def _node(database: Database, name: str = "n") -> tuple[str, int]:
    async with database.transaction() as session:
        node, _ = await nodes.register_node(session, name=name, labels={}, now=NOW)
    async with database.transaction() as session:
        claimed, _ = await nodes.claim_generation(
            session, node.node_id, presented=0, hostname="h", inventory={}, now=NOW
        )
    return node.node_id, claimed.generation


async def _held_elsewhere(database: Database, node_id: str, generation: int, at: dt.datetime):
    async with database.transaction() as session:
        return await nodes.held_elsewhere(
            session,
            node_id=node_id,
            generation=generation,
            replica_id="replica-a",
            heard_since=at - GRACE,
        )


async def test_a_node_is_held_elsewhere_only_by_another_replicas_fresh_row_of_its_generation(
    database: Database,
):
    node_id, generation = await _node(database)
    async with database.transaction() as session:
        for replica in ("replica-a", "replica-b"):
            await nodes.record_stream(
                session, node_id=node_id, replica_id=replica, generation=generation, now=NOW
            )
    assert await _held_elsewhere(database, node_id, generation, NOW)
    assert not await _held_elsewhere(database, node_id, generation + 1, NOW)  # another generation
    later = NOW + dt.timedelta(seconds=30)
    assert not await _held_elsewhere(database, node_id, generation, later)  # not heard since

    # replica-b's flush refreshes its row (and `last_seen_at`), never replica-a's.
    async with database.transaction() as session:
        await nodes.record_last_seen(
            session, SeenBatch(node_ids=(node_id,), seen_at=later, replica_id="replica-b")
        )
    assert await _held_elsewhere(database, node_id, generation, later)
    async with database.transaction() as session:
        held = await nodes.held_by_others(
            session, replica_id="replica-a", heard_since=later - GRACE
        )
        node = await nodes.get_node(session, node_id)
    assert held == {node_id: {generation}}
    assert node.last_seen_at == later
    assert nodes.connected_anywhere([node], here=(), held=held) == {node_id}
    assert nodes.connected_anywhere([node], here=(), held={node_id: {generation + 1}}) == set()

    # replica-b's stream ended: nobody else holds the node; a died replica's row is swept.
    async with database.transaction() as session:
        await nodes.forget_streams(session, replica_id="replica-b", ends=[(node_id, generation)])
    assert not await _held_elsewhere(database, node_id, generation, later)
    async with database.transaction() as session:
        assert await nodes.forget_silent_streams(session, heard_before=later) == 1  # replica-a's


async def test_a_reconnect_to_the_same_replica_replaces_its_row(database: Database):
    node_id, generation = await _node(database)
    async with database.transaction() as session:
        await nodes.record_stream(
            session, node_id=node_id, replica_id="replica-b", generation=generation, now=NOW
        )
        await nodes.record_stream(
            session,
            node_id=node_id,
            replica_id="replica-b",
            generation=generation + 5,
            now=NOW,
        )
        held = await nodes.held_by_others(session, replica_id="replica-a", heard_since=NOW)
    assert held == {node_id: {generation + 5}}


async def test_the_hub_closes_only_streams_whose_generation_the_database_moved_past():
    hub = WorkerHub(replica_id="replica-a")
    current = hub.open_stream(node_id="current", generation=7)
    superseded = hub.open_stream(node_id="taken", generation=7)
    for stream in (current, superseded):
        hub.attach(stream)
    assert hub.close_superseded({"current": 7, "taken": 9, "elsewhere": 3}) == [superseded]
    assert not current.closed and superseded.closed
    assert isinstance(superseded.refusal, GantryError)
    assert superseded.refusal.reason == "STALE_GENERATION"  # what its worker reads


async def test_streams_that_end_together_are_settled_each_by_its_own_rule(database: Database):
    """One batch of goodbyes (goodbyes.settle_ends), three rules: a node another replica still
    hears stays CONNECTED; a node only this replica held goes DISCONNECTED, with its history
    row and its announcement; a stream of a generation the node moved past leaves the node as
    the newer generation has it. This replica's rows of all three are gone."""
    hub = WorkerHub(replica_id="replica-a")
    ends = {name: await _node(database, name) for name in ("shared", "alone", "superseded")}
    async with database.transaction() as session:
        for node_id, generation in ends.values():
            await nodes.record_stream(
                session, node_id=node_id, replica_id="replica-a", generation=generation, now=NOW
            )
        shared_id, shared_generation = ends["shared"]
        await nodes.record_stream(
            session,
            node_id=shared_id,
            replica_id="replica-b",
            generation=shared_generation,
            now=NOW,
        )
        superseded_id, superseded_generation = ends["superseded"]
        await nodes.claim_generation(
            session,
            superseded_id,
            presented=0,  # a new worker process: a newer generation holds the node
            hostname="h2",
            inventory={},
            now=NOW,
        )
    streams = [hub.open_stream(node_id=n, generation=g) for n, g in ends.values()]
    later = NOW + dt.timedelta(seconds=1)
    async with database.transaction() as session:
        held = await settle_ends(hub, session, streams, later)
        announced = [event.node.node_id for event in recorded(session)]
    assert held == [True, False, False]
    async with database.transaction() as session:
        states = {n: (await nodes.get_node(session, ends[n][0])).state for n in ends}
        rows = await nodes.held_by_others(session, replica_id="replica-b", heard_since=NOW)
        history = (
            await session.scalars(
                select(StateTransition.subject_id).where(
                    StateTransition.subject_kind == "node",
                    StateTransition.to_state == NodeState.DISCONNECTED,
                )
            )
        ).all()
    assert states == {
        "shared": NodeState.CONNECTED,
        "alone": NodeState.DISCONNECTED,
        "superseded": NodeState.CONNECTED,
    }
    assert rows == {}  # replica-a's three rows gone (replica-b's own is not counted here)
    assert history == [ends["alone"][0]]
    assert announced == [ends["alone"][0]]
