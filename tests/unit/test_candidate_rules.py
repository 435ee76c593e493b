"""A probe's evidence -> LAB_READY or REJECTED with every reason (evidence/candidate_rules.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gantry.controlplane.evidence.candidate_rules import judge_evidence
from gantry.controlplane.evidence.pipeline_states import CandidateStatus
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def healthy() -> wg.ProbeEvidence:
    ok = wg.HealthLayer(status=wg.HEALTH_STATUS_OK)
    return wg.ProbeEvidence(
        output_shape=[1, 384],
        output_finite=True,
        health=wg.HealthReport(
            process=ok,
            runtime=ok,
            model=ok,
            capability=wg.HealthLayer(status=wg.HEALTH_STATUS_NOT_CHECKED, detail="NOT_ROUTED"),
        ),
        offline=wg.OfflineEvidence(local_files_only=True, trust_remote_code=False),
        memory=wg.MemoryEvidence(
            rss_peak=common_pb2.Measurement(bytes=1 << 28),
            cuda_peak_allocated=common_pb2.Measurement(unavailable="CUDA is not available"),
        ),
        reclaim=wg.ReclaimEvidence(process_exited=True, reaped=True, reclaimed=True),
    )


def test_healthy_offline_reclaimed_evidence_is_lab_ready() -> None:
    assert judge_evidence(healthy()) == (CandidateStatus.LAB_READY, [])


def _model_failed(e: wg.ProbeEvidence) -> None:
    e.health.model.CopyFrom(wg.HealthLayer(status=wg.HEALTH_STATUS_FAILED, detail="NaN output"))


def _process_unchecked(e: wg.ProbeEvidence) -> None:
    e.health.process.status = wg.HEALTH_STATUS_NOT_CHECKED


def _runtime_missing(e: wg.ProbeEvidence) -> None:
    e.health.ClearField("runtime")


def _empty_output(e: wg.ProbeEvidence) -> None:
    del e.output_shape[:]


def _zero_rows(e: wg.ProbeEvidence) -> None:
    e.output_shape[:] = [0, 384]


def _not_finite(e: wg.ProbeEvidence) -> None:
    e.output_finite = False


def _not_local(e: wg.ProbeEvidence) -> None:
    e.offline.local_files_only = False


def _remote_code(e: wg.ProbeEvidence) -> None:
    e.offline.trust_remote_code = True


def _imported_model_code(e: wg.ProbeEvidence) -> None:
    e.offline.remote_code_modules[:] = [f"transformers_modules.m{i}" for i in range(7)]


def _foreign_weights(e: wg.ProbeEvidence) -> None:
    e.offline.weight_files_outside_copy[:] = ["/root/.cache/huggingface/hub/model.safetensors"]


def _no_offline_evidence(e: wg.ProbeEvidence) -> None:
    e.ClearField("offline")


def _not_reclaimed(e: wg.ProbeEvidence) -> None:
    e.reclaim.reclaimed = False
    e.reclaim.detail = "nvml still lists pid 5150"


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (_model_failed, "model health is FAILED: NaN output"),
        (_process_unchecked, "process health is NOT_CHECKED"),
        (_runtime_missing, "runtime health is UNSPECIFIED"),
        (_empty_output, "the output is empty (shape [])"),
        (_zero_rows, "the output is empty (shape [0, 384])"),
        (_not_finite, "the output is not finite (NaN or infinity)"),
        (_not_local, "the model was not loaded with local_files_only"),
        (_remote_code, "the model was loaded with trust_remote_code"),
        (
            _imported_model_code,
            "the child imported code from outside its interpreter: transformers_modules.m0, "
            "transformers_modules.m1, transformers_modules.m2, transformers_modules.m3, "
            "transformers_modules.m4 and 2 more",
        ),
        (
            _foreign_weights,
            "the child read weight files outside its verified copy: "
            "/root/.cache/huggingface/hub/model.safetensors",
        ),
        (_not_reclaimed, "reclaim was not verified: nvml still lists pid 5150"),
    ],
    ids=lambda value: value.__name__ if callable(value) else "",
)
def test_each_failed_check_rejects_with_its_reason(
    spoil: Callable[[wg.ProbeEvidence], None], expected: str
) -> None:
    evidence = healthy()
    spoil(evidence)
    assert judge_evidence(evidence) == (CandidateStatus.REJECTED, [expected])


def test_missing_offline_evidence_is_not_taken_as_local() -> None:
    evidence = healthy()
    _no_offline_evidence(evidence)
    status, reasons = judge_evidence(evidence)
    assert status is CandidateStatus.REJECTED
    assert reasons == ["the model was not loaded with local_files_only"]


def test_every_failed_check_is_listed_not_only_the_first() -> None:
    evidence = healthy()
    for spoil in (_model_failed, _not_finite, _remote_code, _not_reclaimed):
        spoil(evidence)
    status, reasons = judge_evidence(evidence)
    assert status is CandidateStatus.REJECTED
    assert len(reasons) == 4


def test_the_capability_layer_does_not_count_a_probe_is_never_routed() -> None:
    evidence = healthy()
    assert evidence.health.capability.status == wg.HEALTH_STATUS_NOT_CHECKED
    assert judge_evidence(evidence)[0] is CandidateStatus.LAB_READY
