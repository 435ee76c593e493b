"""Heartbeat pacing: the interval grows with the streams a replica holds, so their heartbeats stay
under the bound, and a stream's staleness grace is the interval it was told and the base grace's
slack for a late heartbeat."""

from __future__ import annotations

import datetime as dt

import pytest

from gantry.common.clock import ManualClock
from gantry.controlplane.nodes.heartbeat_pacing import HeartbeatPacing, StaleGrace
from gantry.controlplane.nodes.liveness import Heard, Liveness
from gantry.controlplane.nodes.sessions import WorkerHub

PACING = HeartbeatPacing(base_interval_s=3.0, max_per_s=200.0)
GRACE = StaleGrace(base_interval_s=3.0, stale_after_heartbeats=3)  # 9 s at the base interval


@pytest.mark.parametrize(
    ("streams", "interval_s"),
    [(0, 3.0), (1, 3.0), (600, 3.0), (601, 6.0), (1000, 6.0), (1200, 6.0), (1201, 9.0)],
)
def test_the_interval_is_the_base_until_the_fleet_would_beat_faster_than_the_bound(
    streams: int, interval_s: float
):
    assert PACING.interval_s(streams) == interval_s


@pytest.mark.parametrize("streams", [1, 599, 600, 601, 1000, 5000, 123_457])
def test_the_heartbeats_a_replica_takes_stay_under_the_bound_at_any_fleet_size(streams: int):
    assert streams / PACING.interval_s(streams) <= PACING.max_per_s
    # and no slower than it needs: one base interval less would break the bound
    if PACING.multiple(streams) > 1:
        assert streams / (PACING.interval_s(streams) - PACING.base_interval_s) > PACING.max_per_s


def test_the_detection_bound_is_the_interval_and_the_base_graces_slack():
    assert PACING.detection_bound_s(10, stale_after_heartbeats=3) == 9.0  # 3 beats of 3 s
    # told 6 s: its interval and the 6 s the base grace leaves a late beat, not 3 beats of 6 s
    assert PACING.detection_bound_s(1000, stale_after_heartbeats=3) == 12.0
    assert PACING.detection_bound_s(4800, stale_after_heartbeats=3) == 30.0  # told 24 s


def test_a_pacing_that_bounds_nothing_is_refused():
    with pytest.raises(ValueError):
        HeartbeatPacing(base_interval_s=3.0, max_per_s=0)
    with pytest.raises(ValueError):
        HeartbeatPacing(base_interval_s=0, max_per_s=200)


def test_a_stream_told_twice_the_interval_is_stale_after_one_more_interval():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=3)
    base, paced = object(), object()
    liveness.connected("base", 1, clock.now(), holder=base)
    liveness.connected("paced", 1, clock.now(), holder=paced, multiple=2)
    connected_at = clock.now()
    clock.advance(10)  # past the base grace of 9 s, within 12 s (6 s and the 6 s of slack)
    assert liveness.stale(clock.now(), grace=GRACE) == [Heard("base", 1, connected_at)]
    clock.advance(2)
    assert liveness.stale(clock.now(), grace=GRACE) == [Heard("base", 1, connected_at)]
    clock.advance(0.001)
    assert [h.node_id for h in liveness.stale(clock.now(), grace=GRACE)] == ["base", "paced"]


def test_pacing_a_stream_widens_its_grace_at_once_and_never_narrows_it():
    clock = ManualClock()
    liveness = Liveness(flush_interval_s=3)
    stream, other = object(), object()
    liveness.connected("n1", 1, clock.now(), holder=stream)
    assert not liveness.paced("n1", holder=other, multiple=3)  # not the stream held here
    assert liveness.paced("n1", holder=stream, multiple=3)
    assert not liveness.paced("n1", holder=stream, multiple=2)  # told longer already
    assert not liveness.paced("n1", holder=stream, multiple=3)
    clock.advance(15)  # told 9 s: stale after 15 s
    assert liveness.stale(clock.now(), grace=GRACE) == []
    clock.advance(0.001)
    assert [h.node_id for h in liveness.stale(clock.now(), grace=GRACE)] == ["n1"]


def test_another_replicas_row_counts_as_held_for_the_grace_of_the_longest_interval_told():
    clock = ManualClock()
    hub = WorkerHub(grace=GRACE)
    assert hub.held_since(clock.now()) == clock.now() - dt.timedelta(seconds=9)
    hub.heartbeat_multiple = 4  # this replica told its streams 12 s: the others' rows lag as much
    assert hub.held_since(clock.now()) == clock.now() - dt.timedelta(seconds=18)


@pytest.mark.parametrize(
    ("streams", "interval_s"),
    [(300, 3.0), (301, 6.0), (600, 6.0), (601, 9.0), (900, 9.0), (1001, 12.0), (1200, 12.0)],
)
def test_the_default_bound_gives_the_steps_docs_limits_names(streams: int, interval_s: float):
    """docs/limits.md: 3 s up to 300 streams, 6 s up to 600, 9 s up to 900, 12 s up to 1,200 (a
    fleet of 1,000 and its serving worker: 12 s)."""
    assert HeartbeatPacing(base_interval_s=3.0).interval_s(streams) == interval_s
