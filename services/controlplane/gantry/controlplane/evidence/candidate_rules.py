"""Whether a probe's evidence makes a LAB_READY candidate, and if not, every reason why. Pure.

LAB_READY only when the process, runtime and model health layers are OK, the output is finite and
non-empty, the child was kept to local bytes (local_files_only, no remote code declared, and
none observed: no module imported from outside its interpreter, no weight file read from outside
its verified copy) and its reclaim succeeded (it exited, was reaped, and left no device memory
behind). Anything else is REJECTED with one line per failed check, so an operator reads what to
fix rather than a bare verdict.
"""

from __future__ import annotations

from gantry.controlplane.evidence.pipeline_states import CandidateStatus
from gantry.v1 import worker_gateway_pb2 as wg

_HEALTH_LAYERS = ("process", "runtime", "model")


def _layer_problem(name: str, layer: wg.HealthLayer) -> str | None:
    if layer.status == wg.HEALTH_STATUS_OK:
        return None
    status = wg.HealthStatus.Name(layer.status).removeprefix("HEALTH_STATUS_")
    detail = f": {layer.detail}" if layer.detail else ""
    return f"{name} health is {status}{detail}"


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown if len(names) <= 5 else f"{shown} and {len(names) - 5} more"


def _offline_problems(offline: wg.OfflineEvidence) -> list[str]:
    """What the adapter declared, then what the child observed of itself."""
    problems = []
    if not offline.local_files_only:
        problems.append("the model was not loaded with local_files_only")
    if offline.trust_remote_code:
        problems.append("the model was loaded with trust_remote_code")
    if offline.remote_code_modules:
        problems.append(
            "the child imported code from outside its interpreter: "
            + _listed(list(offline.remote_code_modules))
        )
    if offline.weight_files_outside_copy:
        problems.append(
            "the child read weight files outside its verified copy: "
            + _listed(list(offline.weight_files_outside_copy))
        )
    return problems


def judge_evidence(evidence: wg.ProbeEvidence) -> tuple[CandidateStatus, list[str]]:
    """(LAB_READY, []) or (REJECTED, reasons in words), from the evidence alone."""
    reasons: list[str] = []
    for name in _HEALTH_LAYERS:
        problem = _layer_problem(name, getattr(evidence.health, name))
        if problem is not None:
            reasons.append(problem)
    shape = list(evidence.output_shape)
    if not shape or any(size == 0 for size in shape):
        reasons.append(f"the output is empty (shape {shape})")
    if not evidence.output_finite:
        reasons.append("the output is not finite (NaN or infinity)")
    reasons += _offline_problems(evidence.offline)
    reclaim = evidence.reclaim
    if not reclaim.reclaimed:
        detail = f": {reclaim.detail}" if reclaim.detail else ""
        reasons.append(f"reclaim was not verified{detail}")
    if reasons:
        return CandidateStatus.REJECTED, reasons
    return CandidateStatus.LAB_READY, []
