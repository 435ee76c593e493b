"""Every proto enum against its domain twin, the error reasons against CONTRACTS.md, and the
control plane's wire conversions round-tripping every state."""

from __future__ import annotations

import datetime as dt
import enum
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gantry.common.errors import REASONS
from gantry.controlplane.evidence.pipeline_states import AssessmentState, CandidateStatus
from gantry.controlplane.evidence.probe_transitions import ProbeState
from gantry.controlplane.platform import convert, models
from gantry.controlplane.platform.state_machines import (
    DeploymentState,
    JobState,
    JobType,
    NodeState,
    ResidencyState,
)
from gantry.v1 import common_pb2, control_plane_pb2, worker_gateway_pb2

# (domain enum, proto enum, prefix of the proto value names)
TWINS: list[tuple[type[enum.StrEnum], Any, str]] = [
    (ResidencyState, common_pb2.ResidencyState, "RESIDENCY_STATE_"),
    (NodeState, common_pb2.NodeState, "NODE_STATE_"),
    (DeploymentState, control_plane_pb2.DeploymentState, "DEPLOYMENT_STATE_"),
    (JobState, control_plane_pb2.ServingJobState, "SERVING_JOB_STATE_"),
    (JobType, control_plane_pb2.ServingJobType, "SERVING_JOB_TYPE_"),
    (JobState, worker_gateway_pb2.JobState, "JOB_STATE_"),
    (JobType, worker_gateway_pb2.JobType, "JOB_TYPE_"),
    (ProbeState, common_pb2.ProbeState, "PROBE_STATE_"),
    (AssessmentState, control_plane_pb2.AssessmentState, "ASSESSMENT_STATE_"),
    (CandidateStatus, control_plane_pb2.CandidateStatus, "CANDIDATE_STATUS_"),
]

# The reasons CONTRACTS.md lists, copied here so the test runs where the design docs are absent;
# where they are present, the copy must equal them.
CONTRACT_REASONS = {
    "ARTIFACT_PATH_INVALID",
    "ARTIFACT_MISMATCH",
    "RUNTIME_INCOMPATIBLE",
    "RUNTIME_ENVIRONMENT_UNAVAILABLE",
    "LOAD_FAILED",
    "HEALTH_FAILED",
    "INVOKE_FAILED",
    "RECLAIM_UNVERIFIED",
    "RUNTIME_CRASHED",
    "RUNTIME_OOM_KILLED",
    "RUNTIME_UNRESPONSIVE",
    "RUNTIME_CRASH_LOOP",
    "WORKER_UNAVAILABLE",
    "LEASE_EXPIRED",
    "LEASE_TOKEN_INVALID",
    "STALE_GENERATION",
    "NODE_DISABLED",
    "NOT_APPROVED",
    "DEPLOYMENT_NOT_READY",
    "NO_ELIGIBLE_NODE",
    "NO_CAPACITY",
    "QUEUE_FULL",
    "TENANT_QUOTA_EXCEEDED",
    "BUDGET_EXCEEDED",
    "CIRCUIT_OPEN",
    "INVALID_PAYLOAD",
    "INVALID_STATE_TRANSITION",
}
CONTRACTS_MD = Path(os.environ.get("GANTRY_CONTRACTS_MD", "/work/shared/design/CONTRACTS.md"))
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def wire_names(proto_enum: Any, prefix: str) -> set[str]:
    names = set(proto_enum.keys())
    assert all(name.startswith(prefix) for name in names), names
    return {name.removeprefix(prefix) for name in names} - {"UNSPECIFIED"}


def twin_id(twin: tuple[type[enum.StrEnum], Any, str]) -> str:
    return f"{twin[0].__name__}-{twin[2].rstrip('_')}"


@pytest.mark.parametrize("twin", TWINS, ids=twin_id)
def test_proto_enum_and_domain_enum_name_the_same_states(
    twin: tuple[type[enum.StrEnum], Any, str],
) -> None:
    domain, proto, prefix = twin
    domain_names = {member.value for member in domain}
    proto_names = wire_names(proto, prefix)
    assert domain_names - proto_names == set(), f"{domain.__name__} states missing from {prefix}*"
    assert proto_names - domain_names == set(), f"{prefix}* values missing from {domain.__name__}"
    assert proto.Value(f"{prefix}UNSPECIFIED") == 0


@pytest.mark.parametrize("twin", TWINS, ids=twin_id)
def test_enum_value_round_trips_every_member(twin: tuple[type[enum.StrEnum], Any, str]) -> None:
    domain, proto, prefix = twin
    for member in domain:
        wire = convert.enum_value(proto, prefix, member)
        assert wire != 0
        assert domain(proto.Name(wire).removeprefix(prefix)) is member


def _state_of(message: Any, proto: Any, prefix: str) -> str:
    return str(proto.Name(message.state).removeprefix(prefix))


@pytest.mark.parametrize("state", list(NodeState))
def test_node_rows_convert_with_their_state(state: NodeState) -> None:
    row = models.Node(node_id="n", name="n", state=state.value, created_at=NOW)
    assert _state_of(convert.node(row), common_pb2.NodeState, "NODE_STATE_") == state


@pytest.mark.parametrize("state", list(ResidencyState))
def test_residency_rows_convert_with_their_state(state: ResidencyState) -> None:
    row = models.Residency(
        residency_id="r", deployment_id="d", node_id="n", state=state.value, updated_at=NOW
    )
    message = convert.residency(row)
    assert _state_of(message, common_pb2.ResidencyState, "RESIDENCY_STATE_") == state


@pytest.mark.parametrize("state", list(DeploymentState))
def test_deployment_rows_convert_with_their_state(state: DeploymentState) -> None:
    row = models.Deployment(
        deployment_id="d",
        capability="c",
        artifact_set_id="a",
        adapter={},
        state=state.value,
        created_at=NOW,
        updated_at=NOW,
    )
    message = convert.deployment(row, [])
    assert _state_of(message, control_plane_pb2.DeploymentState, "DEPLOYMENT_STATE_") == state


def test_every_contract_reason_is_a_known_reason() -> None:
    assert CONTRACT_REASONS - set(REASONS) == set()


def contracts_reasons(text: str) -> set[str]:
    """The backticked names in the `## Error reasons` section's opening paragraph."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## Error reasons"))
    paragraph: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith("`"):
            break
        paragraph.append(line)
    return set(re.findall(r"`([A-Z][A-Z_]+)`", " ".join(paragraph)))


def test_the_copied_reasons_equal_contracts_md() -> None:
    if not CONTRACTS_MD.exists():
        pytest.skip(f"the design documents are not at {CONTRACTS_MD}")
    assert contracts_reasons(CONTRACTS_MD.read_text(encoding="utf-8")) == CONTRACT_REASONS


@pytest.mark.parametrize("state", list(ProbeState))
def test_probe_rows_convert_with_their_state(state: ProbeState) -> None:
    row = models.RuntimeProbe(
        probe_id="p",
        profile_id="f",
        node_id="n",
        state=state.value,
        evidence={},
        attempt_count=0,
        created_at=NOW,
        updated_at=NOW,
    )
    assert _state_of(convert.probe(row), common_pb2.ProbeState, "PROBE_STATE_") == state


@pytest.mark.parametrize("state", list(AssessmentState))
def test_assessment_rows_convert_with_their_state(state: AssessmentState) -> None:
    row = models.CompatibilityAssessment(
        assessment_id="a",
        artifact_set_id="s",
        node_id="n",
        environment_id="",
        state=state.value,
        compatible=False,
        inspection={},
        environment_fingerprint="",
        failure_reason="",
        failure_message="",
        created_at=NOW,
    )
    message = convert.assessment(row)
    assert _state_of(message, control_plane_pb2.AssessmentState, "ASSESSMENT_STATE_") == state


@pytest.mark.parametrize("status", list(CandidateStatus))
def test_candidate_rows_convert_with_their_status(status: CandidateStatus) -> None:
    row = models.DeploymentCandidate(
        candidate_id="c",
        probe_id="p",
        profile_id="f",
        artifact_set_id="s",
        status=status.value,
        production=False,
        reasons=[],
        created_at=NOW,
    )
    message = convert.candidate(row)
    wire = control_plane_pb2.CandidateStatus.Name(message.status)
    assert wire.removeprefix("CANDIDATE_STATUS_") == status
