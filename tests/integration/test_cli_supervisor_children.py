"""The supervisor with real child processes: a crashed child restarted once its backoff elapsed (in
the foreground and in the background), children stopped in reverse start order with each exit
confirmed, a child that ignores SIGTERM killed, no restart once shutdown began, duplicate names
refused, forcing killing every child at once, and a child's own stop timeout winning.

The backoff policy and the grace `gantry up` gives each child are tested in
tests/unit/test_cli_supervisor.py; these start processes, which the unit guard refuses.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from pathlib import Path

import pytest

from gantry.cli.restart_policy import BackoffSettings
from gantry.cli.supervisor import ChildSpec, StopResult, Supervisor
from gantry.common.clock import ManualClock
from tests.integration.polling import wait_until_sync
from tests.unit.test_cli_supervisor import python_child

# State another process changes (a file, an exit) is polled, up to this deadline.
STATE_DEADLINE_S = 10.0


def test_crashed_child_is_restarted_only_once_its_backoff_elapsed(tmp_path: Path) -> None:
    clock = ManualClock()
    lines: list[str] = []
    supervisor = Supervisor(clock=clock, report=lines.append)
    supervisor.start(python_child("crasher", "import sys; sys.exit(3)", tmp_path))

    def exit_noticed() -> bool:
        supervisor.poll()
        return any("exited with exit code 3" in line for line in lines)

    wait_until_sync(exit_noticed, STATE_DEADLINE_S, "the crasher's first exit")
    assert "restarting in 1s" in lines[-1]
    supervisor.poll()
    assert supervisor.start_count("crasher") == 1  # the clock has not moved: no restart yet

    clock.advance(1.0)
    supervisor.poll()
    assert supervisor.start_count("crasher") == 2
    assert any(line.startswith("restarted crasher") for line in lines)

    lines.clear()
    wait_until_sync(exit_noticed, STATE_DEADLINE_S, "the crasher's second exit")
    assert "restarting in 2s" in lines[-1]  # the second crash in a row waits twice as long
    supervisor.stop_all()
    log = (tmp_path / "crasher.log").read_text()
    assert log.count("starting crasher") == 2


def test_background_supervision_restarts_a_crashed_child(tmp_path: Path) -> None:
    marker = tmp_path / "starts"
    code = f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(1)"
    supervisor = Supervisor(
        backoff=BackoffSettings(initial_s=0.05, maximum_s=0.1), report=lambda line: None
    )
    supervisor.start(python_child("flaky", code, tmp_path))
    supervisor.run_in_background(interval_s=0.02)
    try:
        wait_until_sync(
            lambda: marker.exists() and len(marker.read_text()) >= 3,
            STATE_DEADLINE_S,
            "three starts of flaky",
        )
    finally:
        supervisor.stop_all()
    assert supervisor.start_count("flaky") >= 3


def test_children_stop_in_reverse_start_order_and_each_exit_is_confirmed(tmp_path: Path) -> None:
    order_file = tmp_path / "order"
    ready = tmp_path / "ready"
    code = (
        "import signal, sys, pathlib\n"
        "name = sys.argv[1]\n"
        "def stop(*_):\n"
        f"    open({str(order_file)!r}, 'a').write(name + '\\n'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"pathlib.Path({str(ready)!r} + name).touch()\n"
        "signal.pause()\n"  # until the SIGTERM
    )
    lines: list[str] = []
    supervisor = Supervisor(report=lines.append)
    names = ["scheduler", "controlplane", "worker"]
    for name in names:
        supervisor.start(
            ChildSpec(
                name=name,
                argv=[sys.executable, "-c", code, name],
                log_path=tmp_path / f"{name}.log",
            )
        )
    wait_until_sync(
        lambda: all(Path(f"{ready}{name}").exists() for name in names),
        STATE_DEADLINE_S,
        "every child ready",
    )
    pids = {name: supervisor.pid(name) for name in names}

    results = supervisor.stop_all()

    assert [result.name for result in results] == ["worker", "controlplane", "scheduler"]
    assert order_file.read_text().split() == ["worker", "controlplane", "scheduler"]
    assert all(result.returncode == 0 and not result.killed for result in results)
    assert [r.pid for r in results] == [pids["worker"], pids["controlplane"], pids["scheduler"]]
    assert lines == [f"stopped {name} (pid {pids[name]}): exit code 0" for name in reversed(names)]


def test_a_child_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "signal.pause()\n"  # until the SIGKILL
    )
    supervisor = Supervisor(report=lambda line: None, stop_timeout_s=0.3)
    supervisor.start(python_child("stubborn", code, tmp_path))
    wait_until_sync(ready.exists, STATE_DEADLINE_S, "the stubborn child ready")
    [result] = supervisor.stop_all()
    assert result.killed
    assert result.returncode == -9


def test_no_restart_after_shutdown_began(tmp_path: Path) -> None:
    clock = ManualClock()
    supervisor = Supervisor(clock=clock, report=lambda line: None)
    supervisor.start(python_child("short", "pass", tmp_path))
    [result] = supervisor.stop_all()
    clock.advance(60)
    supervisor.poll()
    assert supervisor.start_count("short") == 1
    assert result.name == "short"


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    supervisor = Supervisor(report=lambda line: None)
    supervisor.start(python_child("one", "import signal; signal.pause()", tmp_path))
    try:
        with pytest.raises(ValueError, match="already supervised"):
            supervisor.start(python_child("one", "pass", tmp_path))
    finally:
        supervisor.stop_all()


def test_forcing_during_an_ordered_stop_kills_every_child_at_once(tmp_path: Path) -> None:
    # Children that note SIGTERM and carry on: an ordered stop would give each the full timeout.
    ready, terminated = tmp_path / "ready", tmp_path / "terminated"
    code = (
        "import signal, sys, pathlib\n"
        "name = sys.argv[1]\n"
        f"on_term = lambda *_: pathlib.Path({str(terminated)!r} + name).touch()\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        f"pathlib.Path({str(ready)!r} + name).touch()\n"
        "while True: signal.pause()\n"  # the SIGTERM handler returns: until the SIGKILL
    )
    lines: list[str] = []
    supervisor = Supervisor(report=lines.append, stop_timeout_s=60)
    names = ["scheduler", "controlplane", "worker"]
    for name in names:
        supervisor.start(
            ChildSpec(name=name, argv=[sys.executable, "-c", code, name], log_path=tmp_path / name)
        )
    wait_until_sync(
        lambda: all(Path(f"{ready}{n}").exists() for n in names),
        STATE_DEADLINE_S,
        "every child ready",
    )
    results: list[StopResult] = []
    stopping = threading.Thread(target=lambda: results.extend(supervisor.stop_all()))
    stopping.start()
    wait_until_sync(
        lambda: Path(f"{terminated}worker").exists(), STATE_DEADLINE_S, "the worker's SIGTERM"
    )

    supervisor.force_stop()
    # Each child was given 60 s to stop: a stop_all() still running at 30 s waited on them.
    stopping.join(timeout=30)

    assert not stopping.is_alive()
    assert [(r.name, r.killed, r.returncode) for r in results] == [
        ("worker", True, -9),
        ("controlplane", True, -9),
        ("scheduler", True, -9),
    ]
    assert [line.split(": ", 1)[1] for line in lines] == ["killed (forced)"] * 3


def test_a_childs_own_stop_timeout_overrides_the_supervisors(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "signal.pause()\n"  # until the SIGKILL
    )
    # The supervisor's own timeout would outlast the test's: only the child's can end this stop.
    supervisor = Supervisor(report=lambda line: None, stop_timeout_s=3600)
    spec = python_child("stubborn", code, tmp_path)
    supervisor.start(dataclasses.replace(spec, stop_timeout_s=0.3))
    wait_until_sync(ready.exists, STATE_DEADLINE_S, "the stubborn child ready")
    [result] = supervisor.stop_all()
    assert (result.killed, result.returncode) == (True, -9)
