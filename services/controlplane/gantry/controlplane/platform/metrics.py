"""The control plane's metrics: invocations and their stages, jobs, streams, leases, fencing,
leadership.

Each event is counted where it is decided: an invocation's outcome in the Inference handlers, a
job's in `apply_result`, a lease expiry in the reconciler. Attribute dicts are built once per
distinct label set and reused, so a count on the hot path is a dict lookup and an add. Reasons
come from the REASONS table (bounded); anything that arrives from the wire is bounded again.
An invocation is labelled with the model it reached (`capability`, `deployment`) only once its
target resolved to a deployment that exists (`call_resolved`), bounded by ModelLabels; before
that, and for a call refused on the way, both read UNRESOLVED.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from gantry.common.errors import REASONS, GantryError
from gantry.common.metrics import (
    BoundedValues,
    Labels,
    ModelLabels,
    SummedCounter,
    cached_attributes,
    duration_histogram,
    meter,
    observable_gauge,
)
from gantry.controlplane.platform.call_tally import CallTally
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState

REASON_LABELS = 64
JOB_TYPE_LABELS = 16

# Invocation stages, in order: the binding or deployment resolved, the scheduler's decision
# (queue wait included), the worker's round trip (model host included), the whole call.
STAGE_RESOLVE = "resolve"
STAGE_SCHEDULE = "schedule"
STAGE_WORKER = "worker"
STAGE_TOTAL = "total"
# An invocation's `operation` label is its RPC's name, as the operation registry declares it
# (gantry.common.operations: `Operation.rpc`); nothing here lists them again.
FENCED_REASONS = frozenset({"STALE_GENERATION", "LEASE_TOKEN_INVALID"})
# The front doors a client call can come through (gantry_front_door_calls' `protocol`). Every one
# ends in the same Inference handlers, so gantry_invocations counts each call once, whatever door.
PROTOCOL_GANTRY = "gantry"  # gantry.v1.Inference
PROTOCOL_KSERVE = "kserve_v2"  # inference.GRPCInferenceService (Open Inference Protocol)
PROTOCOL_OPENAI = "openai_http"  # the OpenAI-compatible HTTP API

_meter = meter("gantry.controlplane")
# Counted on every call: summed here and handed to the SDK when a reader collects.
_invocations = SummedCounter(
    _meter.create_counter(
        "gantry_invocations",
        description="Inference calls answered, by operation, gRPC status code, ErrorInfo "
        "reason, capability and deployment",
    )
)
_front_door_calls = _meter.create_counter(
    "gantry_front_door_calls",
    description="Client calls answered by a protocol adapter (kserve_v2, openai_http), by "
    "protocol, method, gRPC status code and ErrorInfo reason",
)
_stage_duration = duration_histogram(
    _meter,
    "gantry_invocation_stage_duration_seconds",
    "Inference call latency per stage (resolve, schedule, worker, total), by operation, "
    "capability and deployment",
)
_admission_rejections = _meter.create_counter(
    "gantry_admission_rejections",
    description="Inference calls the scheduler refused, by the reason it answered",
)
_jobs = _meter.create_counter(
    "gantry_jobs",
    description="Job results committed, by type (LOAD, UNLOAD, HEALTH, PROBE, INSPECT), "
    "outcome and failure reason",
)
_job_duration = duration_histogram(
    _meter,
    "gantry_job_duration_seconds",
    "Time from a job's creation to its committed result, by type and outcome",
)
_worker_streams = _meter.create_counter(
    "gantry_gateway_stream_events",
    description="Worker streams the control plane opened (connected) and ended (disconnected)",
)
_lease_expiries = _meter.create_counter(
    "gantry_lease_expiries", description="Job leases that expired and were queued again, by type"
)
_fenced = _meter.create_counter(
    "gantry_fenced_messages",
    description="Worker messages refused as fenced (STALE_GENERATION, LEASE_TOKEN_INVALID), "
    "by reason and message kind",
)
_states = {
    "residencies": (
        observable_gauge(_meter, "gantry_residencies", "Residencies by state"),
        [str(s) for s in ResidencyState],
    ),
    "nodes": (
        observable_gauge(_meter, "gantry_nodes", "Registered nodes by state"),
        [str(s) for s in NodeState],
    ),
    "deployments": (
        observable_gauge(_meter, "gantry_deployments", "Deployments by state"),
        [str(s) for s in DeploymentState],
    ),
}

# This replica's leadership (platform/leadership.py): 1 while it decides, and the fencing epoch
# it holds or last held. Published on each look at the lock, read by a scrape as is.
_leader = observable_gauge(
    _meter, "gantry_control_plane_leader", "1 while this control-plane replica is the leader"
)
_leader_epoch = observable_gauge(
    _meter,
    "gantry_control_plane_leader_epoch",
    "The fencing epoch this control-plane replica holds, or last held (0: never led)",
)

_reasons = BoundedValues(REASON_LABELS)
_job_types = BoundedValues(JOB_TYPE_LABELS)
_models = ModelLabels()
_cached = cached_attributes
# Per capability, this replica's answered calls (call_tally.py): Triton's model statistics.
CALLS = CallTally()


@dataclass(slots=True)
class CallTarget:
    """The deployment one Inference call resolved to and that deployment's capability: empty
    until it resolves, and so for good in a call refused before that."""

    capability: str = ""
    deployment_id: str = ""


# The call being counted (`counting`): its target is resolved deep in the payload's handler
# (media, generation, Embed...), and the count, taken around the whole handler, reads it here
# rather than through every handler's signature. A task the handler starts inherits the context
# and so fills the same target.
_current: ContextVar[CallTarget | None] = ContextVar("gantry_call_target", default=None)


@contextmanager
def counting() -> Iterator[CallTarget]:
    """The scope of one counted call: `call_resolved` inside it names the call's model, and the
    stages and the answer recorded inside it carry that model's labels."""
    target = CallTarget()
    token = _current.set(target)
    try:
        yield target
    finally:
        _current.reset(token)


def call_resolved(capability: str, deployment_id: str) -> None:
    """The current call reached `deployment_id`, a deployment that exists, of `capability` (the
    deployment's, read server-side: never what the client typed)."""
    target = _current.get()
    if target is not None:
        target.capability, target.deployment_id = capability, deployment_id


def resolved_capability(deployment_id: str) -> str:
    """The capability the current call resolved to, when it resolved to `deployment_id`; else
    empty (the worker then labels the call UNRESOLVED)."""
    target = _current.get()
    return target.capability if target is not None and target.deployment_id == deployment_id else ""


def model_labels(capability: str, deployment_id: str) -> tuple[str, str]:
    """The (capability, deployment) label values an invocation of this model is recorded with:
    the names themselves, OTHER past the caps, UNRESOLVED when empty."""
    return _models(capability, deployment_id)


def _model_of_call() -> tuple[str, str]:
    target = _current.get() or CallTarget()
    return _models(target.capability, target.deployment_id)


def _wire_reason(reason: str) -> str:
    return reason if reason in REASONS or not reason else _reasons(reason)


def _status_of(error: BaseException | None) -> tuple[str, str]:
    """The gRPC status code name and ErrorInfo reason a call that ended with `error` answers."""
    if error is None:
        return "OK", ""
    if isinstance(error, GantryError):
        return error.code.name, error.reason
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED", ""
    return "INTERNAL", "INTERNAL"  # the interceptor answers INTERNAL for anything unexpected


def invocation_answered(operation: str, error: BaseException | None, seconds: float) -> None:
    """One answered call: its status and reason, and its total latency, labelled with the model
    the current call (`counting`) resolved to; tallied under that capability (CALLS) once it
    resolved to one."""
    code, reason = _status_of(error)
    target = _current.get()
    if target is not None and target.capability:
        CALLS.record(
            target.capability, ok=error is None, seconds=seconds, now_ms=time.time_ns() // 1_000_000
        )
    capability, deployment = _model_of_call()
    _invocations.add(
        1,
        _cached(
            "operation",
            operation,
            "code",
            code,
            "reason",
            reason,
            "capability",
            capability,
            "deployment",
            deployment,
        ),
    )
    _record_stage(operation, STAGE_TOTAL, seconds)


def front_door_answered(protocol: str, method: str, error: BaseException | None) -> None:
    """One call answered by a protocol adapter (PROTOCOL_*), counted by the adapter's method
    (`ModelInfer`, `/v1/embeddings`): which door the traffic takes, beside gantry_invocations,
    which counts the Inference operation each call became."""
    code, reason = _status_of(error)
    _front_door_calls.add(
        1, _cached("protocol", protocol, "method", method, "code", code, "reason", reason)
    )


def stage_finished(operation: str, stage: str, seconds: float) -> None:
    """One stage of the current call (`counting`) done, labelled with the model it resolved to
    (UNRESOLVED for a stage before that)."""
    _record_stage(operation, stage, seconds)


def _record_stage(operation: str, stage: str, seconds: float) -> None:
    capability, deployment = _model_of_call()
    _stage_duration.record(
        seconds,
        _cached(
            "operation",
            operation,
            "stage",
            stage,
            "capability",
            capability,
            "deployment",
            deployment,
        ),
    )


def admission_rejected(reason: str) -> None:
    _admission_rejections.add(1, _cached("reason", _wire_reason(reason)))


def job_committed(
    job_type: str, failure_reason: str, created_at: dt.datetime, now: dt.datetime
) -> None:
    outcome = "FAILED" if failure_reason else "SUCCEEDED"
    kind = _job_types(job_type)
    _jobs.add(1, _cached("type", kind, "outcome", outcome, "reason", _wire_reason(failure_reason)))
    _job_duration.record(
        max(0.0, (now - created_at).total_seconds()), _cached("type", kind, "outcome", outcome)
    )


def worker_stream(event: str) -> None:
    _worker_streams.add(1, _cached("event", event))


def lease_expired(job_type: str) -> None:
    _lease_expiries.add(1, _cached("type", _job_types(job_type)))


def message_refused(reason: str, message_kind: str) -> None:
    """A worker message refused: counted when the refusal is a fence (an old generation or a
    lease token that is no longer current)."""
    if reason in FENCED_REASONS:
        _fenced.add(1, _cached("reason", reason, "message", message_kind))


def leadership(leading: bool, epoch: int) -> None:
    _leader.publish({(): 1.0 if leading else 0.0})
    _leader_epoch.publish({(): float(epoch)})


def publish_state_counts(counts: Mapping[str, Mapping[str, int]]) -> None:
    """Every known state is published (0 when no row holds it), so a state that empties reads
    0 rather than its last value."""
    for table, (gauge, known) in _states.items():
        rows = counts.get(table, {})
        values: dict[Labels, float] = {
            (("state", state),): float(rows.get(state, 0)) for state in known
        }
        for state, count in rows.items():
            if state not in known:
                values[(("state", _reasons(state)),)] = float(count)
        gauge.publish(values)
