"""`gantry describe KIND ID`: one object, the evidence it stands on, and its history.

The reads are plain Get/List RPCs (operator token); describe_render.py turns them into text or
one JSON object. An unknown id is the server's NOT_FOUND (exit 1); a failed object is described
like any other (exit 0): its failure is what the operator came to read.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, Metadata, paged
from gantry.cli.describe_render import (
    KIND_TITLES,
    Description,
    Link,
    as_json,
    history_of,
    render_text,
)
from gantry.cli.output import add_output_argument, print_json, wants_json
from gantry.common.errors import not_found
from gantry.v1 import control_plane_pb2 as cp
from gantry.v1 import control_plane_pb2_grpc

Stub = control_plane_pb2_grpc.ControlPlaneStub
KINDS = tuple(KIND_TITLES)
# The kinds whose state changes are recorded (ListStateTransitions), and each kind's name in the
# audit trail.
TRANSITION_KINDS = frozenset({"deployment", "residency", "node", "job"})
AUDIT_KINDS = {"artifacts": "artifact_set"}
# Evidence chains are short (six links); the bound only guards against a cycle in bad data.
MAX_CHAIN = 8


def add_describe_arguments(describe: CommandSpec) -> None:
    describe.add_argument("kind", choices=KINDS, metavar="KIND", help=", ".join(KINDS))
    describe.add_argument("ident", metavar="ID")
    add_output_argument(describe)


def describe_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        description = describe(Stub(channel), metadata, args.kind, args.ident)
    if wants_json(args):
        print_json(as_json(description))
    else:
        print(render_text(description))
    return 0


def describe(stub: Stub, metadata: Metadata, kind: str, ident: str) -> Description:
    record = fetch(stub, metadata, kind, ident)
    description = Description(kind=kind, ident=ident, record=record)
    description.evidence = evidence_chain(stub, metadata, kind, record)
    if kind == "deployment":
        description.residencies = list(record.residencies)  # type: ignore[attr-defined]
    elif kind == "node":
        description.residencies = [
            entry.residency
            for entry in _registry(stub, metadata).residencies
            if entry.residency.node_id == ident
        ]
    transitions = (
        list(_transitions(stub, metadata, kind, ident)) if kind in TRANSITION_KINDS else []
    )
    description.history = history_of(transitions, _events(stub, metadata, kind, ident))
    return description


def fetch(stub: Stub, metadata: Metadata, kind: str, ident: str) -> Message:
    """The record of `kind` named `ident`; the server's NOT_FOUND when there is none."""
    if kind == "residency":
        # No GetResidency: the registry snapshot holds every residency with its record.
        for entry in _registry(stub, metadata).residencies:
            if entry.residency.residency_id == ident:
                return entry.residency
        raise not_found("residency", ident)
    call, request = _GETTERS[kind]
    return call(stub)(request(ident), metadata=metadata, timeout=DEFAULT_TIMEOUT_S)  # type: ignore[no-any-return]


_GETTERS: dict[str, tuple[Callable[[Stub], Any], Callable[[str], Message]]] = {
    "deployment": (lambda s: s.GetDeployment, lambda i: cp.GetDeploymentRequest(deployment_id=i)),
    "node": (lambda s: s.GetNode, lambda i: cp.GetNodeRequest(node_id=i)),
    "artifacts": (
        lambda s: s.GetArtifactSet,
        lambda i: cp.GetArtifactSetRequest(artifact_set_id=i),
    ),
    "assessment": (lambda s: s.GetAssessment, lambda i: cp.GetAssessmentRequest(assessment_id=i)),
    "profile": (
        lambda s: s.GetRuntimeProfile,
        lambda i: cp.GetRuntimeProfileRequest(profile_id=i),
    ),
    "probe": (lambda s: s.GetProbe, lambda i: cp.GetProbeRequest(probe_id=i)),
    "candidate": (
        lambda s: s.GetDeploymentCandidate,
        lambda i: cp.GetDeploymentCandidateRequest(candidate_id=i),
    ),
    "approval": (lambda s: s.GetApproval, lambda i: cp.GetApprovalRequest(approval_id=i)),
    "job": (lambda s: s.GetServingJob, lambda i: cp.GetServingJobRequest(job_id=i)),
}


# Each step of the evidence chain: the next kind, and the field of this record that names it.
_CHAIN = {
    "approval": ("candidate", "candidate_id"),
    "candidate": ("probe", "probe_id"),
    "probe": ("profile", "profile_id"),
    "profile": ("assessment", "assessment_id"),
    "assessment": ("artifacts", "artifact_set_id"),
    "residency": ("deployment", "deployment_id"),
}
# A job stands on its deployment (LOAD, UNLOAD, HEALTH) or on the gate it ran for.
_JOB_SUBJECTS = (
    ("deployment", "deployment_id"),
    ("probe", "probe_id"),
    ("assessment", "assessment_id"),
)


def next_link(kind: str, record: Any) -> tuple[str, str] | None:
    """The record the evidence chain goes on to from `record`, if any."""
    if kind == "deployment":
        # A legacy deployment passed no gate: its artifact set is all it stands on.
        if record.approval_id:
            return "approval", record.approval_id
        return "artifacts", record.artifact_set_id
    candidates = _JOB_SUBJECTS if kind == "job" else [_CHAIN[kind]] if kind in _CHAIN else []
    for next_kind, field in candidates:
        if ident := getattr(record, field):
            return next_kind, ident
    return None


def evidence_chain(stub: Stub, metadata: Metadata, kind: str, record: Message) -> list[Link]:
    """The records `record` stands on, nearest first; a link that cannot be read ends it."""
    links: list[Link] = []
    current_kind, current = kind, record
    while len(links) < MAX_CHAIN and (step := next_link(current_kind, current)) is not None:
        next_kind, ident = step
        try:
            found = fetch(stub, metadata, next_kind, ident)
        except grpc.RpcError as error:
            if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            links.append(Link(kind=next_kind, ident=ident, record=None))
            break
        links.append(Link(kind=next_kind, ident=ident, record=found))
        current_kind, current = next_kind, found
    return links


def _registry(stub: Stub, metadata: Metadata) -> cp.RegistrySnapshot:
    return stub.GetRegistrySnapshot(  # type: ignore[no-any-return]
        cp.GetRegistrySnapshotRequest(), metadata=metadata, timeout=DEFAULT_TIMEOUT_S
    )


def _transitions(
    stub: Stub, metadata: Metadata, kind: str, ident: str
) -> Iterator[cp.StateTransition]:
    def request(*, page_size: int, page_token: str) -> cp.ListStateTransitionsRequest:
        return cp.ListStateTransitionsRequest(
            subject_kind=kind, subject_id=ident, page_size=page_size, page_token=page_token
        )

    return paged(stub.ListStateTransitions, request, lambda r: r.transitions, metadata=metadata)


def _events(stub: Stub, metadata: Metadata, kind: str, ident: str) -> list[cp.AuditEvent]:
    subject = cp.AuditEventFilter(subject_kind=AUDIT_KINDS.get(kind, kind), subject_id=ident)

    def request(*, page_size: int, page_token: str) -> cp.ListAuditEventsRequest:
        return cp.ListAuditEventsRequest(page_size=page_size, page_token=page_token, filter=subject)

    return list(paged(stub.ListAuditEvents, request, lambda r: r.events, metadata=metadata))
