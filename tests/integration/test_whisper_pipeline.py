"""A tiny Whisper through every gate of the evidence pipeline with a real worker and model host:
assessed (its inspection names `transformers_whisper`), profiled (language and task checked),
probed on a 1 s tone (a LAB_READY candidate with measured memory and verified reclaim), approved
and deployed to READY. An Embed or Rerank sent to it is a typed refusal from the host, and the
deployment stays READY and keeps answering (no crash, nothing for the breakers to count)."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from gantry.common.status import error_info_of
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import inference_pb2 as inf
from tests.integration.harness import Harness, running_gantry, wait_for

WHISPER = "transformers_whisper"
READY = cp.DEPLOYMENT_STATE_READY
ENDED = (
    common_pb2.PROBE_STATE_COMPLETED,
    common_pb2.PROBE_STATE_FAILED,
    common_pb2.PROBE_STATE_CANCELLED,
)


async def _refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    info = error_info_of(caught.value)
    return (
        caught.value.code(),
        info.reason if info else "",
        dict(info.metadata).get("field", "") if info else "",
    )


async def _assessed(harness: Harness, artifact_set_id: str) -> cp.CompatibilityAssessment:
    started = await harness.operator.AssessCompatibility(
        cp.AssessCompatibilityRequest(artifact_set_id=artifact_set_id), metadata=harness.op_md
    )
    latest: list[cp.CompatibilityAssessment] = [started]

    async def ended() -> bool:
        latest[0] = await harness.operator.GetAssessment(
            cp.GetAssessmentRequest(assessment_id=started.assessment_id), metadata=harness.op_md
        )
        return latest[0].state != cp.ASSESSMENT_STATE_PENDING

    await wait_for(ended, timeout=60, what="the assessment", last=latest)
    return latest[0]


async def _probed(harness: Harness, profile_id: str) -> cp.RuntimeProbe:
    started = await harness.operator.StartProbe(
        cp.StartProbeRequest(profile_id=profile_id), metadata=harness.op_md
    )
    latest: list[cp.RuntimeProbe] = [started]

    async def ended() -> bool:
        latest[0] = await harness.operator.GetProbe(
            cp.GetProbeRequest(probe_id=started.probe_id), metadata=harness.op_md
        )
        return latest[0].state in ENDED

    await wait_for(ended, timeout=120, what="the probe", last=latest)
    return latest[0]


def _profile(
    assessment_id: str, name: str, *, language: str = "", task: str = ""
) -> cp.CreateRuntimeProfileRequest:
    return cp.CreateRuntimeProfileRequest(
        assessment_id=assessment_id,
        name=name,
        adapter=common_pb2.AdapterSettings(
            adapter=WHISPER, device="cpu", language=language, task=task
        ),
    )


async def test_a_tiny_whisper_passes_every_gate_deploys_and_refuses_embeddings(
    database_url: str, tmp_path: Path, tiny_whisper_dir: Path
) -> None:
    root = tmp_path / "artifacts"
    root.mkdir()
    async with running_gantry(database_url, root) as harness:
        op, md = harness.operator, harness.op_md
        await harness.start_worker(await harness.register_node("speech"))
        artifact = await harness.register_model(tiny_whisper_dir, "whisper-tiny")

        assessment = await _assessed(harness, artifact.artifact_set_id)
        assert assessment.compatible, assessment
        inspection = assessment.inspection
        assert (inspection.inspector, inspection.model_type, inspection.task) == (
            "transformers",
            "whisper",
            "speech-recognition",
        )
        assert list(inspection.adapters) == [WHISPER] and inspection.executable
        assert inspection.details["sampling_rate"] == "16000"
        assert inspection.details["max_source_positions"] == "1500"

        # Settings a Whisper profile cannot hold: refused, naming the field; nothing created.
        for language, task, field in (
            ("en", "sing", "adapter.task"),
            ("english", "", "adapter.language"),
        ):
            refusal = await _refused(
                op.CreateRuntimeProfile(
                    _profile(assessment.assessment_id, "bad", language=language, task=task),
                    metadata=md,
                )
            )
            assert refusal == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", field)
        listed = await op.ListRuntimeProfiles(
            cp.ListRuntimeProfilesRequest(artifact_set_id=artifact.artifact_set_id), metadata=md
        )
        assert list(listed.profiles) == []

        profile = await op.CreateRuntimeProfile(
            _profile(assessment.assessment_id, "whisper-cpu", language="en", task="transcribe"),
            metadata=md,
        )
        probe = await _probed(harness, profile.profile_id)
        assert probe.state == common_pb2.PROBE_STATE_COMPLETED, probe
        evidence = probe.evidence
        # The tone's generated ids: a non-empty, finite 1-D output (no embedding width).
        assert len(evidence.output_shape) == 1 and evidence.output_shape[0] > 0
        assert evidence.output_finite
        # Observed by the child: its weights read from the verified copy alone, no model code.
        assert list(evidence.offline.weight_files) == ["model.safetensors"]
        assert not evidence.offline.weight_files_outside_copy
        assert not evidence.offline.remote_code_modules
        memory = evidence.memory
        assert memory.rss_peak.bytes > 0 and "VmHWM" in memory.rss_peak.source
        assert memory.rss_current.bytes > 0
        assert evidence.reclaim.reclaimed and evidence.reclaim.reaped
        candidate = await op.GetDeploymentCandidate(
            cp.GetDeploymentCandidateRequest(candidate_id=probe.candidate_id), metadata=md
        )
        assert candidate.status == cp.CANDIDATE_STATUS_LAB_READY, candidate
        refined = await op.GetRuntimeProfile(
            cp.GetRuntimeProfileRequest(profile_id=profile.profile_id), metadata=md
        )
        assert refined.ram_envelope_bytes >= memory.rss_peak.bytes  # measured, not estimated

        approval = await op.ApproveCandidate(
            cp.ApproveCandidateRequest(candidate_id=candidate.candidate_id, reason="tone probed"),
            metadata=md,
        )
        created = await harness.create_deployment(approval, "speech")
        assert created.adapter.adapter == WHISPER and created.adapter.task == "transcribe"
        ready = await harness.wait_deployment(created.deployment_id, READY, timeout=120)
        assert ready.residencies

        client = harness.client_md
        embed = inf.EmbedRequest(capability="speech", inputs=["hello"])
        rerank = inf.RerankRequest(capability="speech", query="q", documents=["d"])
        for _ in range(3):  # repeated: a refusal is not a fault the breakers count
            code, reason, _field = await _refused(harness.inference.Embed(embed, metadata=client))
            assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")
        code, reason, _field = await _refused(harness.inference.Rerank(rerank, metadata=client))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAYLOAD")
        still = await harness.deployment(created.deployment_id)
        assert still.state == READY
        assert [r.residency_id for r in still.residencies] == [
            r.residency_id for r in ready.residencies
        ]
