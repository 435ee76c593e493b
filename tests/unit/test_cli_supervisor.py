"""The supervisor: backoff policy, refusing a start once forced, and the grace `gantry up` gives
each child (restarts and ordered shutdown with real children:
tests/integration/test_cli_supervisor_children.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gantry.cli.restart_policy import BackoffSettings, RestartBackoff
from gantry.cli.state import StatePaths
from gantry.cli.supervisor import ChildSpec, Supervisor
from gantry.cli.up import UpSettings, child_specs
from gantry.common.clock import ManualClock
from gantry.common.process import WORKER_STOP_BOUND_S, stop_grace_s


def python_child(name: str, code: str, tmp_path: Path) -> ChildSpec:
    return ChildSpec(
        name=name, argv=[sys.executable, "-c", code], log_path=tmp_path / f"{name}.log"
    )


def test_backoff_doubles_from_one_second_to_thirty() -> None:
    clock = ManualClock()
    backoff = RestartBackoff(BackoffSettings(), clock)
    delays = []
    for _ in range(8):
        backoff.started()
        clock.advance(0.5)
        delays.append(backoff.exited())
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]


def test_backoff_resets_after_a_child_stays_up_sixty_seconds() -> None:
    clock = ManualClock()
    backoff = RestartBackoff(BackoffSettings(), clock)
    for _ in range(4):
        backoff.started()
        backoff.exited()
    backoff.started()
    clock.advance(59.9)
    assert backoff.exited() == 16  # not quite long enough to count as healthy
    backoff.started()
    clock.advance(60)
    assert backoff.exited() == 1
    backoff.started()
    assert backoff.exited() == 2


def test_a_child_started_after_forcing_is_killed_by_the_stop(tmp_path: Path) -> None:
    supervisor = Supervisor(report=lambda line: None, stop_timeout_s=60)
    supervisor.force_stop()
    with pytest.raises(RuntimeError, match="shutting down"):
        supervisor.start(python_child("late", "import signal; signal.pause()", tmp_path))
    assert supervisor.stop_all() == []


def test_up_gives_the_worker_a_grace_past_its_own_stop_bound(tmp_path: Path) -> None:
    settings = UpSettings(
        paths=StatePaths(tmp_path / "state"),
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
    )
    specs = child_specs(settings)
    # Derived from the one bound the worker divides among its own steps (`stop_plan`).
    assert specs["worker"].stop_timeout_s == stop_grace_s(WORKER_STOP_BOUND_S)
    assert stop_grace_s(WORKER_STOP_BOUND_S) > WORKER_STOP_BOUND_S
    assert specs["controlplane"].stop_timeout_s is None
    assert specs["scheduler"].stop_timeout_s is None
