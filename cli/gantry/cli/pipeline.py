"""Walking the evidence pipeline's gates from the CLI: start a gate, wait for it, say what it found.

`gantry up` walks every gate for the bundled model with these; the `assess`, `profile`, `probe`,
`approve` and `deploy` commands each walk one. Waiting polls the Get RPC (the control plane keeps
the truth) and says every state change, so a long probe shows progress rather than silence.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gantry.cli.connection import Metadata
from gantry.cli.errors import CliError
from gantry.cli.tables import enum_label, format_bytes
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc
from gantry.v1 import worker_gateway_pb2 as wg

Say = Callable[[str], None]
Stub = control_plane_pb2_grpc.ControlPlaneStub
TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.5
REMIND_EVERY_S = 5.0

_PROBE_TERMINAL = (
    common_pb2.PROBE_STATE_COMPLETED,
    common_pb2.PROBE_STATE_FAILED,
    common_pb2.PROBE_STATE_CANCELLED,
)


def assessment_state(assessment: control_plane_pb2.CompatibilityAssessment) -> str:
    return enum_label(control_plane_pb2.AssessmentState.Name(assessment.state), "ASSESSMENT_STATE_")


def probe_state(probe: control_plane_pb2.RuntimeProbe) -> str:
    return enum_label(common_pb2.ProbeState.Name(probe.state), "PROBE_STATE_")


def candidate_status(candidate: control_plane_pb2.DeploymentCandidate) -> str:
    return enum_label(control_plane_pb2.CandidateStatus.Name(candidate.status), "CANDIDATE_STATUS_")


def _failure(failure: common_pb2.Failure) -> str:
    return f"{failure.reason}: {failure.message}" if failure.reason else "no reason recorded"


class _Waiter:
    """Says each new state, and a reminder every few seconds while nothing changes."""

    def __init__(self, what: str, say: Say, timeout_s: float) -> None:
        self._what, self._say, self._timeout_s = what, say, timeout_s
        self._started = time.monotonic()
        self._last_state: str | None = None
        self._last_said = self._started

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def tick(self, state: str) -> None:
        now = time.monotonic()
        if state != self._last_state or now - self._last_said >= REMIND_EVERY_S:
            self._say(f"{self._what}: {state} ({self.elapsed_s:.0f}s)")
            self._last_state, self._last_said = state, now
        if self.elapsed_s >= self._timeout_s:
            raise CliError(f"{self._what} is still {state} after {self._timeout_s:g}s")
        time.sleep(POLL_INTERVAL_S)


def assess(
    stub: Stub,
    metadata: Metadata,
    *,
    artifact_set_id: str,
    node_id: str = "",
    environment_id: str = "",
    say: Say,
    timeout_s: float,
    wait: bool = True,
) -> control_plane_pb2.CompatibilityAssessment:
    """Start an assessment and (by default) wait until its INSPECT job reported."""
    assessment = stub.AssessCompatibility(
        control_plane_pb2.AssessCompatibilityRequest(
            artifact_set_id=artifact_set_id, node_id=node_id, environment_id=environment_id
        ),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    say(f"assessment {assessment.assessment_id} started on node {assessment.node_id}")
    if not wait:
        return assessment
    waiter = _Waiter(f"assessment {assessment.assessment_id}", say, timeout_s)
    request = control_plane_pb2.GetAssessmentRequest(assessment_id=assessment.assessment_id)
    while assessment.state == control_plane_pb2.ASSESSMENT_STATE_PENDING:
        waiter.tick(assessment_state(assessment))
        assessment = stub.GetAssessment(request, metadata=metadata, timeout=TIMEOUT_S)
    return assessment


def require_compatible(assessment: control_plane_pb2.CompatibilityAssessment) -> None:
    if assessment.state == control_plane_pb2.ASSESSMENT_STATE_FAILED:
        raise CliError(
            f"assessment {assessment.assessment_id} FAILED ({_failure(assessment.failure)})"
        )
    if not assessment.compatible:
        raise CliError(
            f"assessment {assessment.assessment_id}: not compatible"
            f" ({_failure(assessment.failure)})"
        )


def run_probe(
    stub: Stub,
    metadata: Metadata,
    *,
    profile_id: str,
    node_id: str = "",
    say: Say,
    timeout_s: float,
    wait: bool = True,
) -> control_plane_pb2.RuntimeProbe:
    """Start a probe and (by default) wait for a terminal state, saying each stage it enters."""
    probe = stub.StartProbe(
        control_plane_pb2.StartProbeRequest(profile_id=profile_id, node_id=node_id),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    say(f"probe {probe.probe_id} started on node {probe.node_id}")
    if not wait:
        return probe
    waiter = _Waiter(f"probe {probe.probe_id}", say, timeout_s)
    request = control_plane_pb2.GetProbeRequest(probe_id=probe.probe_id)
    while probe.state not in _PROBE_TERMINAL:
        waiter.tick(probe_state(probe))
        probe = stub.GetProbe(request, metadata=metadata, timeout=TIMEOUT_S)
    say(f"probe {probe.probe_id}: {probe_state(probe)} ({waiter.elapsed_s:.1f}s)")
    return probe


def require_lab_ready(
    stub: Stub, metadata: Metadata, probe: control_plane_pb2.RuntimeProbe
) -> control_plane_pb2.DeploymentCandidate:
    if probe.state != common_pb2.PROBE_STATE_COMPLETED:
        raise CliError(
            f"probe {probe.probe_id} is {probe_state(probe)} ({_failure(probe.failure)})"
        )
    candidate = stub.GetDeploymentCandidate(
        control_plane_pb2.GetDeploymentCandidateRequest(candidate_id=probe.candidate_id),
        metadata=metadata,
        timeout=TIMEOUT_S,
    )
    if candidate.status != control_plane_pb2.CANDIDATE_STATUS_LAB_READY:
        raise CliError(
            f"candidate {candidate.candidate_id} is {candidate_status(candidate)}: "
            + "; ".join(candidate.reasons)
        )
    return candidate


# ---- showing evidence ----------------------------------------------------------------------


def measurement(value: common_pb2.Measurement) -> str:
    """`312.4 MiB (VmRSS)`, or `UNAVAILABLE (why)`: an absent reading is never shown as zero."""
    kind = value.WhichOneof("value")
    if kind == "bytes":
        source = f" ({value.source})" if value.source else ""
        return f"{format_bytes(value.bytes)}{source}"
    if kind == "unavailable":
        return f"UNAVAILABLE ({value.unavailable})"
    return "not reported"


def _layer(name: str, layer: wg.HealthLayer) -> str:
    status = enum_label(wg.HealthStatus.Name(layer.status), "HEALTH_STATUS_")
    return f"{name} {status}" + (f" ({layer.detail})" if layer.detail else "")


def _reclaim(reclaim: wg.ReclaimEvidence) -> str:
    if not reclaim.process_exited:
        ended = "has NOT exited"
    elif reclaim.has_exit_code:
        ended = f"exited with code {reclaim.exit_code}"
    else:
        ended = f"was ended by signal {reclaim.exit_signal}"
    reaped = "reaped" if reclaim.reaped else "NOT reaped"
    verdict = "memory reclaimed" if reclaim.reclaimed else "reclaim NOT verified"
    detail = f" ({reclaim.detail})" if reclaim.detail else ""
    return f"pid {reclaim.pid} {ended}, {reaped}; {verdict}{detail}"


_MEMORY_ROWS = (
    ("process rss now", "rss_current"),
    ("process rss peak", "rss_peak"),
    ("cuda allocated before load", "cuda_allocated_before_load"),
    ("cuda allocated after load", "cuda_allocated_after_load"),
    ("cuda reserved after load", "cuda_reserved_after_load"),
    ("cuda peak allocated", "cuda_peak_allocated"),
    ("cuda allocated after unload", "cuda_allocated_after_unload"),
    ("nvml device total", "nvml_device_total"),
    ("nvml device used", "nvml_device_used"),
    ("nvml process used", "nvml_process_used"),
)


def describe_probe(
    probe: control_plane_pb2.RuntimeProbe,
    candidate: control_plane_pb2.DeploymentCandidate | None = None,
) -> list[str]:
    """The probe and its evidence, one fact per line, for `gantry probe show`."""
    lines = [
        f"probe        {probe.probe_id}",
        f"state        {probe_state(probe)} (attempt {probe.attempt_count})",
        f"profile      {probe.profile_id}",
        f"node         {probe.node_id}",
    ]
    if probe.failure.reason:
        lines.append(f"failure      {_failure(probe.failure)}")
    if probe.HasField("evidence"):
        lines.extend(_evidence_lines(probe.evidence))
    else:
        lines.append("evidence     none reported yet")
    if candidate is not None:
        production = "true" if candidate.production else "false"
        lines.append(
            f"candidate    {candidate.candidate_id} {candidate_status(candidate)}"
            f" (production={production})"
        )
        lines.extend(f"  rejected:  {reason}" for reason in candidate.reasons)
        if candidate.approval_id:
            lines.append(f"approval     {candidate.approval_id}")
    return lines


def _evidence_lines(evidence: wg.ProbeEvidence) -> list[str]:
    versions = evidence.runtime_versions
    runtime = ", ".join(f"{name} {versions[name]}" for name in sorted(versions))
    offline = evidence.offline
    output = "x".join(str(n) for n in evidence.output_shape) or "none"
    health = evidence.health
    lines = [
        f"adapter      {evidence.adapter or '-'}",
        f"runtime      {runtime or 'not reported'}",
        f"environment  {evidence.environment_id or 'default'}"
        f" (fingerprint {evidence.environment_fingerprint[:16] or '-'})",
        f"verified     {evidence.files_verified} files, {format_bytes(evidence.bytes_verified)}",
        f"offline      local_files_only={str(offline.local_files_only).lower()}"
        f" trust_remote_code={str(offline.trust_remote_code).lower()}"
        f" network_guard={str(offline.network_guard).lower()}",
        f"isolation    {offline.isolation or 'not reported'}"
        + (f" ({offline.isolation_reason})" if offline.isolation_reason else ""),
        f"timings      load {evidence.load_seconds:.2f}s,"
        f" first invoke {evidence.first_invoke_seconds * 1000:.1f}ms",
        f"output       shape {output}, {'finite' if evidence.output_finite else 'NOT finite'}",
        "health       "
        + ", ".join(
            _layer(name, getattr(health, name))
            for name in ("process", "runtime", "model", "capability")
        ),
        "memory",
    ]
    lines.extend(
        f"  {label:<28} {measurement(getattr(evidence.memory, field))}"
        for label, field in _MEMORY_ROWS
    )
    lines.append(f"reclaim      {_reclaim(evidence.reclaim)}")
    return lines


def describe_assessment(assessment: control_plane_pb2.CompatibilityAssessment) -> list[str]:
    inspection = assessment.inspection
    lines = [
        f"assessment   {assessment.assessment_id}",
        f"state        {assessment_state(assessment)}",
        f"artifact set {assessment.artifact_set_id}",
        f"node         {assessment.node_id}",
        f"environment  {assessment.environment_id or 'default'}"
        f" (fingerprint {assessment.environment_fingerprint[:16] or '-'})",
    ]
    if assessment.state == control_plane_pb2.ASSESSMENT_STATE_COMPLETED:
        lines += [
            f"compatible   {'yes' if assessment.compatible else 'NO'}",
            f"inspector    {inspection.inspector or '-'}"
            f" (model type {inspection.model_type or '-'}, task {inspection.task or '-'})",
            f"modalities   {', '.join(inspection.modalities) or '-'}",
            f"weights      {inspection.weight_format or '-'}",
            f"adapters     {', '.join(inspection.adapters) or 'none can run it here'}",
        ]
        lines.extend(
            f"  finding:   {finding.reason or 'note'}: {finding.message}"
            + (f" [{finding.path}]" if finding.path else "")
            for finding in inspection.findings
        )
    if assessment.failure.reason:
        lines.append(f"failure      {_failure(assessment.failure)}")
    return lines
