"""Custody ends only on a verified reclaim: an unconfirmable stop leaves the resident UNCERTAIN."""

from __future__ import annotations

import pytest

from gantry.common.errors import GantryError
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.exit_cause import OomCounter
from gantry.worker.model_host.process import HostLaunchSpec, OnExit
from gantry.worker.residents import RESIDENT, UNCERTAIN, ResidentFacts
from gantry.worker.supervision import SupervisionSettings, Supervisor
from tests.fixtures.serving_adapters import RecordingAdapters, no_nvml, serving_load

FACTS = ResidentFacts(
    artifact_digest="sha256:a",
    environment_id="default",
    adapter_digest="d",
    environment_fingerprint="f",
)


class FakeUnkillableHost:
    """A fake process seam whose stop can never confirm the process is gone (e.g. stuck in D
    state): the one case real processes cannot produce on demand."""

    pid = 4242
    returncode = None
    unresponsive = None
    unloaded = None
    ready = model_host_pb2.HostReady(pid=4242, dim=8)

    def __init__(self) -> None:
        self.stops = 0

    @property
    def alive(self) -> bool:
        return True

    async def invoke(
        self, kind: str, payload: object, *, trace_context: dict[str, str], timeout_s: float
    ) -> wg.EmbedResult:
        raise AssertionError("not used")

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        return model_host_pb2.Pong()

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport:
        raise AssertionError("not used")

    async def stop(self, *, grace_s: float = 10.0) -> wg.UnloadEvidence:
        self.stops += 1
        return wg.UnloadEvidence(pid=self.pid, process_exited=False)

    async def terminate(self, *, grace_s: float, reap_s: float = 5.0) -> wg.UnloadEvidence:
        return await self.stop(grace_s=grace_s)

    def kill_unresponsive(self, why: str) -> None:
        raise AssertionError("not used")

    def rss_bytes(self) -> int:
        return 1024


async def test_unverifiable_stop_keeps_the_resident_uncertain_and_fails_the_unload() -> None:
    fake = FakeUnkillableHost()

    async def factory(
        spec: HostLaunchSpec, *, on_exit: OnExit | None = None, trace_context: dict[str, str]
    ) -> FakeUnkillableHost:
        return fake

    reports: list[wg.Inventory] = []
    supervisor = Supervisor(
        SupervisionSettings(),
        on_change=lambda: reports.append(supervisor.residents.inventory(7)),
        host_factory=factory,
        oom_counter=OomCounter(None, "not needed"),
        adapters=RecordingAdapters(),
        open_nvml=no_nvml,
    )
    resident = await supervisor.load(
        "dep-stuck", FACTS, serving_load("dep-stuck"), trace_context={}
    )
    assert resident.state == RESIDENT

    with pytest.raises(GantryError) as caught:
        await supervisor.unload("dep-stuck")
    assert caught.value.reason == "RECLAIM_UNVERIFIED"
    assert supervisor.residents.get("dep-stuck") is resident
    (reported,) = reports[-1].residents
    assert reported.state == UNCERTAIN
    assert reported.pid == 4242  # custody keeps the pid the operator must look at
    assert reported.last_failure.reason == "RECLAIM_UNVERIFIED"
    assert [r.residents[0].state for r in reports if r.residents][-2:] == [
        common_pb2.RESIDENCY_STATE_UNLOADING,
        UNCERTAIN,
    ]

    # Shutdown tries again and still keeps custody of what it cannot confirm.
    await supervisor.shutdown()
    assert fake.stops == 2
    assert supervisor.residents.get("dep-stuck") is resident
    assert resident.state == UNCERTAIN
