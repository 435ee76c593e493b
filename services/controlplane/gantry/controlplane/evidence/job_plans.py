"""What an INSPECT's or a PROBE's committed result means for its assessment or probe. Pure.

evidence/jobs.py reads the snapshot and applies the returned actions (jobs/executor.py) in the
result's transaction. A result for a record something else ended first (its node was lost)
changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from gantry.controlplane.evidence.candidate_rules import judge_evidence
from gantry.controlplane.jobs import actions as act
from gantry.v1 import common_pb2
from gantry.v1 import worker_gateway_pb2 as wg


@dataclass(frozen=True, slots=True, kw_only=True)
class InspectResultSnapshot:
    assessment_id: str
    pending: bool  # still PENDING: nothing else ended it first
    asked_environment_id: str
    result: wg.JobResult


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResultSnapshot:
    probe_id: str
    ended: bool  # already COMPLETED, FAILED or CANCELLED
    profile_id: str
    artifact_set_id: str
    node_id: str  # whose worker answered (the audit's actor)
    result: wg.JobResult


def as_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _measured(measurement: common_pb2.Measurement) -> int | None:
    return measurement.bytes if measurement.WhichOneof("value") == "bytes" else None


def measured_vram_peak(memory: wg.MemoryEvidence) -> int | None:
    """A probe's device-memory peak: the larger of NVML's figure for the host's process (read
    after the worst-case pass; it holds the CUDA context and what the caching allocator reserved)
    and the allocator's own peak (what tensors held at most, which NVML may have missed); None
    when neither was measured."""
    readings = [
        reading
        for reading in (_measured(memory.nvml_process_used), _measured(memory.cuda_peak_allocated))
        if reading is not None
    ]
    return max(readings) if readings else None


def _failure(result: wg.JobResult, *, answered: str) -> tuple[str, str]:
    """(reason, message) of a result that carries no evidence: the worker's typed failure, or
    INTERNAL saying what it `answered` instead."""
    if result.WhichOneof("outcome") == "failure":
        return result.failure.reason or "INTERNAL", result.failure.message
    return "INTERNAL", answered


def inspection_verdict(
    evidence: wg.InspectEvidence, *, asked_environment_id: str
) -> tuple[bool, str, str]:
    """(compatible, failure reason, failure message) of a completed inspection.

    Compatible only when some adapter can execute the artifact in the environment that was asked
    for (an empty environment id asks for the worker's default, whatever it is named).
    """
    inspection = evidence.inspection
    inspected = evidence.environment_id or "default"  # workers name their default "default"
    if asked_environment_id and inspected != asked_environment_id:
        return (
            False,
            "RUNTIME_ENVIRONMENT_UNAVAILABLE",
            f"the worker inspected environment {evidence.environment_id!r}, "
            f"not {asked_environment_id!r}",
        )
    if inspection.executable and inspection.adapters:
        return True, "", ""
    finding = next((f for f in inspection.findings if f.reason), None)
    if finding is not None:
        where = f" ({finding.path})" if finding.path else ""
        return False, finding.reason, f"{finding.message}{where}"
    return (
        False,
        "RUNTIME_INCOMPATIBLE",
        f"no adapter can execute this {inspection.inspector or 'artifact'} here",
    )


def plan_inspect_result(snapshot: InspectResultSnapshot) -> tuple[act.Action, ...]:
    if not snapshot.pending:
        return ()  # ended by something else first (its node was lost); the result changes nothing
    result = snapshot.result
    outcome = result.WhichOneof("outcome")
    if outcome == "inspect":
        compatible, reason, message = inspection_verdict(
            result.inspect, asked_environment_id=snapshot.asked_environment_id
        )
        return (
            act.CompleteAssessment(
                assessment_id=snapshot.assessment_id,
                compatible=compatible,
                inspection=as_json(result.inspect.inspection),
                environment_fingerprint=result.inspect.environment_fingerprint,
                reason=reason,
                message=message,
            ),
        )
    reason, message = _failure(result, answered=f"an INSPECT job answered with {outcome!r}")
    return (
        act.FailAssessment(assessment_id=snapshot.assessment_id, reason=reason, message=message),
    )


def plan_probe_result(snapshot: ProbeResultSnapshot) -> tuple[act.Action, ...]:
    if snapshot.ended:
        return ()
    result = snapshot.result
    outcome = result.WhichOneof("outcome")
    if outcome != "probe":
        reason, message = _failure(result, answered=f"a PROBE job answered with {outcome!r}")
        return (act.FailProbe(probe_id=snapshot.probe_id, reason=reason, message=message),)
    evidence = result.probe
    status, reasons = judge_evidence(evidence)
    return (
        act.RecordProbeEvidence(
            probe_id=snapshot.probe_id,
            profile_id=snapshot.profile_id,
            artifact_set_id=snapshot.artifact_set_id,
            status=status,
            reasons=tuple(reasons),
            evidence=as_json(evidence),
            ram_peak_bytes=_measured(evidence.memory.rss_peak),
            vram_peak_bytes=measured_vram_peak(evidence.memory),
            actor=f"node:{snapshot.node_id}",
        ),
    )
