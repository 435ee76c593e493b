"""Domain events (platform/events.py): recorded in a transaction, published after its commit.

The bus is pure; the unit of work is `Database.transaction` over an in-memory SQLite database
(no socket, no process): a commit publishes what was recorded, in order, a rollback nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator

import pytest

from gantry.controlplane.platform.database import Database
from gantry.controlplane.platform.events import (
    AuditWritten,
    BindingMoved,
    CapabilityBound,
    CapacityFreed,
    DeploymentChanged,
    Event,
    EventBus,
    NodeChanged,
    ReconcileWanted,
    ResidenciesChanged,
    implied,
    record,
    recorded,
    with_implied,
)
from gantry.controlplane.platform.models import Deployment, Node, Residency

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _residency(state: str) -> Residency:
    return Residency(
        residency_id=f"r-{state.lower()}", deployment_id="d1", node_id="n1", state=state
    )


def _node(*, deleted: bool = False) -> Node:
    return Node(node_id="n1", state="CONNECTED", deleted_at=NOW if deleted else None)


class Heard:
    """Every event a bus published, and each bracket call, in the order they came."""

    def __init__(self, bus: EventBus) -> None:
        self.calls: list[object] = []
        for kind in (
            ResidenciesChanged,
            DeploymentChanged,
            NodeChanged,
            CapabilityBound,
            BindingMoved,
            AuditWritten,
            CapacityFreed,
            ReconcileWanted,
        ):
            bus.subscribe(kind, self.calls.append)
        bus.bracket(
            BindingMoved,
            before=lambda: self.calls.append("changing"),
            after=lambda: self.calls.append("changed"),
        )


# ---- the bus: pure ----------------------------------------------------------------------------


def test_events_reach_their_subscribers_in_the_order_recorded() -> None:
    bus = EventBus()
    heard = Heard(bus)
    events: list[Event] = [ReconcileWanted(), CapabilityBound("embed"), ReconcileWanted()]
    bus.publish(events)
    assert heard.calls == events


def test_subscribers_of_one_type_hear_it_in_the_order_they_subscribed() -> None:
    bus = EventBus()
    order: list[str] = []
    bus.subscribe(ReconcileWanted, lambda _: order.append("first"))
    bus.subscribe(ReconcileWanted, lambda _: order.append("second"))
    bus.subscribe(CapacityFreed, lambda _: order.append("other type"))
    bus.publish([ReconcileWanted()])
    assert order == ["first", "second"]


def test_a_failing_subscriber_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    order: list[str] = []

    def broken(_: ReconcileWanted) -> None:
        raise RuntimeError("broken subscriber")

    bus.subscribe(ReconcileWanted, broken)
    bus.subscribe(ReconcileWanted, lambda _: order.append("after the broken one"))
    bus.subscribe(CapacityFreed, lambda _: order.append("the next event"))
    with caplog.at_level(logging.ERROR, logger="gantry.controlplane.platform.events"):
        bus.publish([ReconcileWanted(), CapacityFreed()])
    assert order == ["after the broken one", "the next event"]
    assert "ReconcileWanted" in caplog.text and "broken subscriber" in caplog.text


def test_a_residency_gone_cold_frees_capacity_right_after_it_is_announced() -> None:
    cold = ResidenciesChanged((_residency("LOADING"), _residency("COLD")))
    loading = ResidenciesChanged((_residency("LOADING"),))
    assert implied(cold) == (CapacityFreed(),)
    assert implied(loading) == ()
    assert with_implied([cold, ReconcileWanted()]) == [cold, CapacityFreed(), ReconcileWanted()]


def test_a_node_frees_capacity_only_when_it_connected_and_is_not_deleted() -> None:
    assert implied(NodeChanged(_node(), ("n1",))) == (CapacityFreed(),)
    assert implied(NodeChanged(_node(), ())) == ()
    assert implied(NodeChanged(_node(), ("n2",))) == ()
    assert implied(NodeChanged(_node(deleted=True), ("n1",))) == ()


def test_a_bracket_is_told_once_per_commit_before_it_and_after_it() -> None:
    bus = EventBus()
    heard = Heard(bus)
    afters = bus.before_commit([BindingMoved(), ReconcileWanted(), BindingMoved()])
    assert heard.calls == ["changing"]
    for after in afters:
        after()
    assert heard.calls == ["changing", "changed"]
    assert bus.before_commit([ReconcileWanted()]) == []


# ---- the unit of work: Database.transaction ---------------------------------------------------


@pytest.fixture
async def database() -> AsyncIterator[Database]:
    database = Database.connect("sqlite+aiosqlite://")
    try:
        yield database
    finally:
        await database.close()


async def test_a_commit_publishes_what_was_recorded_in_order_after_it(database: Database) -> None:
    heard = Heard(database.events)
    deployment = Deployment(deployment_id="d1", replicas=1)
    cold = ResidenciesChanged((_residency("COLD"),))
    async with database.transaction() as session:
        record(session, DeploymentChanged(deployment), cold)
        record(session, ReconcileWanted())
        assert heard.calls == []  # nothing is told before the commit
        assert [type(e) for e in recorded(session)] == [
            DeploymentChanged,
            ResidenciesChanged,
            ReconcileWanted,
        ]
    assert heard.calls == [
        DeploymentChanged(deployment),
        cold,
        CapacityFreed(),
        ReconcileWanted(),
    ]


async def test_a_rollback_publishes_nothing(database: Database) -> None:
    heard = Heard(database.events)
    with pytest.raises(RuntimeError, match="refused"):
        async with database.transaction() as session:
            record(session, ReconcileWanted(), BindingMoved())
            raise RuntimeError("refused")
    assert heard.calls == []
    async with database.transaction():
        pass  # a later transaction does not inherit what the rolled-back one recorded
    assert heard.calls == []


async def test_a_moving_binding_brackets_the_commit_then_is_published(database: Database) -> None:
    heard = Heard(database.events)
    async with database.transaction() as session:
        record(session, BindingMoved(), CapabilityBound("embed"))
    assert heard.calls == ["changing", "changed", BindingMoved(), CapabilityBound("embed")]


async def test_a_subscriber_that_raises_does_not_undo_or_break_the_commit(
    database: Database,
) -> None:
    def broken(_: ReconcileWanted) -> None:
        raise RuntimeError("broken subscriber")

    database.events.subscribe(ReconcileWanted, broken)
    heard = Heard(database.events)
    async with database.transaction() as session:
        record(session, ReconcileWanted())
    assert heard.calls == [ReconcileWanted()]
