"""PROBE jobs on the worker for real: a model host child loads a tiny model, is checked, measured,
stopped and reaped; refusals come before any child starts; a cancelled probe leaves no process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil
import pytest

from gantry.common import tokens
from gantry.common.artifact_walk import build_manifest
from gantry.common.errors import FailureClass, GantryError
from gantry.common.ids import new_id
from gantry.common.manifest import manifest_digest
from gantry.v1 import common_pb2, model_host_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import worker_gateway_pb2 as wg
from gantry.worker.agent import WorkerAgent, WorkerSettings
from gantry.worker.environment_facts import RuntimeEnvironments
from gantry.worker.model_host.environments import ENV_MAP_JSON
from gantry.worker.model_host.process import HostLaunchSpec, ModelHost, OnExit
from gantry.worker.probe_job import ProbeHost, ProbeRunner, ProbeSettings
from tests.integration.harness import Harness, running_gantry, wait_for
from tests.integration.polling import wait_until
from tests.integration.process_titles import pids_titled

STAGES = [
    common_pb2.PROBE_STATE_PREPARING,
    common_pb2.PROBE_STATE_LOADING,
    common_pb2.PROBE_STATE_HEALTHCHECKING,
    common_pb2.PROBE_STATE_READY,
    common_pb2.PROBE_STATE_UNLOADING,
]
MEMORY_FIELDS = [field.name for field in wg.MemoryEvidence.DESCRIPTOR.fields]


def _artifact(root: Path, source: Path, location: str) -> wg.ArtifactRef:
    target = root / location
    if not target.exists():
        shutil.copytree(source, target)
    manifest = build_manifest(target)
    return wg.ArtifactRef(
        artifact_set_id=new_id(),
        artifact_location=location,
        manifest_digest=manifest_digest(manifest),
        manifest=[
            common_pb2.ManifestEntry(path=e.path, size_bytes=e.size_bytes, sha256=e.sha256)
            for e in manifest
        ],
    )


def _assignment(
    artifact: wg.ArtifactRef,
    *,
    adapter: str = "sentence_transformers",
    environment_id: str = "",
    probe_id: str | None = None,
) -> wg.JobAssignment:
    return wg.JobAssignment(
        job_id=new_id(),
        job_type=wg.JOB_TYPE_PROBE,
        lease_token="lease",
        probe=wg.ProbeSpec(
            probe_id=probe_id or new_id(),
            profile_id=new_id(),
            artifact=artifact,
            environment_id=environment_id,
            adapter=common_pb2.AdapterSettings(adapter=adapter, device="cpu"),
        ),
    )


class _Hosts:
    """The host factory of a runner under test: real children, every start recorded."""

    def __init__(self, wrap: Callable[[ModelHost], ProbeHost] | None = None) -> None:
        self.started: list[ModelHost] = []
        self.calls = 0
        self._wrap = wrap

    async def __call__(
        self,
        spec: HostLaunchSpec,
        *,
        on_exit: OnExit | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> ProbeHost:
        self.calls += 1
        assert on_exit is None  # a probe's child reports no exit: nothing restarts it
        host = await ModelHost.start(spec, trace_context=trace_context)
        self.started.append(host)
        return self._wrap(host) if self._wrap else host


def _runner(
    root: Path, verified_root: Path, hosts: _Hosts, env: Mapping[str, str] | None = None
) -> ProbeRunner:
    return ProbeRunner(
        ProbeSettings(
            artifact_root=root, verified_root=verified_root, env=env or {}, load_timeout_s=90
        ),
        environments=RuntimeEnvironments(env or {}),
        host_factory=hosts,
    )


def _process_gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    root, verified = tmp_path / "artifacts", tmp_path / "verified"
    root.mkdir()
    return root, verified


async def test_probe_walks_every_stage_measures_and_reaps_its_child_without_a_resident(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    agent = WorkerAgent(
        WorkerSettings(
            control_plane="127.0.0.1:1",
            credential=tokens.mint_token(tokens.NODE_CREDENTIAL, new_id()),
            artifact_root=root,
            env={},
        )
    )
    hosts = _Hosts()
    runner = _runner(root, verified_root, hosts)
    updates: list[wg.JobUpdate] = []
    assignment = _assignment(_artifact(root, tiny_model_dir, "tiny"))

    evidence = await runner.run(assignment, updates.append)

    assert [u.probe_state for u in updates] == STAGES
    assert {(u.job_id, u.lease_token, u.state) for u in updates} == {
        (assignment.job_id, "lease", wg.JOB_STATE_RUNNING)
    }
    (host,) = hosts.started
    assert _process_gone(host.pid)  # reaped, not a zombie
    assert list(verified_root.iterdir()) == []  # the job's verified copy is gone too
    assert len(agent.residents) == 0 and list(agent.residents.inventory(1).residents) == []

    environment = (await RuntimeEnvironments({}).require("")).environment
    assert (evidence.environment_id, evidence.environment_fingerprint) == (
        "default",
        environment.fingerprint,
    )
    assert (evidence.files_verified, evidence.bytes_verified) == (
        len(assignment.probe.artifact.manifest),
        sum(e.size_bytes for e in assignment.probe.artifact.manifest),
    )
    assert evidence.adapter == "sentence_transformers"
    assert len(evidence.adapter_digest) == 64
    assert {"python", "torch", "transformers", "sentence_transformers", "device"} <= set(
        evidence.runtime_versions
    )
    assert evidence.load_seconds > 0 and evidence.first_invoke_seconds > 0
    assert (list(evidence.output_shape), evidence.output_finite) == ([1, 32], True)
    # Observed by the child: its weights read from the verified copy alone, no model code.
    assert list(evidence.offline.weight_files) == ["model.safetensors"]
    assert not evidence.offline.weight_files_outside_copy
    assert not evidence.offline.remote_code_modules
    assert evidence.offline.offline_env["HF_HUB_OFFLINE"] == "1"
    health = evidence.health
    assert [health.process.status, health.runtime.status, health.model.status] == [
        wg.HEALTH_STATUS_OK
    ] * 3
    assert health.capability == wg.HealthLayer(
        status=wg.HEALTH_STATUS_NOT_CHECKED, detail="NOT_ROUTED"
    )

    memory = evidence.memory
    # Every reading is a measurement or says why there is none: never unset, never a stand-in.
    assert all(getattr(memory, name).WhichOneof("value") for name in MEMORY_FIELDS)
    assert memory.rss_current.bytes > 0 and "VmRSS" in memory.rss_current.source
    assert memory.rss_peak.bytes >= memory.rss_current.bytes and "VmHWM" in memory.rss_peak.source
    for name in MEMORY_FIELDS:
        if name.startswith("cuda_"):
            assert getattr(memory, name).unavailable, name  # a cpu probe: no CUDA readings
        if name.startswith("nvml_"):
            assert getattr(memory, name).unavailable, name  # no NVML library on this machine
    assert memory.nvml_device_total.unavailable.startswith(("NVMLError", "NVML not installed"))

    reclaim = evidence.reclaim
    assert (reclaim.pid, reclaim.process_exited, reclaim.reaped) == (host.pid, True, True)
    assert (reclaim.has_exit_code, reclaim.exit_code, reclaim.exit_signal) == (True, 0, 0)
    assert reclaim.nvml_process_used_after.unavailable
    assert reclaim.reclaimed is True
    assert reclaim.detail.startswith(f"pid {host.pid} exited with code 0, reaped;")


async def test_cross_encoder_probe_checks_a_reranking_forward_pass(
    tiny_cross_encoder_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    hosts = _Hosts()
    updates: list[wg.JobUpdate] = []
    assignment = _assignment(
        _artifact(root, tiny_cross_encoder_dir, "reranker"),
        adapter="sentence_transformers_cross_encoder",
    )
    evidence = await _runner(root, verified_root, hosts).run(assignment, updates.append)
    assert [u.probe_state for u in updates] == STAGES
    assert evidence.adapter == "sentence_transformers_cross_encoder"
    assert evidence.health.model.status == wg.HEALTH_STATUS_OK
    assert evidence.output_finite and evidence.output_shape
    assert evidence.reclaim.reclaimed
    assert _process_gone(hosts.started[0].pid)


async def test_unknown_adapter_is_runtime_incompatible_before_any_child_starts(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    hosts = _Hosts()
    updates: list[wg.JobUpdate] = []
    assignment = _assignment(_artifact(root, tiny_model_dir, "tiny"), adapter="vllm")
    with pytest.raises(GantryError) as caught:
        await _runner(root, verified_root, hosts).run(assignment, updates.append)
    assert caught.value.reason == "RUNTIME_INCOMPATIBLE"
    assert caught.value.failure_class is FailureClass.CONFIG
    assert hosts.calls == 0
    assert [u.probe_state for u in updates] == [common_pb2.PROBE_STATE_PREPARING]
    assert not verified_root.exists() or list(verified_root.iterdir()) == []


async def test_missing_environment_mapping_is_runtime_environment_unavailable(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    hosts = _Hosts()
    env = {ENV_MAP_JSON: json.dumps({"other": "/usr/bin/python3"})}
    assignment = _assignment(_artifact(root, tiny_model_dir, "tiny"), environment_id="torch-2.14")
    with pytest.raises(GantryError) as caught:
        await _runner(root, verified_root, hosts, env).run(assignment, lambda update: None)
    assert caught.value.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert caught.value.failure_class is FailureClass.CONFIG
    assert "'torch-2.14' is not in this worker's environment map" in caught.value.message
    assert hosts.calls == 0


async def test_changed_bytes_are_an_artifact_mismatch_and_start_nothing(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    hosts = _Hosts()
    artifact = _artifact(root, tiny_model_dir, "tiny")
    (root / "tiny" / "modules.json").write_text("[]")
    with pytest.raises(GantryError) as caught:
        await _runner(root, verified_root, hosts).run(_assignment(artifact), lambda update: None)
    assert caught.value.reason == "ARTIFACT_MISMATCH"
    assert hosts.calls == 0
    assert list(verified_root.iterdir()) == []


async def test_a_model_that_cannot_load_fails_the_probe_and_leaves_no_process(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    (root / "broken").mkdir()
    shutil.copytree(tiny_model_dir, root / "broken", dirs_exist_ok=True)
    # Safetensors by its header (so the gate passes it), naming 16 bytes of data that are not there.
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (root / "broken" / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    probe_id = new_id()
    assignment = _assignment(_artifact(root, tiny_model_dir, "broken"), probe_id=probe_id)
    with pytest.raises(GantryError) as caught:
        await _runner(root, verified_root, _Hosts()).run(assignment, lambda update: None)
    assert caught.value.reason == "LOAD_FAILED"
    assert pids_titled(f"gantry model-host probe-{probe_id}") == []
    assert list(verified_root.iterdir()) == []


class _CheckNeverAnswers:
    """A real, loaded host whose ProbeCheck the test holds: the probe is mid-check when it wants."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host
        self.checking = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.host, name)

    async def probe_check(self, *, timeout_s: float) -> model_host_pb2.ProbeResult:
        self.checking.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_cancel_mid_check_kills_and_reaps_the_child_and_sends_no_result(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    held: list[_CheckNeverAnswers] = []

    def hold(host: ModelHost) -> ProbeHost:
        held.append(_CheckNeverAnswers(host))
        return held[-1]  # type: ignore[return-value]

    hosts = _Hosts(wrap=hold)
    updates: list[wg.JobUpdate] = []
    assignment = _assignment(_artifact(root, tiny_model_dir, "tiny"))
    probe = asyncio.create_task(_runner(root, verified_root, hosts).run(assignment, updates.append))
    await wait_until(lambda: bool(held) and held[0].checking.is_set(), 90, "the probe check")
    pid = held[0].host.pid
    assert not _process_gone(pid)

    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe

    assert _process_gone(pid)
    assert held[0].host.returncode is not None  # reaped by us
    assert [u.probe_state for u in updates] == [
        *STAGES[:3],
        common_pb2.PROBE_STATE_CANCELLED,
    ]
    assert list(verified_root.iterdir()) == []


def _own_children(title: str) -> list[int]:
    """This process's children titled `title`: the host itself. A process it forks while it
    loads (a library's helper) carries its title for a moment, and is not it."""
    own = []
    for pid in pids_titled(title):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).ppid() == os.getpid():
                own.append(pid)
    return own


async def test_cancel_while_the_child_loads_leaves_no_process(
    tiny_model_dir: Path, roots: tuple[Path, Path]
) -> None:
    root, verified_root = roots
    probe_id = new_id()
    title = f"gantry model-host probe-{probe_id}"
    updates: list[wg.JobUpdate] = []
    assignment = _assignment(_artifact(root, tiny_model_dir, "tiny"), probe_id=probe_id)
    probe = asyncio.create_task(
        _runner(root, verified_root, _Hosts()).run(assignment, updates.append)
    )
    await wait_until(lambda: bool(_own_children(title)), 60, "the probe's child to start")
    (pid,) = _own_children(title)

    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe

    assert _process_gone(pid)
    assert [u.probe_state for u in updates] == [
        common_pb2.PROBE_STATE_PREPARING,
        common_pb2.PROBE_STATE_LOADING,
        common_pb2.PROBE_STATE_CANCELLED,
    ]
    assert list(verified_root.iterdir()) == []


# ---- through the real control plane ---------------------------------------------------------


async def _ended_probe(harness: Harness, probe_id: str, state: int) -> cp.RuntimeProbe:
    latest: list[cp.RuntimeProbe] = []

    async def reached() -> bool:
        latest[:] = [
            await harness.operator.GetProbe(
                cp.GetProbeRequest(probe_id=probe_id), metadata=harness.op_md
            )
        ]
        return latest[0].state == state

    await wait_for(reached, timeout=120, what=f"probe state {state}", last=latest)
    return latest[0]


async def _profiled(harness: Harness, source: Path) -> cp.RuntimeProfile:
    artifact = await harness.register_model(source, "tiny")
    pending = await harness.operator.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=artifact.artifact_set_id),
        metadata=harness.op_md,
    )
    latest = [pending]

    async def assessed() -> bool:
        latest[0] = await harness.operator.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=pending.assessment_id), metadata=harness.op_md
        )
        return latest[0].state != cp.ASSESSMENT_STATE_PENDING

    await wait_for(assessed, timeout=60, what="the assessment", last=latest)
    assessment = latest[0]
    assert assessment.state == cp.ASSESSMENT_STATE_COMPLETED, assessment
    assert assessment.compatible and assessment.inspection.executable
    assert list(assessment.inspection.adapters) == ["sentence_transformers"]
    return await harness.operator.CreateRuntimeProfile(
        cp.CreateRuntimeProfileRequest(
            assessment_id=assessment.assessment_id,
            name="tiny-cpu",
            adapter=common_pb2.AdapterSettings(adapter="sentence_transformers", device="cpu"),
        ),
        metadata=harness.op_md,
    )


async def test_a_real_worker_takes_a_probe_from_the_control_plane_to_a_lab_ready_candidate(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        agent = await harness.start_worker(await harness.register_node("lab"))
        profile = await _profiled(harness, tiny_model_dir)
        started = await harness.operator.StartProbe(
            cp.StartProbeRequest(profile_id=profile.profile_id), metadata=harness.op_md
        )
        probe = await _ended_probe(harness, started.probe_id, common_pb2.PROBE_STATE_COMPLETED)
        evidence = probe.evidence
        assert evidence.reclaim.reclaimed and evidence.reclaim.reaped
        assert _process_gone(evidence.reclaim.pid)
        assert evidence.health.capability.detail == "NOT_ROUTED"
        assert evidence.memory.nvml_process_used.unavailable
        candidate = await harness.operator.GetDeploymentCandidate(
            cp.GetDeploymentCandidateRequest(candidate_id=probe.candidate_id),
            metadata=harness.op_md,
        )
        assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY, candidate
        assert candidate.production is False
        assert len(agent.residents) == 0  # a probe's host never became a resident
        await harness.stop_worker(agent)


async def test_cancel_probe_through_the_control_plane_kills_the_child_on_the_worker(
    sqlite_url: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(sqlite_url, root) as harness:
        agent = await harness.start_worker(await harness.register_node("lab"))
        profile = await _profiled(harness, tiny_model_dir)
        started = await harness.operator.StartProbe(
            cp.StartProbeRequest(profile_id=profile.profile_id), metadata=harness.op_md
        )
        title = f"gantry model-host probe-{started.probe_id}"
        # The host itself: the worker (this process) is its parent.
        await wait_until(
            lambda: bool(pids_titled(title, parent=os.getpid())), 60, "the probe's child to start"
        )
        (pid,) = pids_titled(title, parent=os.getpid())
        # The worker renews the probe's lease: its job is active there.
        assert len(agent.active_job_ids()) == 1
        await harness.operator.CancelProbe(
            cp.CancelProbeRequest(probe_id=started.probe_id), metadata=harness.op_md
        )
        await _ended_probe(harness, started.probe_id, common_pb2.PROBE_STATE_CANCELLED)
        await wait_until(lambda: _process_gone(pid), 15, "the probe's child to be reaped")
        await wait_until(lambda: agent.active_job_ids() == [], 15, "the job to end")
        await harness.stop_worker(agent)
