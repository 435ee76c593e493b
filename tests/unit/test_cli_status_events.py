"""The pure parts of `gantry status`, `events`, `reclaim`: section truncation, the newest-page
search over an oldest-first trail, the follower's resume-from-cursor rule, and reclaim verdicts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import grpc
import pytest

from gantry.cli.events_commands import Backoff, event_line, follow, newest_events
from gantry.cli.reclaim_command import render_reclaim, verified, why_not_verified
from gantry.cli.status_commands import render_status
from gantry.v1 import common_pb2, scheduler_pb2
from gantry.v1 import control_plane_pb2 as cp

TAKEN = dt.datetime(2026, 12, 1, 6, 30, tzinfo=dt.UTC)


def _snapshot(*, nodes: int, failures: int) -> cp.DebugSnapshot:
    snapshot = cp.DebugSnapshot()
    snapshot.registry.taken_at.FromDatetime(TAKEN)
    snapshot.registry.last_event_id = 42
    for index in range(nodes):
        node = snapshot.registry.nodes.add(
            node_id=f"id-{index:02d}",
            name=f"node-{index:02d}",
            state=common_pb2.NODE_STATE_CONNECTED,
        )
        node.last_seen_at.FromDatetime(TAKEN - dt.timedelta(seconds=5))
    for index in range(failures):
        job = snapshot.recent_failed_jobs.add(
            job_id=f"job-{index}",
            job_type=cp.SERVING_JOB_TYPE_LOAD,
            node_id="id-00",
            deployment_id="dep-1",
            failure=common_pb2.Failure(reason="RUNTIME_CRASHED", message=f"exit {index}"),
        )
        job.updated_at.FromDatetime(TAKEN - dt.timedelta(minutes=index + 1))
    snapshot.queue.CopyFrom(scheduler_pb2.QueueSnapshot(control_plane_connected=True, queued=3))
    return snapshot


def test_long_sections_are_cut_with_a_count_of_the_rest_and_ages_follow_the_snapshot() -> None:
    text = render_status(_snapshot(nodes=11, failures=9), address="cp:1", now=TAKEN)
    lines = text.splitlines()
    assert lines[0] == "gantry at cp:1  2026-12-01 06:30:00Z  audit cursor 42"
    assert "NODES (11)" in lines and "  … 3 more" in lines  # 8 shown
    assert lines[lines.index("NODES (11)") + 2].split()[:3] == ["node-00", "CONNECTED", "5s"]
    failures = lines[lines.index("RECENT FAILURES (newest first, 9)") + 1 :]
    assert failures[-1] == "  … 4 more"
    assert failures[0].split()[:2] == ["60s", "ago"]  # newest first, as the server sent them
    assert "on node-00 for dep-1: RUNTIME_CRASHED: exit 0" in failures[0]
    assert "QUEUE  queued 3, in flight 0" in text
    assert len(lines) <= 40


def test_breakers_that_are_not_closed_and_a_degraded_capability_are_called_out() -> None:
    snapshot = _snapshot(nodes=1, failures=0)
    snapshot.queue.breakers.add(node_id="id-00", state=scheduler_pb2.BREAKER_STATE_CLOSED)
    snapshot.queue.breakers.add(
        node_id="id-00", deployment_id="dep-1", state=scheduler_pb2.BREAKER_STATE_OPEN
    )
    health = snapshot.registry.capabilities.add(
        capability="minilm",
        condition=cp.CAPABILITY_CONDITION_DEGRADED,
        success_rate=0.4,
        outcomes=10,
        reason="SUCCESS_RATE_LOW",
    )
    health.since.FromDatetime(TAKEN - dt.timedelta(seconds=30))
    snapshot.recovery.uncertain_residency_ids.extend(["r1", "r2"])
    lines = render_status(snapshot, address="cp:1", now=TAKEN).splitlines()
    breakers = lines[lines.index("BREAKERS not closed (1)") + 2]
    assert breakers.split()[:3] == ["node-00", "dep-1", "OPEN"]
    assert "  minilm: DEGRADED SUCCESS_RATE_LOW (success 40% of 10, since 30s ago)" in lines
    assert "  UNCERTAIN residencies: r1, r2" in lines


def _event(event_id: int, action: str = "a") -> cp.AuditEvent:
    event = cp.AuditEvent(event_id=event_id, action=action, subject_kind="k", subject_id="s")
    event.at.FromDatetime(TAKEN)
    return event


class Trail:
    """ListAuditEvents over a list, oldest first, in pages; counts the rows it returns."""

    def __init__(self, events: list[cp.AuditEvent], page: int = 4) -> None:
        self.events = events
        self.page = page
        self.rows_read = 0

    def list_page(self, after: int, token: str) -> cp.ListAuditEventsResponse:
        start = int(token) if token else after
        rows = [e for e in self.events if e.event_id > start][: self.page + 1]
        more = len(rows) > self.page
        rows = rows[: self.page]
        self.rows_read += len(rows)
        return cp.ListAuditEventsResponse(
            events=rows, next_page_token=str(rows[-1].event_id) if more else ""
        )


def test_the_newest_page_is_found_without_reading_a_long_trail_from_the_start() -> None:
    trail = Trail([_event(i) for i in range(1, 10_001)])
    newest = newest_events(trail.list_page, head=10_000, count=5)
    assert [e.event_id for e in newest] == [9996, 9997, 9998, 9999, 10_000]
    assert trail.rows_read <= 10


def test_a_rare_match_widens_the_window_until_the_first_event() -> None:
    # Only events 3 and 7 match the filter (the trail passes on what matched).
    trail = Trail([_event(3), _event(7)])
    assert [e.event_id for e in newest_events(trail.list_page, head=500, count=5)] == [3, 7]
    assert newest_events(trail.list_page, head=500, count=0) == []


class Outage(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """What a stream sees when the control plane goes away."""

    def __init__(self, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "Socket closed"

    def initial_metadata(self):  # type: ignore[no-untyped-def]
        return ()

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:  # type: ignore[no-untyped-def]
        return False


def test_a_dropped_stream_resumes_after_the_last_event_printed_and_says_so_once() -> None:
    cursors: list[int] = []
    printed: list[int] = []
    warnings: list[str] = []
    readiness = iter([False, False, True, True])

    def watch(after: int) -> Iterator[cp.AuditEvent]:
        cursors.append(after)
        if len(cursors) == 1:
            yield _event(after + 1)
            yield _event(after + 2)
            raise Outage()
        if len(cursors) == 2:
            raise Outage()  # still down on the first retry
        yield _event(after + 1)
        raise KeyboardInterrupt  # Ctrl-C ends the follow

    with pytest.raises(KeyboardInterrupt):
        follow(
            watch,
            cursor=10,
            emit=lambda event: printed.append(event.event_id),
            warn=warnings.append,
            wait_ready=lambda timeout_s: next(readiness),
            backoff=Backoff(first_s=0.01, max_s=0.02),
            describe=lambda error: error.code().name,  # type: ignore[attr-defined]
        )
    assert cursors == [10, 12, 12]  # each retry from the last event printed
    assert printed == [11, 12, 13]  # none twice, none skipped
    assert warnings == [
        "lost the event stream (UNAVAILABLE); reconnecting after #12",  # once for the outage
        "reconnected; resuming after #12",
    ]


def test_an_error_that_is_no_outage_ends_the_follow() -> None:
    def watch(after: int) -> Iterator[cp.AuditEvent]:
        raise Outage(grpc.StatusCode.PERMISSION_DENIED)
        yield  # a generator

    with pytest.raises(grpc.RpcError):
        follow(watch, cursor=0, emit=print, warn=print, wait_ready=lambda timeout_s: True)


def test_backoff_doubles_to_its_cap_with_jitter_below_each_bound() -> None:
    backoff = Backoff(first_s=0.2, max_s=5.0)
    assert [backoff.delay(n, draw=lambda: 1.0) for n in range(7)] == [
        0.2,
        0.4,
        0.8,
        1.6,
        3.2,
        5.0,
        5.0,
    ]
    assert backoff.delay(3, draw=lambda: 0.5) == 0.8


def test_an_event_line_is_one_line_with_its_detail_sorted() -> None:
    event = _event(7, action="residency.reclaim")
    event.actor = "operator:abc"
    event.detail["to"] = "COLD"
    event.detail["from"] = "RESIDENT\nreally"
    assert event_line(event) == (
        "#7  2026-12-01 06:30:00Z  residency.reclaim  k s  by operator:abc  "
        "from=RESIDENT really to=COLD"
    )


def test_reclaim_is_verified_only_when_cold_and_the_worker_saw_the_exit() -> None:
    cold = cp.ReclaimResidencyResponse(
        residency=common_pb2.Residency(residency_id="r", state=common_pb2.RESIDENCY_STATE_COLD),
        reclaim_verified=True,
    )
    cold.evidence.pid, cold.evidence.process_exited = 99, True
    cold.evidence.has_exit_code, cold.evidence.exit_code = True, 0
    assert verified(cold)
    assert "evidence    pid 99 exited with code 0" in render_reclaim(cold)

    late = cp.ReclaimResidencyResponse(
        residency=common_pb2.Residency(state=common_pb2.RESIDENCY_STATE_UNLOADING)
    )
    late.unload_job.job_id = "job-9"
    assert not verified(late)
    assert why_not_verified(late).startswith("still UNLOADING: the deadline came first")
    assert "gantry jobs show job-9" in why_not_verified(late)


def test_a_second_outage_after_the_stream_came_back_is_said_again() -> None:
    warnings: list[str] = []
    calls = 0

    def watch(after: int) -> Iterator[cp.AuditEvent]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise KeyboardInterrupt
        yield _event(after + 1)  # each stream delivers, then drops
        raise Outage()

    with pytest.raises(KeyboardInterrupt):
        follow(
            watch,
            cursor=0,
            emit=lambda event: None,
            warn=warnings.append,
            wait_ready=lambda timeout_s: True,
            describe=lambda error: "UNAVAILABLE",
            monotonic=lambda: 0.0,  # no stream stays open long: only its event proves it
        )
    assert warnings == [
        "lost the event stream (UNAVAILABLE); reconnecting after #1",
        "reconnected; resuming after #1",
        "lost the event stream (UNAVAILABLE); reconnecting after #2",
        "reconnected; resuming after #2",
    ]
