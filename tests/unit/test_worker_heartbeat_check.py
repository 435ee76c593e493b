"""`gantry worker --check`: the freshness rule (pure, on a ManualClock), the file the agent writes
(connected or not), and the probe's one-line answers and exit codes."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pytest

from gantry.common.clock import ManualClock
from gantry.worker.heartbeat_file import (
    HeartbeatFile,
    HeartbeatRecord,
    judge_heartbeat,
    read_heartbeat,
)
from gantry.worker.liveness_check import check

START = dt.datetime(2026, 12, 1, 6, 0, tzinfo=dt.UTC)


def written(
    clock: ManualClock,
    path: Path,
    *,
    interval_s: float = 3.0,
    connected: bool = True,
    heartbeat: HeartbeatFile | None = None,
) -> str:
    writer = heartbeat or HeartbeatFile(path, clock=clock)
    writer.record(interval_s=interval_s, node_id="n1", generation=7, connected=connected)
    contents = read_heartbeat(path)
    assert contents is not None
    return contents


def test_a_heartbeat_within_three_intervals_is_fresh_and_one_past_them_is_stale(
    tmp_path: Path,
) -> None:
    clock = ManualClock(START)
    contents = written(clock, tmp_path / "heartbeat", interval_s=5.0)
    clock.advance(15.0)  # exactly three 5 s intervals
    assert judge_heartbeat(contents, now=clock.now(), max_age_s=None).fresh
    clock.advance(2.5)
    verdict = judge_heartbeat(contents, now=clock.now(), max_age_s=None)
    assert not verdict.fresh
    assert verdict.reason.startswith("heartbeat stale by 2.5 s: last at 2026-12-01 06:00:00Z")
    assert "max age 15 s" in verdict.reason
    assert "node n1 generation 7" in verdict.reason


def test_max_age_overrides_the_interval_the_record_names(tmp_path: Path) -> None:
    clock = ManualClock(START)
    contents = written(clock, tmp_path / "heartbeat", interval_s=3.0)
    clock.advance(2.0)
    assert judge_heartbeat(contents, now=clock.now(), max_age_s=None).fresh
    verdict = judge_heartbeat(contents, now=clock.now(), max_age_s=1.0)
    assert not verdict.fresh
    assert verdict.reason.startswith("heartbeat stale by 1.0 s")


def test_no_file_and_unreadable_contents_are_not_live() -> None:
    missing = judge_heartbeat(None, now=START, max_age_s=None)
    assert not missing.fresh and missing.reason.startswith("no heartbeat file yet")
    assert "welcomed" not in missing.reason  # the loop writes it, welcomed or not
    for contents in (
        "",
        "{half a rec",
        "[]",
        '{"sent_at": "2026-12-01T06:00:00+00:00"}',
        '{"sent_at": "yesterday", "interval_s": 3, "node_id": "n", "generation": 1, "pid": 1}',
        # No time zone: a local time read as UTC would be hours off.
        '{"sent_at": "2026-12-01T06:00:00", "interval_s": 3, "node_id": "n", "generation": 1,'
        ' "pid": 1}',
    ):
        verdict = judge_heartbeat(contents, now=START, max_age_s=None)
        assert not verdict.fresh, contents
        assert verdict.reason.startswith("heartbeat file unreadable: not a heartbeat record")
        assert "\n" not in verdict.reason


def test_the_file_is_replaced_whole_and_reads_back(tmp_path: Path) -> None:
    clock = ManualClock(START)
    path = tmp_path / "private" / "heartbeat"  # the directory is made on the first write
    first = HeartbeatRecord.from_json(written(clock, path))
    clock.advance(3.0)
    second = HeartbeatRecord.from_json(written(clock, path))
    assert (first.sent_at, second.sent_at) == (START, START + dt.timedelta(seconds=3))
    assert second.node_id == "n1" and second.generation == 7 and second.interval_s == 3.0
    assert sorted(p.name for p in path.parent.iterdir()) == ["heartbeat"]  # no temporary left


def test_a_write_that_fails_is_logged_once_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    heartbeat = HeartbeatFile(blocker / "heartbeat", clock=ManualClock(START))
    with caplog.at_level(logging.WARNING, logger="gantry.worker.heartbeat_file"):
        for _ in range(3):
            heartbeat.record(interval_s=3.0, node_id="n1", generation=7)
    warnings = [r for r in caplog.records if "cannot write the heartbeat file" in r.getMessage()]
    assert len(warnings) == 1


def test_the_probe_answers_in_one_line_with_its_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = ManualClock(START)
    path = tmp_path / "heartbeat"
    argv = ["--check", "--heartbeat-file", str(path)]

    assert check(argv, clock=clock) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"not live: no heartbeat file yet: no worker loop has written it ({path})\n"

    written(clock, path)
    clock.advance(1.0)
    assert check(argv, clock=clock) == 0
    out, err = capsys.readouterr()
    assert out.startswith("live: heartbeat 1.0 s ago, connected (node n1 generation 7 pid ")
    assert err == ""

    clock.advance(9.5)  # three 3 s intervals plus 1.5 s
    assert check(argv, clock=clock) == 1
    out, err = capsys.readouterr()
    assert err.startswith("not live: heartbeat stale by 1.5 s")
    assert err.count("\n") == 1

    path.write_bytes(b"\xff\xfe")
    assert check(argv, clock=clock) == 1
    _, err = capsys.readouterr()
    assert err.startswith(f"not live: heartbeat file {path} unreadable: ")
    assert err.count("\n") == 1


def test_a_bad_max_age_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        check(["--check", "--max-age-s", "0"])
    assert exited.value.code == 2
    assert "'0' must be above 0" in capsys.readouterr().err


def test_a_worker_cut_off_from_the_control_plane_stays_live_and_says_since_when(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A control-plane outage is no reason to restart the worker: while its loop ticks, the probe
    passes and reports how long it has been reconnecting; only a stuck loop fails it."""
    clock = ManualClock(START)
    path = tmp_path / "heartbeat"
    argv = ["--check", "--heartbeat-file", str(path)]
    heartbeat = HeartbeatFile(path, clock=clock)
    written(clock, path, heartbeat=heartbeat)  # welcomed
    clock.advance(3.0)
    lost_at = clock.now()
    written(clock, path, connected=False, heartbeat=heartbeat)  # the stream ended
    # Two minutes of outage, a tick every interval: each record keeps the same start.
    for _ in range(40):
        clock.advance(3.0)
        record = HeartbeatRecord.from_json(
            written(clock, path, connected=False, heartbeat=heartbeat)
        )
        assert not record.connected and record.disconnected_since == lost_at
    clock.advance(0.5)
    assert check(argv, clock=clock) == 0
    out, err = capsys.readouterr()
    assert out.startswith("live: heartbeat 0.5 s ago, disconnected for 120 s, reconnecting (node")
    assert err == ""

    # Welcomed again: connected, and the next outage starts its own count.
    record = HeartbeatRecord.from_json(written(clock, path, heartbeat=heartbeat))
    assert record.connected and record.disconnected_since is None
    clock.advance(1.0)
    record = HeartbeatRecord.from_json(written(clock, path, connected=False, heartbeat=heartbeat))
    assert record.disconnected_since == clock.now()

    # The loop stops ticking (hung): stale, whatever the connection was.
    clock.advance(9.5)
    assert check(argv, clock=clock) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("not live: heartbeat stale by 0.5 s")


def test_a_record_from_a_writer_that_knew_no_connection_field_reads_as_connected() -> None:
    """Files written before `connected` existed were written only while welcomed."""
    old = (
        '{"sent_at": "2026-12-01T06:00:00+00:00", "interval_s": 3, "node_id": "n",'
        ' "generation": 1, "pid": 1}'
    )
    record = HeartbeatRecord.from_json(old)
    assert record.connected and record.disconnected_since is None
    verdict = judge_heartbeat(old, now=START + dt.timedelta(seconds=1), max_age_s=None)
    assert verdict.fresh and verdict.reason.startswith("heartbeat 1.0 s ago, connected")
