"""The worker's metrics: model-host starts, crashes, restarts and crash loops, jobs, invocations,
and its stream to the control plane.

Counted where supervision, the job runner, the invocation runner and the stream loop decide each
event; label values are reasons from the REASONS table and job kinds (both bounded), never a
request or job id. Invocations also carry the model they ran on: the deployment id and its
capability as the control plane resolved them (Invoke.capability), bounded by ModelLabels.
"""

from __future__ import annotations

from gantry.common.errors import REASONS
from gantry.common.metrics import (
    BoundedValues,
    ModelLabels,
    SummedCounter,
    cached_attributes,
    duration_histogram,
    meter,
)

_meter = meter("gantry.worker")
_host_starts = _meter.create_counter(
    "gantry_model_host_starts",
    description="Model host starts (first starts and in-place restarts), by outcome and reason",
)
_host_crashes = _meter.create_counter(
    "gantry_model_host_crashes",
    description="Model host failures that lead to a restart (an exit unasked: crash, OOM kill, "
    "killed as unresponsive; or a failed restart), by reason",
)
_host_restarts = _meter.create_counter(
    "gantry_model_host_restarts", description="In-place restarts of a model host attempted"
)
_crash_loops = _meter.create_counter(
    "gantry_model_host_crash_loops",
    description="Crashes that found the host in a crash loop (restarts then slow down)",
)
_jobs = _meter.create_counter(
    "gantry_worker_jobs",
    description="Jobs run on this worker, by kind (load, unload, health, probe, inspect), "
    "outcome and reason",
)
_job_duration = duration_histogram(
    _meter,
    "gantry_worker_job_duration_seconds",
    "Time a job ran on this worker, by kind and outcome",
)
# Counted on every invocation: summed here and handed to the SDK when a reader collects (an SDK
# add on each one was 4-5 % of the worker's event loop at concurrency 1, issue 29).
_invocations = SummedCounter(
    _meter.create_counter(
        "gantry_worker_invocations",
        description="Invocations answered by this worker, by outcome, reason, capability and "
        "deployment",
    )
)
_invocation_duration = duration_histogram(
    _meter,
    "gantry_worker_invocation_duration_seconds",
    "Time an invocation ran on this worker, by capability and deployment",
)
_stream_events = _meter.create_counter(
    "gantry_worker_stream_events",
    description="The worker's stream to the control plane: welcomed (connected, reconnected) "
    "and ended (disconnected), by reason",
)

_reasons = BoundedValues(64)
_kinds = BoundedValues(16)
_models = ModelLabels()
_cached = cached_attributes


def _reason(reason: str) -> str:
    return reason if reason in REASONS or not reason else _reasons(reason)


def host_started(*, restart: bool, failure_reason: str = "") -> None:
    outcome = "FAILED" if failure_reason else "STARTED"
    kind = "restart" if restart else "start"
    _host_starts.add(
        1, _cached("kind", kind, "outcome", outcome, "reason", _reason(failure_reason))
    )


def host_crashed(reason: str, *, crash_loop: bool) -> None:
    _host_crashes.add(1, _cached("reason", _reason(reason)))
    if crash_loop:
        _crash_loops.add(1)


def host_restart_attempted() -> None:
    _host_restarts.add(1)


def job_ran(kind: str, failure_reason: str, seconds: float) -> None:
    outcome = "FAILED" if failure_reason else "SUCCEEDED"
    label = _kinds(kind)
    _jobs.add(1, _cached("kind", label, "outcome", outcome, "reason", _reason(failure_reason)))
    _job_duration.record(seconds, _cached("kind", label, "outcome", outcome))


def invocation_answered(
    failure_reason: str, seconds: float, *, capability: str, deployment_id: str
) -> None:
    """One invocation answered, on the deployment the control plane sent it to (`capability`
    empty from a control plane that does not send it: UNRESOLVED)."""
    reason = _reason(failure_reason)
    capability_label, deployment_label = _models(capability, deployment_id)
    _invocations.add(
        1,
        _cached(
            "outcome",
            "FAILED" if reason else "OK",
            "reason",
            reason,
            "capability",
            capability_label,
            "deployment",
            deployment_label,
        ),
    )
    _invocation_duration.record(
        seconds, _cached("capability", capability_label, "deployment", deployment_label)
    )


def model_labels(capability: str, deployment_id: str) -> tuple[str, str]:
    """The (capability, deployment) label values this worker records an invocation of that
    model with: the names themselves, OTHER past the caps, UNRESOLVED when empty."""
    return _models(capability, deployment_id)


def stream_event(event: str, reason: str = "") -> None:
    _stream_events.add(1, _cached("event", event, "reason", _reason(reason)))
