"""Classifying a model host's unexpected exit: OOM only with kernel evidence, never a guess."""

from __future__ import annotations

import signal
from pathlib import Path

from gantry.worker.exit_cause import OomCounter, classify_exit

KILLED = -signal.SIGKILL


def _classify(returncode: int, before: int | None, after: int | None, **kwargs: bool):  # type: ignore[no-untyped-def]
    return classify_exit(
        deployment_id="dep-1",
        pid=42,
        returncode=returncode,
        oom_kills_before=before,
        oom_kills_after=after,
        oom_counter="/sys/fs/cgroup/memory.events",
        **kwargs,
    )


def test_sigkill_with_a_grown_oom_counter_is_an_oom_kill() -> None:
    error = _classify(KILLED, 3, 4)
    assert error.reason == "RUNTIME_OOM_KILLED"
    assert "1 new OOM kill" in error.message


def test_sigkill_without_readable_evidence_is_a_crash_that_says_so() -> None:
    for before, after in [(None, None), (3, None), (None, 4)]:
        error = _classify(KILLED, before, after)
        assert error.reason == "RUNTIME_CRASHED"
        assert "OOM evidence unavailable" in error.message


def test_sigkill_without_a_new_oom_kill_is_a_crash() -> None:
    error = _classify(KILLED, 3, 3)
    assert error.reason == "RUNTIME_CRASHED"
    assert "no OOM kill was recorded" in error.message


def test_other_exits_are_crashes_with_their_cause() -> None:
    assert "exit code 1" in _classify(1, 0, 0).message
    segfault = _classify(-signal.SIGSEGV, 0, 0)
    assert segfault.reason == "RUNTIME_CRASHED"
    assert "SIGSEGV" in segfault.message


def test_a_host_killed_as_hung_is_unresponsive_whatever_the_counter_says() -> None:
    error = _classify(KILLED, 0, 1, killed_as_unresponsive=True)
    assert error.reason == "RUNTIME_UNRESPONSIVE"


def test_counter_found_through_cgroup_v2(tmp_path: Path) -> None:
    (tmp_path / "proc_cgroup").write_text("0::/workers/w1\n")
    cgroup = tmp_path / "root" / "workers" / "w1"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 7\n")
    counter = OomCounter.for_current_process(
        proc_cgroup=tmp_path / "proc_cgroup", root=tmp_path / "root"
    )
    assert counter.read() == 7
    assert counter.describe() == str(cgroup / "memory.events")


def test_counter_found_through_cgroup_v1_memory_controller(tmp_path: Path) -> None:
    (tmp_path / "proc_cgroup").write_text("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n")
    cgroup = tmp_path / "root" / "memory" / "docker" / "abc"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    counter = OomCounter.for_current_process(
        proc_cgroup=tmp_path / "proc_cgroup", root=tmp_path / "root"
    )
    assert counter.read() == 2


def test_no_counter_is_unavailable_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "proc_cgroup").write_text("0::/nowhere\n")
    counter = OomCounter.for_current_process(
        proc_cgroup=tmp_path / "proc_cgroup", root=tmp_path / "root"
    )
    assert counter.read() is None
    assert "no readable oom_kill counter" in counter.describe()
