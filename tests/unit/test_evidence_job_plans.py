"""What an INSPECT's or a PROBE's result plans (evidence/job_plans.py)."""

from __future__ import annotations

from gantry.controlplane.evidence.candidate_rules import CandidateStatus, judge_evidence
from gantry.controlplane.evidence.job_plans import (
    InspectResultSnapshot,
    ProbeResultSnapshot,
    as_json,
    plan_inspect_result,
    plan_probe_result,
)
from gantry.controlplane.jobs import actions as act
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg


def inspect(
    result: wg.JobResult, *, pending: bool = True, asked: str = ""
) -> InspectResultSnapshot:
    return InspectResultSnapshot(
        assessment_id="a1", pending=pending, asked_environment_id=asked, result=result
    )


def probe(result: wg.JobResult, *, ended: bool = False) -> ProbeResultSnapshot:
    return ProbeResultSnapshot(
        probe_id="p1",
        ended=ended,
        profile_id="pf1",
        artifact_set_id="as1",
        node_id="n1",
        result=result,
    )


EXECUTABLE = wg.JobResult(
    inspect=wg.InspectEvidence(
        inspection=wg.Inspection(inspector="transformers", adapters=["x"], executable=True),
        environment_id="default",
        environment_fingerprint="fp",
    )
)


def test_an_executable_inspection_completes_the_assessment_compatible():
    assert plan_inspect_result(inspect(EXECUTABLE)) == (
        act.CompleteAssessment(
            assessment_id="a1",
            compatible=True,
            inspection=as_json(EXECUTABLE.inspect.inspection),
            environment_fingerprint="fp",
            reason="",
            message="",
        ),
    )


def test_an_inspection_of_another_environment_completes_it_incompatible():
    (planned,) = plan_inspect_result(inspect(EXECUTABLE, asked="vision"))
    assert isinstance(planned, act.CompleteAssessment)
    assert (planned.compatible, planned.reason) == (False, "RUNTIME_ENVIRONMENT_UNAVAILABLE")


def test_an_inspection_nothing_can_run_names_the_first_finding():
    result = wg.JobResult(
        inspect=wg.InspectEvidence(
            inspection=wg.Inspection(
                findings=[wg.InspectionFinding(reason="RUNTIME_INCOMPATIBLE", message="auto_map")]
            )
        )
    )
    (planned,) = plan_inspect_result(inspect(result))
    assert isinstance(planned, act.CompleteAssessment)
    assert (planned.compatible, planned.reason, planned.message) == (
        False,
        "RUNTIME_INCOMPATIBLE",
        "auto_map",
    )


def test_an_inspect_failure_fails_the_assessment_with_the_workers_reason_or_internal():
    failed = wg.JobResult(failure=common_pb2.Failure(reason="ARTIFACT_MISMATCH", message="sha"))
    assert plan_inspect_result(inspect(failed)) == (
        act.FailAssessment(assessment_id="a1", reason="ARTIFACT_MISMATCH", message="sha"),
    )
    unnamed = wg.JobResult(failure=common_pb2.Failure(message="?"))
    assert plan_inspect_result(inspect(unnamed))[0] == act.FailAssessment(
        assessment_id="a1", reason="INTERNAL", message="?"
    )


def test_an_inspect_answered_with_another_outcome_fails_as_internal():
    assert plan_inspect_result(inspect(wg.JobResult(probe=wg.ProbeEvidence()))) == (
        act.FailAssessment(
            assessment_id="a1", reason="INTERNAL", message="an INSPECT job answered with 'probe'"
        ),
    )


def test_an_inspect_result_for_an_assessment_already_ended_changes_nothing():
    assert plan_inspect_result(inspect(EXECUTABLE, pending=False)) == ()


def test_probe_evidence_records_its_judged_candidate_and_the_measured_peaks():
    evidence = wg.ProbeEvidence(
        output_shape=[1, 4],
        output_finite=True,
        memory=wg.MemoryEvidence(
            rss_peak=common_pb2.Measurement(bytes=1000),
            cuda_peak_allocated=common_pb2.Measurement(unavailable="no CUDA"),
        ),
    )
    status, reasons = judge_evidence(evidence)
    assert plan_probe_result(probe(wg.JobResult(probe=evidence))) == (
        act.RecordProbeEvidence(
            probe_id="p1",
            profile_id="pf1",
            artifact_set_id="as1",
            status=status,
            reasons=tuple(reasons),
            evidence=as_json(evidence),
            ram_peak_bytes=1000,
            vram_peak_bytes=None,
            actor="node:n1",
        ),
    )
    assert status is CandidateStatus.REJECTED  # no health layer reported OK


def test_a_probe_failure_or_a_wrong_outcome_fails_the_probe():
    failed = wg.JobResult(failure=common_pb2.Failure(reason="LOAD_FAILED", message="oom"))
    assert plan_probe_result(probe(failed)) == (
        act.FailProbe(probe_id="p1", reason="LOAD_FAILED", message="oom"),
    )
    assert plan_probe_result(probe(EXECUTABLE)) == (
        act.FailProbe(
            probe_id="p1", reason="INTERNAL", message="a PROBE job answered with 'inspect'"
        ),
    )


def test_a_probe_result_for_a_probe_already_ended_changes_nothing():
    assert plan_probe_result(probe(EXECUTABLE, ended=True)) == ()
