"""The worker's own stop: one plan of deadlines from one bound, and every host stopped at once
against it (so six hosts take as long as the slowest, never six graces one after another)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gantry.common.errors import GantryError
from gantry.common.process import WORKER_STOP_BOUND_S, stop_grace_s
from gantry.v1 import model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.exit_cause import OomCounter
from gantry.worker.model_host.process import HostLaunchSpec, OnExit
from gantry.worker.residents import ResidentFacts
from gantry.worker.stop_plan import StopPlan
from gantry.worker.supervision import SupervisionSettings, Supervisor
from tests.fixtures.serving_adapters import RecordingAdapters, no_nvml, serving_load
from tests.waiting import poll

FACTS = ResidentFacts(
    artifact_digest="sha256:a",
    environment_id="default",
    adapter_digest="d",
    environment_fingerprint="f",
)


def test_the_plan_kills_and_gives_up_inside_the_bound_its_supervisor_waits_past() -> None:
    plan = StopPlan.starting(100.0, bound_s=10.0)
    assert (plan.kill_at, plan.give_up_at) == (105.0, 108.0)
    assert plan.term_grace_s(100.0) == 5.0
    assert plan.reap_s(100.0) == 3.0  # counted from the SIGKILL at kill_at
    assert plan.elapsed_s(101.5) == 1.5
    default = StopPlan.starting(0.0)
    assert default.give_up_at < WORKER_STOP_BOUND_S < stop_grace_s(WORKER_STOP_BOUND_S)


def test_a_step_that_starts_late_gets_what_is_left_never_a_fresh_grace() -> None:
    plan = StopPlan.starting(0.0, bound_s=10.0)
    assert plan.term_grace_s(4.0) == 1.0
    assert plan.term_grace_s(6.0) == 0.0  # past kill_at: SIGKILL at once
    assert plan.reap_s(6.0) == 2.0
    assert plan.reap_s(9.0) == 0.0


@pytest.mark.parametrize("bound_s", [0.0, -1.0])
def test_a_plan_needs_a_positive_bound(bound_s: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        StopPlan.starting(0.0, bound_s=bound_s)


class GatedHost:
    """A host whose stop waits at a gate the test opens: how the test sees which stops run at
    the same time. Process seams are what the integration test covers (tests/integration/
    test_worker_stop.py); this one pins the order of calls."""

    ready = model_host_pb2.HostReady(dim=8)
    returncode = None
    unresponsive = None
    unloaded = None
    alive = True

    def __init__(self, pid: int, entered: list[tuple[int, float, float]], gate: asyncio.Event):
        self.pid = pid
        self._entered = entered
        self._gate = gate

    async def stop(self, *, grace_s: float = 10.0) -> wg.UnloadEvidence:
        raise AssertionError("the worker's own stop terminates; it does not ask for an unload")

    async def terminate(self, *, grace_s: float, reap_s: float = 5.0) -> wg.UnloadEvidence:
        self._entered.append((self.pid, grace_s, reap_s))
        await self._gate.wait()
        return wg.UnloadEvidence(pid=self.pid, process_exited=True, exit_signal=15)

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        return model_host_pb2.Pong()

    def kill_unresponsive(self, why: str) -> None:
        raise AssertionError("not used")

    def rss_bytes(self) -> int:
        return 0


async def test_shutdown_terminates_every_host_at_once_against_one_plan() -> None:
    entered: list[tuple[int, float, float]] = []
    gate = asyncio.Event()
    hosts = iter(GatedHost(pid, entered, gate) for pid in range(1001, 1007))

    async def factory(
        spec: HostLaunchSpec, *, on_exit: OnExit | None = None, trace_context: dict[str, str]
    ) -> GatedHost:
        return next(hosts)

    supervisor = Supervisor(
        SupervisionSettings(),
        on_change=lambda: None,
        host_factory=factory,
        oom_counter=OomCounter(None, "not needed"),
        adapters=RecordingAdapters(),
        open_nvml=no_nvml,
    )
    for index in range(6):
        await supervisor.load(f"dep-{index}", FACTS, serving_load(f"dep-{index}"), trace_context={})

    loop = asyncio.get_running_loop()
    plan = StopPlan.starting(loop.time(), bound_s=10.0)
    stopping = asyncio.create_task(supervisor.shutdown(plan))
    # Each host's stop waits at the gate: stopped one after another, only the first would enter.
    await poll(lambda: len(entered) == 6, 10, "each host's stop at the gate", last=lambda: entered)
    assert sorted(pid for pid, _, _ in entered) == list(range(1001, 1007))
    # Each got what was left of the one plan (5 s to exit, 3 s more to be reaped) when signalled:
    # never more than at its start, less only by the time taken to get there, as measured.
    signalled_by = loop.time()
    for _, grace_s, reap_s in entered:
        assert plan.term_grace_s(signalled_by) <= grace_s <= plan.term_grace_s(plan.started_at)
        assert plan.reap_s(signalled_by) <= reap_s <= plan.reap_s(plan.started_at)
    gate.set()
    await stopping
    assert len(supervisor.residents) == 0  # every reclaim verified: custody ended


async def test_a_host_that_exits_during_shutdown_is_not_restarted() -> None:
    """Its exit is reported while shutdown still cancels another resident's load: a restart
    begun then would fork a host after the worker stopped its last one."""
    exits: list[OnExit] = []
    entered: list[tuple[int, float, float]] = []
    gate = asyncio.Event()
    gate.set()
    host = GatedHost(2001, entered, gate)
    load_cancelled = asyncio.Event()
    cleanup_done = asyncio.Event()

    async def factory(
        spec: HostLaunchSpec, *, on_exit: OnExit | None = None, trace_context: dict[str, str]
    ) -> GatedHost:
        if spec.deployment_id == "dep-loading":
            try:
                await asyncio.Event().wait()  # a load that never finishes by itself
            except asyncio.CancelledError:
                load_cancelled.set()
                await cleanup_done.wait()  # as a real start reaps its half-started child
                raise
        assert on_exit is not None
        exits.append(on_exit)
        return host

    supervisor = Supervisor(
        SupervisionSettings(),
        on_change=lambda: None,
        host_factory=factory,
        oom_counter=OomCounter(None, "not needed"),
        adapters=RecordingAdapters(),
        open_nvml=no_nvml,
    )
    await supervisor.load("dep-exit", FACTS, serving_load("dep-exit"), trace_context={})
    loading = asyncio.create_task(
        supervisor.load("dep-loading", FACTS, serving_load("dep-loading"), trace_context={})
    )
    stopping = asyncio.create_task(supervisor.shutdown())
    await load_cancelled.wait()  # shutdown is cancelling the load ...
    exits[0](host, -15)  # type: ignore[arg-type]  # ... when the first host's exit is reported
    cleanup_done.set()
    await stopping
    with contextlib.suppress(asyncio.CancelledError, GantryError):
        await loading
    restarts = [t for t in asyncio.all_tasks() if t.get_name().startswith("restart-")]
    assert restarts == []
    assert len(exits) == 1
    assert len(supervisor.residents) == 0
