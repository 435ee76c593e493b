"""What `gantry describe` prints, from records already fetched: pure, no gRPC.

One object is shown as its state and key fields, its last failure, the evidence chain it stands
on (deployment -> approval -> candidate -> probe -> profile -> assessment -> artifact set), its
residencies, and its history (state transitions and audit events) in time order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from gantry.cli.output import message_dict
from gantry.cli.tables import enum_label, format_bytes, format_timestamp, render_table
from gantry.v1 import common_pb2
from gantry.v1 import control_plane_pb2 as cp

KIND_TITLES = {
    "deployment": "deployment",
    "node": "node",
    "artifacts": "artifact set",
    "assessment": "assessment",
    "profile": "profile",
    "probe": "probe",
    "candidate": "candidate",
    "approval": "approval",
    "job": "job",
    "residency": "residency",
}


@dataclass(frozen=True, slots=True)
class Link:
    """One step of the evidence chain; `record` is None when it could not be read."""

    kind: str
    ident: str
    record: Message | None


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    at: dt.datetime
    transition: cp.StateTransition | None = None
    event: cp.AuditEvent | None = None


@dataclass(slots=True)
class Description:
    kind: str
    ident: str
    record: Message
    evidence: list[Link] = field(default_factory=list)
    residencies: list[common_pb2.Residency] = field(default_factory=list)
    history: list[HistoryEntry] = field(default_factory=list)


def state_of(record: Message | None) -> str:
    """The record's state (or a candidate's status) as its short label; "-" when it has none."""
    if record is None:
        return "missing"
    for name in ("state", "status"):
        descriptor = record.DESCRIPTOR.fields_by_name.get(name)
        if descriptor is not None and descriptor.enum_type is not None:
            value = descriptor.enum_type.values_by_number[getattr(record, name)].name
            return value.split(f"{name.upper()}_", 1)[-1]  # DEPLOYMENT_STATE_READY -> READY
    return "-"


def last_failure(record: Message) -> common_pb2.Failure | None:
    for name in ("last_failure", "failure"):
        if name in record.DESCRIPTOR.fields_by_name and record.HasField(name):
            failure = getattr(record, name)
            if failure.reason or failure.message:
                return failure  # type: ignore[no-any-return]
    return None


def history_of(
    transitions: Sequence[cp.StateTransition], events: Sequence[cp.AuditEvent]
) -> list[HistoryEntry]:
    """Both sources in time order; at the same instant a transition comes before its event."""
    entries = [HistoryEntry(at=_time(t.at), transition=t) for t in transitions]
    entries += [HistoryEntry(at=_time(e.at), event=e) for e in events]
    return sorted(entries, key=lambda entry: (entry.at, entry.transition is None))


def _time(value: timestamp_pb2.Timestamp) -> dt.datetime:
    return value.ToDatetime(tzinfo=dt.UTC)


Fields = list[tuple[str, str]]


def _deployment_fields(record: Any) -> Fields:
    return [
        ("capability", record.capability + (" (bound)" if record.bound else "")),
        ("replicas", f"{record.replicas} (min {record.min_replicas}, max {record.max_replicas})"),
        ("artifact set", record.artifact_set_id),
        ("adapter", f"{record.adapter.adapter} on {record.adapter.device or 'cpu'}"),
        ("constraints", constraints_text(record.constraints)),
        ("created", format_timestamp(record.created_at)),
        ("updated", format_timestamp(record.updated_at)),
    ]


def constraints_text(constraints: common_pb2.PlacementConstraints) -> str:
    """What an operator aimed a deployment at, in `gantry deploy`'s words; "-" for nothing."""
    parts = []
    if constraints.gpu_model:
        parts.append(f"gpu model {constraints.gpu_model}")
    if constraints.min_compute_capability:
        parts.append(f"compute capability >= {constraints.min_compute_capability}")
    if constraints.min_free_vram_bytes:
        parts.append(f"free VRAM >= {format_bytes(constraints.min_free_vram_bytes)}")
    parts += [f"label {label}" for label in constraints.node_labels]
    return ", ".join(parts) or "-"


def _node_fields(record: Any) -> Fields:
    labels = ",".join(f"{k}={v}" for k, v in sorted(record.labels.items())) or "-"
    fields = [
        ("name", record.name),
        ("hostname", record.hostname or "-"),
        ("generation", str(record.generation)),
        ("labels", labels),
        ("last seen", format_timestamp(record.last_seen_at)),
    ]
    if record.disabled_reason:
        fields.append(("disabled", record.disabled_reason))
    return fields


def _artifact_set_fields(record: Any) -> Fields:
    return [
        ("name", record.name),
        ("location", record.location),
        ("digest", record.manifest_digest),
        ("files", f"{record.file_count} ({format_bytes(record.total_size_bytes)})"),
        ("created", format_timestamp(record.created_at)),
    ]


def _assessment_fields(record: Any) -> Fields:
    return [
        ("compatible", "yes" if record.compatible else "no"),
        ("artifact set", record.artifact_set_id),
        ("node", record.node_id or "-"),
        ("environment", record.environment_id or "default"),
        ("job", record.job_id or "-"),
    ]


def _profile_fields(record: Any) -> Fields:
    return [
        ("name", record.name),
        ("assessment", record.assessment_id),
        ("adapter", f"{record.adapter.adapter} on {record.adapter.device or 'cpu'}"),
        ("ram envelope", format_bytes(record.ram_envelope_bytes)),
    ]


def _probe_fields(record: Any) -> Fields:
    return [
        ("profile", record.profile_id),
        ("node", record.node_id or "-"),
        ("job", record.job_id or "-"),
        ("attempts", str(record.attempt_count)),
        ("candidate", record.candidate_id or "-"),
    ]


def _candidate_fields(record: Any) -> Fields:
    return [
        ("production", "yes" if record.production else "no"),
        ("approval", record.approval_id or "-"),
        ("reasons", "; ".join(record.reasons) or "-"),
    ]


def _approval_fields(record: Any) -> Fields:
    return [("approved by", record.approved_by), ("reason", record.reason)]


def _job_fields(record: Any) -> Fields:
    job_type = cp.ServingJobType.Name(record.job_type)
    return [
        ("type", enum_label(job_type, "SERVING_JOB_TYPE_")),
        ("deployment", record.deployment_id or "-"),
        ("node", record.node_id or "-"),
        ("residency", record.residency_id or "-"),
        ("attempts", str(record.attempt_count)),
    ]


def _residency_fields(record: Any) -> Fields:
    return [
        ("deployment", record.deployment_id),
        ("node", record.node_id),
        ("pid", str(record.pid or "-")),
        ("restarts", str(record.restart_count)),
    ]


_KEY_FIELDS: dict[str, Callable[[Any], Fields]] = {
    "deployment": _deployment_fields,
    "node": _node_fields,
    "artifacts": _artifact_set_fields,
    "assessment": _assessment_fields,
    "profile": _profile_fields,
    "probe": _probe_fields,
    "candidate": _candidate_fields,
    "approval": _approval_fields,
    "job": _job_fields,
    "residency": _residency_fields,
}


def key_fields(kind: str, record: Any) -> Fields:
    """The fields an operator reads first, per kind (JSON output carries every field)."""
    fields_of = _KEY_FIELDS.get(kind)
    return fields_of(record) if fields_of is not None else []


def _link_summary(link: Link) -> str:
    record: Any = link.record
    if record is None:
        return "(not found)"
    if link.kind == "approval":
        return f"approved by {record.approved_by}: {record.reason}"
    if link.kind == "profile":
        return record.name  # type: ignore[no-any-return]
    if link.kind == "artifacts":
        return f"{record.name} ({record.location})"
    return state_of(record)


def _history_row(entry: HistoryEntry) -> list[str]:
    when = f"{entry.at:%Y-%m-%d %H:%M:%S}Z"
    if entry.transition is not None:
        t = entry.transition
        change = f"{t.from_state or 'created'} -> {t.to_state}"
        if t.reason or t.message:
            change += f" ({': '.join(part for part in (t.reason, t.message) if part)})"
        return [when, f"{t.subject_kind} {t.subject_id}", change]
    assert entry.event is not None
    e = entry.event
    detail = " ".join(f"{k}={v}" for k, v in sorted(e.detail.items()))
    return [when, f"{e.subject_kind} {e.subject_id}", f"{e.action} by {e.actor} {detail}".strip()]


def render_text(description: Description) -> str:
    record = description.record
    title = KIND_TITLES[description.kind]
    lines = [f"{title:<13}{description.ident}", f"{'state':<13}{state_of(record)}"]
    lines += [f"{label:<13}{value}" for label, value in key_fields(description.kind, record)]
    failure = last_failure(record)
    if failure is not None:
        lines.append(f"{'last failure':<13}{failure.reason}: {failure.message}")
    if description.evidence:
        lines += ["", "evidence"]
        rows = [
            [KIND_TITLES[link.kind], link.ident, _link_summary(link)]
            for link in description.evidence
        ]
        lines += ["  " + line for line in render_table(["KIND", "ID", "STATE"], rows).splitlines()]
    if description.residencies:
        rows = [
            [r.residency_id, r.deployment_id, r.node_id, _residency_state(r)]
            for r in description.residencies
        ]
        lines += ["", "residencies"]
        headers = ["ID", "DEPLOYMENT", "NODE", "STATE"]
        lines += ["  " + line for line in render_table(headers, rows).splitlines()]
    lines += ["", "history"]
    if description.history:
        rows = [_history_row(entry) for entry in description.history]
        lines += [
            "  " + line for line in render_table(["AT", "SUBJECT", "CHANGE"], rows).splitlines()
        ]
    else:
        lines.append("  (nothing recorded)")
    return "\n".join(lines)


def _residency_state(residency: common_pb2.Residency) -> str:
    return enum_label(common_pb2.ResidencyState.Name(residency.state), "RESIDENCY_STATE_")


def as_json(description: Description) -> dict[str, Any]:
    """One object holding every record shown (the proto's field names, as grpcurl prints them)."""
    failure = last_failure(description.record)
    return {
        "kind": description.kind,
        "id": description.ident,
        "state": state_of(description.record),
        "record": message_dict(description.record),
        "last_failure": message_dict(failure) if failure is not None else None,
        "evidence": [
            {
                "kind": link.kind,
                "id": link.ident,
                "state": state_of(link.record),
                "record": message_dict(link.record) if link.record is not None else None,
            }
            for link in description.evidence
        ],
        "residencies": [message_dict(r) for r in description.residencies],
        "history": [_history_json(entry) for entry in description.history],
    }


def _history_json(entry: HistoryEntry) -> dict[str, Any]:
    at = f"{entry.at:%Y-%m-%dT%H:%M:%S.%f}Z"  # fixed width: the strings sort as the times do
    if entry.transition is not None:
        t = entry.transition
        # Every field, empty ones too: from_state "" is the state a record was created in.
        return {
            "at": at,
            "source": "transition",
            "subject_kind": t.subject_kind,
            "subject_id": t.subject_id,
            "deployment_id": t.deployment_id,
            "from_state": t.from_state,
            "to_state": t.to_state,
            "reason": t.reason,
            "message": t.message,
        }
    assert entry.event is not None
    return {"at": at, "source": "event", **message_dict(entry.event)}
