"""Worker supervision for real: model host children killed, stopped, unloaded mid-load."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.crash_policy import RestartPolicy
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost
from gantry.worker.residents import LOADING, RESIDENT, Resident, ResidentFacts
from gantry.worker.supervision import ServingLoad, SupervisionSettings, Supervisor
from tests.fixtures.serving_adapters import RecordingAdapters, no_nvml, serving_load
from tests.integration.harness import shared_warm_pool
from tests.integration.polling import wait_until
from tests.integration.process_titles import pids_titled

# The deployment whose load the cancellation tests cancel.
DEPLOYMENT_CANCELLED = "dep-cancelled"

FACTS = ResidentFacts(
    artifact_digest="sha256:artifact",
    environment_id="default",
    adapter_digest="adapter",
    environment_fingerprint="fingerprint",
)
# Liveness off unless a test turns it on: the loop only runs where a test starts it.
QUIET = SupervisionSettings(restart=RestartPolicy(initial_backoff_s=0.1), ping_interval_s=3600)


def _prepare(model_directory: Path, deployment_id: str) -> ServingLoad:
    # The adapter's real start, health and unload; its prepare takes the directory as it is.
    return serving_load(deployment_id, directory=model_directory)


class _Inventories:
    """Every inventory supervision announced, in order (what the agent would send)."""

    def __init__(self) -> None:
        self.reports: list[wg.Inventory] = []
        self.supervisor: Supervisor | None = None

    def record(self) -> None:
        assert self.supervisor is not None
        self.reports.append(self.supervisor.residents.inventory(generation=1))

    def states_of(self, deployment_id: str) -> list[wg.ResidentModel]:
        return [
            r for inv in self.reports for r in inv.residents if r.deployment_id == deployment_id
        ]


def supervised(settings: SupervisionSettings) -> tuple[Supervisor, _Inventories]:
    inventories = _Inventories()
    # Hosts forked from the pytest process's warm pool, as a worker's are: restarts then cost a
    # fork, not a torch import, and custody of forked hosts is what these tests check.
    supervisor = Supervisor(
        settings,
        on_change=inventories.record,
        host_factory=functools.partial(ModelHost.start, warm_pool=shared_warm_pool()),
        adapters=RecordingAdapters(),
        open_nvml=no_nvml,
    )
    inventories.supervisor = supervisor
    return supervisor, inventories


def _host_pid(resident: Resident) -> int:
    return resident.host.pid if resident.host is not None else 0


def _serving_with_new_pid(resident: Resident, old_pid: int) -> Callable[[], bool]:
    return lambda: resident.state == RESIDENT and _host_pid(resident) not in (0, old_pid)


async def _embed_ok(supervisor: Supervisor, deployment_id: str) -> None:
    host = supervisor.host_for_invoke(deployment_id)
    result = await host.embed(["hello world"], trace_context={}, timeout_s=30)
    assert (result.count, result.dim) == (1, 32)


async def test_killed_host_is_restarted_in_place_with_a_new_pid_and_serves_again(
    tiny_model_dir: Path,
) -> None:
    supervisor, inventories = supervised(QUIET)
    try:
        resident = await supervisor.load(
            "dep-restart", FACTS, _prepare(tiny_model_dir, "dep-restart"), trace_context={}
        )
        old_pid = _host_pid(resident)
        await _embed_ok(supervisor, "dep-restart")

        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await wait_until(lambda: resident.state == LOADING, 10, "the crash to be noticed")
        down = inventories.states_of("dep-restart")[-1]
        assert down.state == common_pb2.RESIDENCY_STATE_LOADING
        assert down.pid == 0
        assert down.last_failure.reason == "RUNTIME_CRASHED"
        assert "SIGKILL" in down.last_failure.message
        # This sandbox may or may not expose a cgroup OOM counter; either way nothing is guessed.
        assert (
            "OOM evidence unavailable" in down.last_failure.message
            or "no OOM kill was recorded" in down.last_failure.message
        )
        assert down.HasField("next_restart_at")
        with pytest.raises(GantryError) as while_down:
            supervisor.host_for_invoke("dep-restart")
        assert while_down.value.reason == "RUNTIME_CRASHED"

        await wait_until(_serving_with_new_pid(resident, old_pid), 90, "the in-place restart")
        await _embed_ok(supervisor, "dep-restart")
        print(f"\nkill -9 to serving again: {time.monotonic() - killed_at:.2f}s")
        up = inventories.states_of("dep-restart")[-1]
        assert up.state == common_pb2.RESIDENCY_STATE_RESIDENT
        assert up.pid == _host_pid(resident) != old_pid
        assert up.restart_count == 1
        assert up.rss_bytes > 0
        assert not up.crash_loop
        assert up.last_failure.reason == "RUNTIME_CRASHED"  # why it last went away
        assert (up.artifact_digest, up.adapter_digest, up.environment_fingerprint) == (
            "sha256:artifact",
            "adapter",
            "fingerprint",
        )
    finally:
        await supervisor.shutdown()
    assert len(supervisor.residents) == 0
    assert pids_titled("gantry model-host dep-restart") == []


async def test_three_crashes_within_the_window_are_a_crash_loop_with_the_long_backoff(
    tiny_model_dir: Path,
) -> None:
    settings = SupervisionSettings(
        restart=RestartPolicy(
            initial_backoff_s=0.05,
            crash_loop_threshold=3,
            crash_loop_window_s=300,
            crash_loop_backoff_s=60,
        ),
        ping_interval_s=3600,
    )
    supervisor, inventories = supervised(settings)
    try:
        resident = await supervisor.load(
            "dep-loop", FACTS, _prepare(tiny_model_dir, "dep-loop"), trace_context={}
        )
        for crash in range(2):
            old_pid = _host_pid(resident)
            os.kill(old_pid, signal.SIGKILL)
            await wait_until(
                _serving_with_new_pid(resident, old_pid), 90, f"restart after crash {crash + 1}"
            )
        killed_wall = dt.datetime.now(dt.UTC)
        os.kill(_host_pid(resident), signal.SIGKILL)
        await wait_until(lambda: resident.crash_loop, 10, "the crash loop")
        seen_wall = dt.datetime.now(dt.UTC)
        looping = inventories.states_of("dep-loop")[-1]
        assert looping.state == common_pb2.RESIDENCY_STATE_LOADING
        assert looping.crash_loop
        assert looping.last_failure.reason == "RUNTIME_CRASH_LOOP"
        assert looping.last_failure.metadata["cause"] == "RUNTIME_CRASHED"
        assert looping.restart_count == 2
        # The long backoff, counted from the third crash: the supervisor saw it between the
        # kill and our noticing the crash loop (however long this machine took to get there).
        long_backoff = dt.timedelta(seconds=60)
        next_restart_at = looping.next_restart_at.ToDatetime(dt.UTC)
        assert killed_wall + long_backoff <= next_restart_at <= seen_wall + long_backoff, (
            killed_wall,
            next_restart_at,
            seen_wall,
        )
        with pytest.raises(GantryError) as refused:
            supervisor.host_for_invoke("dep-loop")
        assert refused.value.reason == "RUNTIME_CRASH_LOOP"

        # An unload cancels the pending restart and ends custody: nothing of it is left.
        evidence = await supervisor.unload("dep-loop")
        assert evidence.process_exited
        assert supervisor.residents.get("dep-loop") is None
        assert inventories.reports[-1].residents == []
    finally:
        await supervisor.shutdown()
    assert pids_titled("gantry model-host dep-loop") == []


async def test_stopped_host_misses_its_ping_fails_invokes_fast_and_is_restarted(
    tiny_model_dir: Path,
) -> None:
    settings = SupervisionSettings(
        restart=RestartPolicy(initial_backoff_s=0.1), ping_interval_s=0.2, ping_timeout_s=0.5
    )
    supervisor, inventories = supervised(settings)
    liveness = asyncio.create_task(supervisor.run_liveness())
    try:
        resident = await supervisor.load(
            "dep-hung", FACTS, _prepare(tiny_model_dir, "dep-hung"), trace_context={}
        )
        await wait_until(
            lambda: (
                resident.health is not None
                and resident.health.runtime.status == wg.HEALTH_STATUS_OK
            ),
            10,
            "a first answered ping",
        )
        old_pid = _host_pid(resident)
        host = supervisor.host_for_invoke("dep-hung")
        os.kill(old_pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        with pytest.raises(GantryError) as caught:
            await host.embed(["hello"], trace_context={}, timeout_s=30)
        fast_failure_s = time.monotonic() - stopped_at
        print(f"\nSIGSTOP to first RUNTIME_UNRESPONSIVE: {fast_failure_s:.2f}s")
        # Failed by the missed ping (0.5 s deadline), not by the 30 s invoke timeout, which
        # would have ended it DEADLINE_EXCEEDED.
        assert caught.value.reason == "RUNTIME_UNRESPONSIVE"
        assert "no answer to a ping within 0.5s" in caught.value.message, caught.value.message

        await wait_until(_serving_with_new_pid(resident, old_pid), 90, "the restart")
        assert not Path(f"/proc/{old_pid}").exists()  # killed and reaped
        assert resident.restart_count == 1
        assert resident.last_failure is not None
        assert resident.last_failure.reason == "RUNTIME_UNRESPONSIVE"
        assert any(
            r.last_failure.reason == "RUNTIME_UNRESPONSIVE" and r.state == LOADING
            for r in inventories.states_of("dep-hung")
        )
        await _embed_ok(supervisor, "dep-hung")
    finally:
        liveness.cancel()
        await supervisor.shutdown()
    assert pids_titled("gantry model-host dep-hung") == []


async def test_unload_during_load_cancels_it_and_leaves_no_process(
    tiny_model_dir: Path,
) -> None:
    supervisor, inventories = supervised(QUIET)
    title = "gantry model-host dep-unload-mid-load"
    loading = asyncio.create_task(
        supervisor.load(
            "dep-unload-mid-load",
            FACTS,
            _prepare(tiny_model_dir, "dep-unload-mid-load"),
            trace_context={},
        )
    )
    try:
        # The host itself: the worker (this process) is its parent.
        await wait_until(
            lambda: bool(pids_titled(title, parent=os.getpid())), 60, "the child to start loading"
        )
        (child_pid,) = pids_titled(title, parent=os.getpid())
        assert inventories.states_of("dep-unload-mid-load")[-1].state == LOADING
        evidence = await supervisor.unload("dep-unload-mid-load")
        assert evidence.process_exited
        with pytest.raises(GantryError) as overtaken:
            await loading
        assert overtaken.value.reason == "INVALID_STATE_TRANSITION"
        assert not Path(f"/proc/{child_pid}").exists()  # killed and reaped, not a zombie
        await _none_titled(title)
        assert supervisor.residents.get("dep-unload-mid-load") is None
        assert inventories.reports[-1].residents == []
    finally:
        loading.cancel()
        await supervisor.shutdown()


async def test_a_cancel_landing_just_after_the_host_is_ready_stops_the_host(
    tiny_model_dir: Path,
) -> None:
    """The window CI once hit: the start finished (host ready, RESIDENT) but the load's caller
    had not resumed when its CancelJob or an overtaking unload cancelled it. The cancellation is
    queued by the factory just before it returns, so it lands in exactly that window."""
    title = f"gantry model-host {DEPLOYMENT_CANCELLED}"
    loading: list[asyncio.Task[Resident]] = []
    started: list[int] = []

    async def start_then_cancel_the_caller(spec: HostLaunchSpec, **kwargs: object) -> ModelHost:
        host = await ModelHost.start(spec, warm_pool=shared_warm_pool(), **kwargs)  # type: ignore[arg-type]
        started.append(host.pid)
        # Runs after this start task completes and before its awaiting caller resumes.
        asyncio.get_running_loop().call_soon(loading[0].cancel)
        return host

    supervisor = _loading_in_a_task(start_then_cancel_the_caller, tiny_model_dir, loading)
    try:
        with pytest.raises(asyncio.CancelledError):
            await loading[0]
        (pid,) = started
        await _nothing_left_of(supervisor, pid, title)  # stopped and reaped, not left running
    finally:
        await supervisor.shutdown()


def _loading_in_a_task(
    host_factory: Callable[..., Awaitable[ModelHost]],
    model_dir: Path,
    loading: list[asyncio.Task[Resident]],
) -> Supervisor:
    """A supervisor with `host_factory`, its load of `model_dir` running in `loading[0]`."""
    supervisor = Supervisor(
        QUIET,
        on_change=lambda: None,
        host_factory=host_factory,
        adapters=RecordingAdapters(),
        open_nvml=no_nvml,
    )
    loading.append(
        asyncio.create_task(
            supervisor.load(
                DEPLOYMENT_CANCELLED,
                FACTS,
                _prepare(model_dir, DEPLOYMENT_CANCELLED),
                trace_context={},
            )
        )
    )
    return supervisor


async def _none_titled(title: str) -> None:
    """No process left with the host's title. A process the host had forked still carries it
    until it execs or exits (a fresh clone's run once found one right after the host's reap);
    one that outlived the host would never go, and fails this."""
    await wait_until(lambda: pids_titled(title) == [], 30, f"no process titled {title!r} left")


async def _nothing_left_of(supervisor: Supervisor, pid: int, title: str) -> None:
    """The cancelled load's child is reaped, no residency is left, and the unload that was
    behind it finds nothing to stop."""
    assert not Path(f"/proc/{pid}").exists()
    await _none_titled(title)
    assert supervisor.residents.get(DEPLOYMENT_CANCELLED) is None
    evidence = await supervisor.unload(DEPLOYMENT_CANCELLED)
    assert evidence.process_exited


class _ForkThenCancel:
    """The shared warm pool, which queues a cancel of the loading task as its fork answers: the
    cancel lands while the start opens its channel to the child, before custody holds it (the
    window a fresh clone's CI hit, through an unload overtaking the load)."""

    def __init__(self, loading: list[asyncio.Task[Resident]], forked: list[int]) -> None:
        self._loading = loading
        self._forked = forked

    async def fork_host(self, **kwargs: Any) -> Any:
        process = await shared_warm_pool().fork_host(**kwargs)
        self._forked.append(process.pid)
        asyncio.get_running_loop().call_soon(self._loading[0].cancel)
        return process


async def test_a_cancel_landing_as_the_fork_answers_kills_and_reaps_the_host(
    tiny_model_dir: Path,
) -> None:
    title = f"gantry model-host {DEPLOYMENT_CANCELLED}"
    loading: list[asyncio.Task[Resident]] = []
    forked: list[int] = []
    pool = _ForkThenCancel(loading, forked)
    supervisor = _loading_in_a_task(
        functools.partial(ModelHost.start, warm_pool=pool), tiny_model_dir, loading
    )
    try:
        with pytest.raises(asyncio.CancelledError):
            await loading[0]
        (pid,) = forked
        await _nothing_left_of(supervisor, pid, title)  # killed and reaped before the cancel ended
    finally:
        await supervisor.shutdown()


async def test_deep_health_runs_a_real_forward_pass_and_shallow_health_does_not(
    tiny_model_dir: Path,
) -> None:
    supervisor, inventories = supervised(QUIET)
    try:
        resident = await supervisor.load(
            "dep-health", FACTS, _prepare(tiny_model_dir, "dep-health"), trace_context={}
        )
        deep = await supervisor.health("dep-health", deep=True)
        assert deep.pid == _host_pid(resident)
        report = deep.report
        assert report.process.status == wg.HEALTH_STATUS_OK
        assert report.runtime.status == wg.HEALTH_STATUS_OK
        assert report.model.status == wg.HEALTH_STATUS_OK, report.model.detail
        assert "width 32" in report.model.detail
        assert report.latency_seconds > 0
        shallow = await supervisor.health("dep-health", deep=False)
        assert shallow.report.model.status == wg.HEALTH_STATUS_NOT_CHECKED
        assert inventories.states_of("dep-health")[-1].health == shallow.report
        with pytest.raises(GantryError) as absent:
            await supervisor.health("dep-nowhere", deep=True)
        assert absent.value.reason == "DEPLOYMENT_NOT_READY"
    finally:
        await supervisor.shutdown()
