"""Serving goes through the runtime adapter its deployment names: a LOAD is the adapter's prepare
and start, a HEALTH job and every liveness ping its `health`, a hung host its
`kill_unresponsive`, an UNLOAD its `unload`, the worker's own stop its `terminate`. The
registry seam records each call; the host behind it is a fake (no process in a unit test)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from gantry.common import tokens
from gantry.common.errors import GantryError
from gantry.v1 import model_host_pb2
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.exit_cause import OomCounter
from gantry.worker.model_host.process import HostLaunchSpec, OnExit
from gantry.worker.residents import RESIDENT, ResidentFacts
from gantry.worker.supervision import SupervisionSettings, Supervisor
from tests.fixtures.serving_adapters import RecordingAdapters, no_nvml, serving_load

FACTS = ResidentFacts(
    artifact_digest="sha256:a",
    environment_id="default",
    adapter_digest="d",
    environment_fingerprint="f",
)
DEPLOYMENT = "dep-served"


class FakeHost:
    """A model host seam answering pings (or hanging on them) and the model check."""

    pid = 5151
    returncode: int | None = None
    unloaded = None
    ready = model_host_pb2.HostReady(pid=5151, dim=8, load_seconds=0.25)

    def __init__(self) -> None:
        self.hung = False
        self.unresponsive: GantryError | None = None
        self.calls: list[str] = []

    @property
    def alive(self) -> bool:
        return self.returncode is None and self.unresponsive is None

    async def ping(self, *, timeout_s: float) -> model_host_pb2.Pong:
        self.calls.append("ping")
        if self.hung:
            raise GantryError("DEADLINE_EXCEEDED", "no pong")
        return model_host_pb2.Pong()

    async def check_model(self, *, timeout_s: float) -> wg.HealthReport:
        self.calls.append(f"check_model:{timeout_s:g}")
        return wg.HealthReport(model=wg.HealthLayer(status=wg.HEALTH_STATUS_OK, detail="finite"))

    async def stop(self, *, grace_s: float = 10.0) -> wg.UnloadEvidence:
        self.calls.append("stop")
        self.returncode = 0
        return wg.UnloadEvidence(pid=self.pid, process_exited=True, has_exit_code=True)

    async def terminate(self, *, grace_s: float, reap_s: float = 5.0) -> wg.UnloadEvidence:
        self.calls.append("terminate")
        self.returncode = -15
        return wg.UnloadEvidence(pid=self.pid, process_exited=True, exit_signal=15)

    async def kill(self) -> wg.UnloadEvidence:
        self.calls.append("kill")
        self.returncode = -9
        return wg.UnloadEvidence(pid=self.pid, process_exited=True, exit_signal=9)

    async def probe_check(self, *, timeout_s: float) -> model_host_pb2.ProbeResult:
        raise AssertionError("serving never probes")

    def kill_unresponsive(self, why: str) -> None:
        self.calls.append(f"kill_unresponsive:{why}")
        self.unresponsive = GantryError("RUNTIME_UNRESPONSIVE", why)

    def rss_bytes(self) -> int:
        return 1024


def _supervised(
    host: FakeHost, settings: SupervisionSettings | None = None
) -> tuple[Supervisor, RecordingAdapters]:
    async def factory(
        spec: HostLaunchSpec,
        *,
        on_exit: OnExit | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> FakeHost:
        return host

    adapters = RecordingAdapters()
    supervisor = Supervisor(
        settings or SupervisionSettings(ping_timeout_s=0.5, deep_health_timeout_s=7),
        on_change=lambda: None,
        host_factory=factory,
        oom_counter=OomCounter(None, "not needed"),
        adapters=adapters,
        open_nvml=no_nvml,
    )
    return supervisor, adapters


async def test_a_load_is_the_adapters_prepare_and_start_and_its_evidence_comes_from_them() -> None:
    host = FakeHost()
    supervisor, adapters = _supervised(host)
    resident = await supervisor.load(DEPLOYMENT, FACTS, serving_load(DEPLOYMENT), trace_context={})
    assert resident.state == RESIDENT and resident.host is host
    assert adapters.looked_up == ["sentence_transformers"]
    assert adapters.calls == ["prepare", "start"]
    evidence = supervisor.load_evidence(resident)
    assert (evidence.pid, evidence.dim, evidence.load_seconds) == (5151, 8, 0.25)
    assert (evidence.adapter_digest, evidence.environment_fingerprint) == ("d", "f")


async def test_an_unknown_adapter_is_refused_before_anything_is_admitted() -> None:
    supervisor, adapters = _supervised(FakeHost())
    with pytest.raises(GantryError) as refused:
        await supervisor.load(
            DEPLOYMENT, FACTS, serving_load(DEPLOYMENT, adapter="no_such"), trace_context={}
        )
    assert refused.value.reason == "RUNTIME_INCOMPATIBLE"
    assert adapters.calls == [] and len(supervisor.residents) == 0


async def test_health_and_liveness_are_the_adapters_health_and_unload_its_unload() -> None:
    host = FakeHost()
    supervisor, adapters = _supervised(host)
    await supervisor.load(DEPLOYMENT, FACTS, serving_load(DEPLOYMENT), trace_context={})

    deep = await supervisor.health(DEPLOYMENT, deep=True)
    assert deep.pid == 5151
    assert deep.report.model.status == wg.HEALTH_STATUS_OK
    await supervisor.check_liveness()
    shallow = await supervisor.health(DEPLOYMENT, deep=False)
    assert shallow.report.model.status == wg.HEALTH_STATUS_NOT_CHECKED
    # The deep check gets the deep timeout, the pings the ping timeout.
    assert host.calls == ["ping", "check_model:7", "ping", "ping"]
    unloaded = await supervisor.unload(DEPLOYMENT)
    assert unloaded.process_exited
    assert adapters.calls == ["prepare", "start", "health:deep", "health", "health", "unload"]
    assert len(supervisor.residents) == 0


async def test_a_ping_left_unanswered_is_the_adapters_kill_of_a_hung_host() -> None:
    host = FakeHost()
    supervisor, adapters = _supervised(host)
    await supervisor.load(DEPLOYMENT, FACTS, serving_load(DEPLOYMENT), trace_context={})
    host.hung = True
    health = await supervisor.health(DEPLOYMENT, deep=True)
    why = "no answer to a ping within 0.5s"
    assert (health.report.runtime.status, health.report.runtime.detail) == (
        wg.HEALTH_STATUS_FAILED,
        why,
    )
    assert health.report.model.detail == "the runtime did not answer, so the model was not run"
    assert host.calls[-1] == f"kill_unresponsive:{why}"
    assert adapters.calls[-2:] == ["health:deep", "kill_unresponsive"]


async def test_the_workers_own_stop_is_the_adapters_terminate() -> None:
    host = FakeHost()
    supervisor, adapters = _supervised(host)
    await supervisor.load(DEPLOYMENT, FACTS, serving_load(DEPLOYMENT), trace_context={})
    await supervisor.shutdown()
    assert adapters.calls[-1] == "terminate" and host.calls == ["terminate"]
    assert len(supervisor.residents) == 0


async def test_a_health_job_is_answered_by_the_adapters_health() -> None:
    host = FakeHost()
    agent = WorkerAgent(
        WorkerSettings(
            control_plane="unix:/nonexistent.sock",
            credential=tokens.mint_token(tokens.NODE_CREDENTIAL, "node-1"),
            artifact_root=Path("/nonexistent"),
            warm_pool=False,
            resource_domains=(),
            env={},
        )
    )
    agent.supervisor, adapters = _supervised(host)
    await agent.supervisor.load(DEPLOYMENT, FACTS, serving_load(DEPLOYMENT), trace_context={})
    result = await agent.run_job(
        wg.JobAssignment(
            job_id="job-1",
            lease_token="lease",
            health=wg.HealthSpec(deployment_id=DEPLOYMENT, deep=True),
        )
    )
    assert not result.HasField("failure"), result.failure
    assert result.health.pid == 5151
    assert result.health.report.model.status == wg.HEALTH_STATUS_OK
    assert adapters.calls[-1] == "health:deep"
