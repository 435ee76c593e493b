"""The writes a plan may ask for: one frozen dataclass per kind of write. Pure, no IO.

A reconciler step or a job-result handler reads a snapshot, a pure `plan_*` function turns it
into a tuple of these, and `jobs/executor.py` applies the tuple inside the caller's transaction.
An action names its rows by id and carries every value it writes, so a plan is tested by
comparing tuples. Each is named after its write; what is announced after the commit is not an
action (the step that ran the executor records what it reports changed as domain events).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from gantry.controlplane.evidence.candidate_rules import CandidateStatus
from gantry.controlplane.nodes.liveness import Heard
from gantry.controlplane.platform.state_machines import DeploymentState, ResidencyState

# Where a deployment still waits for its first load: only there does a load's failure say what
# becomes of it (a READY one keeps serving from its other replicas).
BEFORE_FIRST_LOAD = frozenset({DeploymentState.PENDING, DeploymentState.LOADING})


# ---- residencies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkResidency:
    """Move a residency to `state`. `reason` None leaves its last failure as it is (an empty
    string clears it); `pid` None leaves the recorded process id as it is."""

    residency_id: str
    state: ResidencyState
    reason: str | None = None
    message: str = ""
    pid: int | None = None


def mark_cold(residency_id: str, *, reason: str, message: str) -> MarkResidency:
    """COLD with no process: what ran there is gone (or never started), and why
    (the plans' twin of deployments/residency_stop.mark_cold)."""
    return MarkResidency(
        residency_id=residency_id,
        state=ResidencyState.COLD,
        reason=reason,
        message=message,
        pid=0,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkResident:
    """RESIDENT with what the worker loaded (a load's result), its failures and restarts cleared."""

    residency_id: str
    pid: int
    generation: int
    artifact_digest: str
    adapter_digest: str
    environment_fingerprint: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLoad:
    """COLD -> LOADING with a LOAD job on the residency's node."""

    deployment_id: str
    residency_id: str
    node_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueUnload:
    """An UNLOAD job for the residency on its node (its state is left as it is)."""

    residency_id: str
    node_id: str


# ---- deployments ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SetLoadFailures:
    deployment_id: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Settle:
    """Bring the deployment's state in line with its residencies (deployments/settle.py)."""

    deployment_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SetDeploymentState:
    """One compare-and-set of the deployment's state. `state` None keeps the state it has (to
    record a failure reason on it). With `only_from`, the row is read again first and nothing is
    written unless it is in one of those states (an earlier action in the same plan, a settle,
    may have moved it)."""

    deployment_id: str
    state: DeploymentState | None
    reason: str = ""
    message: str = ""
    only_from: frozenset[DeploymentState] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FailDeployment:
    """Walk the deployment to FAILED with why, under the same `only_from` guard."""

    deployment_id: str
    reason: str
    message: str
    only_from: frozenset[DeploymentState] | None = None


# ---- nodes and jobs -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DisconnectNode:
    """DISCONNECTED (and its deployments settled). `last_seen_at` None leaves the row's; `heard`
    is the silent stream the decision rests on, which liveness forgets after the commit."""

    node_id: str
    last_seen_at: dt.datetime | None = None
    heard: Heard | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelJob:
    job_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class AbandonPipelineJobs:
    """Cancel the node's unfinished INSPECT and PROBE jobs and FAIL what they served."""

    node_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Audit:
    """One audit event, committed with the change it describes."""

    actor: str
    action: str
    subject_kind: str
    subject_id: str
    detail: tuple[tuple[str, str], ...] = ()


# ---- the evidence pipeline ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteAssessment:
    assessment_id: str
    compatible: bool
    inspection: dict[str, Any]
    environment_fingerprint: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FailAssessment:
    assessment_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FailProbe:
    probe_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordProbeEvidence:
    """The probe's candidate (judged), the probe COMPLETED with its evidence, the profile's
    measured peaks raised, and the candidate's audit event: one write of the four, since the
    later ones name the candidate the first creates."""

    probe_id: str
    profile_id: str
    artifact_set_id: str
    status: CandidateStatus
    reasons: tuple[str, ...]
    evidence: dict[str, Any]
    ram_peak_bytes: int | None
    vram_peak_bytes: int | None
    actor: str


Action = (
    MarkResidency
    | MarkResident
    | QueueLoad
    | QueueUnload
    | SetLoadFailures
    | Settle
    | SetDeploymentState
    | FailDeployment
    | DisconnectNode
    | CancelJob
    | AbandonPipelineJobs
    | Audit
    | CompleteAssessment
    | FailAssessment
    | FailProbe
    | RecordProbeEvidence
)
