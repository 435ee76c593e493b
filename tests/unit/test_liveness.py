"""Worker liveness in memory: heard, fenced, stale after the grace, flushed in batches."""

from __future__ import annotations

from gantry.common.clock import ManualClock
from gantry.controlplane.nodes.heartbeat_pacing import StaleGrace
from gantry.controlplane.nodes.liveness import Heard, Liveness, SeenBatch

GRACE = StaleGrace(base_interval_s=5, stale_after_heartbeats=3)  # 15 s at the base interval

STREAM = object()  # the stream a record belongs to (opaque to liveness)


def test_a_heartbeat_refreshes_the_stream_it_belongs_to():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("n1", 7, clock.now(), holder=STREAM)
    clock.advance(4)
    assert liveness.heard("n1", 7, clock.now())
    assert liveness.last_heard("n1") == Heard("n1", 7, clock.now())


def test_a_heartbeat_of_an_older_generation_refreshes_nothing():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("n1", 8, clock.now(), holder=STREAM)
    connected_at = clock.now()
    clock.advance(4)
    assert not liveness.heard("n1", 7, clock.now())
    assert not liveness.heard("unknown", 1, clock.now())
    assert liveness.last_heard("n1") == Heard("n1", 8, connected_at)
    assert not liveness.flush_due(clock.now() + (clock.now() - connected_at) * 10)


def test_an_older_generation_connecting_late_never_displaces_the_newer_one():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    newer, older = object(), object()
    liveness.connected("n1", 8, clock.now(), holder=newer)
    liveness.connected("n1", 7, clock.now(), holder=older)
    assert liveness.last_heard("n1") == Heard("n1", 8, clock.now())
    assert not liveness.disconnected("n1", holder=older)
    assert liveness.tracks("n1")


def test_the_end_of_a_replaced_stream_keeps_the_record_of_the_stream_that_replaced_it():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    first, second = object(), object()
    liveness.connected("n1", 7, clock.now(), holder=first)
    clock.advance(1)
    liveness.connected("n1", 7, clock.now(), holder=second)  # a reconnect, same generation
    assert not liveness.disconnected("n1", holder=first)
    assert liveness.last_heard("n1") == Heard("n1", 7, clock.now())
    assert liveness.disconnected("n1", holder=second)
    assert not liveness.tracks("n1")


def test_a_stream_is_stale_only_past_the_grace_and_a_heartbeat_revives_it():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("quiet", 1, clock.now(), holder=STREAM)
    liveness.connected("chatty", 1, clock.now(), holder=STREAM)
    clock.advance(10)
    liveness.heard("chatty", 1, clock.now())
    clock.advance(5)
    assert liveness.stale(clock.now(), grace=GRACE) == []  # exactly at the grace: not yet
    clock.advance(0.001)
    stale = liveness.stale(clock.now(), grace=GRACE)
    assert [heard.node_id for heard in stale] == ["quiet"]
    liveness.heard("quiet", 1, clock.now())
    assert liveness.stale(clock.now(), grace=GRACE) == []


def test_a_forgotten_stream_is_neither_stale_nor_refreshed():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("n1", 3, clock.now(), holder=STREAM)
    assert liveness.disconnected("n1", holder=STREAM)
    clock.advance(60)
    assert liveness.stale(clock.now(), grace=GRACE) == []
    assert not liveness.heard("n1", 3, clock.now())
    assert not liveness.tracks("n1")


def test_a_flush_holds_every_node_heard_since_the_last_one_and_a_time_none_precedes():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    for node_id in ("a", "b", "c"):
        liveness.connected(node_id, 1, clock.now(), holder=STREAM)
    assert not liveness.flush_due(clock.now())  # a Hello writes last_seen_at itself
    clock.advance(1)
    liveness.heard("b", 1, clock.now())
    b_heard_at = clock.now()
    clock.advance(1)
    liveness.heard("a", 1, clock.now())
    assert liveness.flush_due(clock.now())  # the first flush does not wait
    # One time for all: the earliest heard, so the row never claims a node fresher than it is.
    assert liveness.take_flush(clock.now()) == SeenBatch(node_ids=("a", "b"), seen_at=b_heard_at)
    assert not liveness.flush_due(clock.now())


def test_flushes_come_at_most_once_per_interval():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("a", 1, clock.now(), holder=STREAM)
    liveness.heard("a", 1, clock.now())
    liveness.take_flush(clock.now())
    clock.advance(1)
    liveness.heard("a", 1, clock.now())
    heard_at = clock.now()
    clock.advance(3.9)
    assert not liveness.flush_due(clock.now())
    clock.advance(0.1)
    assert liveness.flush_due(clock.now())
    assert liveness.take_flush(clock.now()) == SeenBatch(node_ids=("a",), seen_at=heard_at)


def test_a_failed_flush_is_written_with_the_next_one_unless_the_stream_is_gone():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    for node_id in ("a", "b"):
        liveness.connected(node_id, 1, clock.now(), holder=STREAM)
        liveness.heard(node_id, 1, clock.now())
    batch = liveness.take_flush(clock.now())
    liveness.disconnected("b", holder=STREAM)
    assert batch is not None
    liveness.flush_failed(batch)
    clock.advance(5)
    again = liveness.take_flush(clock.now())
    assert again is not None and again.node_ids == ("a",)


def test_a_stream_gone_before_its_flush_is_not_written():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("a", 1, clock.now(), holder=STREAM)
    liveness.heard("a", 1, clock.now())
    liveness.disconnected("a", holder=STREAM)
    assert not liveness.flush_due(clock.now())
    assert liveness.take_flush(clock.now()) is None


def test_a_stale_declaration_forgets_only_the_silence_it_was_made_for():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=5)
    liveness.connected("n1", 1, clock.now(), holder=STREAM)
    clock.advance(20)
    [silence] = liveness.stale(clock.now(), grace=GRACE)
    liveness.heard("n1", 1, clock.now())  # it spoke while the database was being told
    assert not liveness.declared_stale(silence)
    assert liveness.tracks("n1")
    clock.advance(20)
    [silence] = liveness.stale(clock.now(), grace=GRACE)
    assert liveness.declared_stale(silence)
    assert not liveness.tracks("n1")
