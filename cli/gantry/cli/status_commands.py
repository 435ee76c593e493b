"""`gantry status`: the whole system on one screen, from one GetDebugSnapshot call.

One call, so every section is the same moment (the control plane reads the registry in one
transaction). `render_status` is pure: a snapshot and the time in, text out. Each section keeps a
few rows and says how many more there are, so a small system fits about 40 lines.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence

from google.protobuf import json_format, timestamp_pb2

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext
from gantry.cli.jobs_commands import failure_text, job_state_label, job_type_label, subject
from gantry.cli.output import add_output_argument, wants_json
from gantry.cli.tables import enum_label, render_table, seconds_ago
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, scheduler_pb2

# Rows kept per section; the rest are counted ("… N more").
MAX_NODES = 8
MAX_DEPLOYMENTS = 8
MAX_BINDINGS = 6
MAX_BREAKERS = 5
MAX_PENDING_JOBS = 3
MAX_FAILURES = 5
MAX_IDS = 4  # ids listed on one line (stale nodes, UNCERTAIN residencies)
_FAILURE_WIDTH = 70
# A residency that holds (or may hold) a model host: everything but COLD.
_NOT_HELD = (common_pb2.RESIDENCY_STATE_UNSPECIFIED, common_pb2.RESIDENCY_STATE_COLD)


def add_status_arguments(status: CommandSpec) -> None:
    status.set_defaults(handler=status_command)
    add_output_argument(status)


# ---- rendering (pure) ---------------------------------------------------------------------------


def _age(value: timestamp_pb2.Timestamp, now: dt.datetime) -> str:
    if value.seconds == 0 and value.nanos == 0:
        return "never"
    seconds = int((now - value.ToDatetime(tzinfo=dt.UTC)).total_seconds())
    # A clock a little ahead of ours is no news on this screen.
    return "just now" if seconds < 0 else seconds_ago(seconds)


def _shortened(text: str, width: int = _FAILURE_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _more(count: int) -> list[str]:
    return [f"… {count} more"] if count > 0 else []


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], limit: int) -> list[str]:
    if not rows:
        return ["  none"]
    table = render_table(headers, rows[:limit]).splitlines()
    return [f"  {line}" for line in table] + [f"  {line}" for line in _more(len(rows) - limit)]


def _ids(ids: Sequence[str], names: dict[str, str] | None = None) -> str:
    if not ids:
        return "none"
    shown = [(names or {}).get(i, i) for i in ids[:MAX_IDS]]
    return ", ".join(shown + _more(len(ids) - MAX_IDS))


def _node_state(state: int) -> str:
    return enum_label(common_pb2.NodeState.Name(state), "NODE_STATE_")


def _deployment_state(state: int) -> str:
    return enum_label(control_plane_pb2.DeploymentState.Name(state), "DEPLOYMENT_STATE_")


def _breaker_state(state: int) -> str:
    return enum_label(scheduler_pb2.BreakerState.Name(state), "BREAKER_STATE_")


def _nodes(registry: control_plane_pb2.RegistrySnapshot, now: dt.datetime) -> list[str]:
    residents: dict[str, int] = {}
    for deployment in registry.deployments:
        for residency in deployment.residencies:
            if residency.state not in _NOT_HELD:
                residents[residency.node_id] = residents.get(residency.node_id, 0) + 1
    rows = [
        [
            node.name,
            _node_state(node.state)
            + (f" ({node.disabled_reason})" if node.disabled_reason else ""),
            _age(node.last_seen_at, now),
            str(residents.get(node.node_id, 0)),
            node.node_id,
        ]
        for node in sorted(registry.nodes, key=lambda node: node.name)
    ]
    title = f"NODES ({len(rows)})"
    return [title, *_table(["NAME", "STATE", "LAST SEEN", "RESIDENTS", "ID"], rows, MAX_NODES)]


def _deployments(snapshot: control_plane_pb2.DebugSnapshot) -> list[str]:
    registry = snapshot.registry
    failures = {f.deployment_id: f.failure for f in snapshot.deployment_failures}
    rows = []
    for deployment in sorted(registry.deployments, key=lambda d: (d.capability, d.deployment_id)):
        ready = sum(r.state == common_pb2.RESIDENCY_STATE_RESIDENT for r in deployment.residencies)
        failure = failures.get(deployment.deployment_id) or deployment.last_failure
        rows.append(
            [
                deployment.capability,
                _deployment_state(deployment.state),
                f"{ready}/{deployment.replicas}",
                "yes" if deployment.bound else "no",
                deployment.deployment_id,
                _shortened(failure_text(failure), 50) if failure.reason else "-",
            ]
        )
    headers = ["CAPABILITY", "STATE", "READY/WANTED", "BOUND", "ID", "LAST FAILURE"]
    return [f"DEPLOYMENTS ({len(rows)})", *_table(headers, rows, MAX_DEPLOYMENTS)]


def _bindings(registry: control_plane_pb2.RegistrySnapshot) -> list[str]:
    rows = [
        [
            binding.capability,
            binding.deployment_id or "(none ready yet)",
            binding.pending_deployment_id or "-",
        ]
        for binding in sorted(registry.bindings, key=lambda b: b.capability)
    ]
    return [
        f"BINDINGS ({len(rows)})",
        *_table(["CAPABILITY", "DEPLOYMENT", "PENDING"], rows, MAX_BINDINGS),
    ]


def _capabilities(registry: control_plane_pb2.RegistrySnapshot, now: dt.datetime) -> list[str]:
    healthy = []
    lines = []
    for health in sorted(registry.capabilities, key=lambda c: c.capability):
        if health.condition == control_plane_pb2.CAPABILITY_CONDITION_DEGRADED:
            lines.append(
                f"  {health.capability}: DEGRADED {health.reason or '(no reason given)'} "
                f"(success {health.success_rate * 100:.0f}% of {health.outcomes}, "
                f"since {_age(health.since, now)})"
            )
        else:
            healthy.append(health.capability)
    if healthy:
        lines.append(f"  healthy: {', '.join(healthy)}")
    return ["CAPABILITIES", *(lines or ["  none observed yet"])]


def _queue(snapshot: control_plane_pb2.DebugSnapshot, names: dict[str, str]) -> list[str]:
    if not snapshot.HasField("queue"):
        why = snapshot.queue_unavailable
        reason = f"{why.reason}: {why.message}" if why.message else why.reason
        return [f"QUEUE  unavailable: {_shortened(reason or 'the scheduler did not answer')}"]
    queue = snapshot.queue
    summary = (
        f"QUEUE  queued {queue.queued}, in flight {queue.in_flight}, "
        f"rejected {queue.rejected_total}, expired {queue.expired_total}, "
        f"dispatched {queue.dispatched_total}"
    )
    if not queue.control_plane_connected:
        summary += " (scheduler not connected to the control plane)"
    breakers = [
        [
            names.get(breaker.node_id, breaker.node_id),
            breaker.deployment_id or "(node)",
            _breaker_state(breaker.state),
            str(breaker.consecutive_failures),
            f"{breaker.cooldown_left_seconds:.1f}s" if breaker.cooldown_left_seconds > 0 else "-",
        ]
        for breaker in queue.breakers
        if breaker.state != scheduler_pb2.BREAKER_STATE_CLOSED
    ]
    if not breakers:
        return [summary, "BREAKERS  all closed"]
    headers = ["NODE", "DEPLOYMENT", "STATE", "FAILURES", "COOLDOWN"]
    return [
        summary,
        f"BREAKERS not closed ({len(breakers)})",
        *_table(headers, breakers, MAX_BREAKERS),
    ]


def _recovery(recovery: control_plane_pb2.RecoveryState, names: dict[str, str]) -> list[str]:
    lines = [
        "RECOVERY",
        f"  stale nodes: {_ids(recovery.stale_node_ids, names)}",
        f"  UNCERTAIN residencies: {_ids(recovery.uncertain_residency_ids)}",
        f"  deployments missing replicas: {_ids(recovery.pending_deployment_ids)}",
        f"  pending jobs: {len(recovery.pending_jobs)}",
    ]
    for job in recovery.pending_jobs[:MAX_PENDING_JOBS]:
        lines.append(
            f"    {job_type_label(job.job_type)} {job_state_label(job.state)} "
            f"on {names.get(job.node_id, job.node_id or '-')} for {subject(job)} "
            f"(attempts {job.attempt_count})"
        )
    lines += [f"    {line}" for line in _more(len(recovery.pending_jobs) - MAX_PENDING_JOBS)]
    return lines


def _failures(
    jobs: Sequence[control_plane_pb2.ServingJob], names: dict[str, str], now: dt.datetime
) -> list[str]:
    if not jobs:
        return ["RECENT FAILURES  none"]
    lines = [f"RECENT FAILURES (newest first, {len(jobs)})"]
    for job in jobs[:MAX_FAILURES]:
        where = names.get(job.node_id, job.node_id or "-")
        lines.append(
            f"  {_age(job.updated_at, now):>8}  {job_type_label(job.job_type)} on {where} "
            f"for {subject(job)}: {_shortened(failure_text(job.failure))}"
        )
    return lines + [f"  {line}" for line in _more(len(jobs) - MAX_FAILURES)]


def render_status(
    snapshot: control_plane_pb2.DebugSnapshot, *, address: str, now: dt.datetime
) -> str:
    """`now`: the reader's time, used only when the snapshot carries none; ages are measured
    from the snapshot's own time, as the control plane's clock saw the system."""
    registry = snapshot.registry
    names = {node.node_id: node.name for node in registry.nodes}
    taken = registry.taken_at.ToDatetime(tzinfo=dt.UTC) if registry.HasField("taken_at") else now
    now = taken
    sections = [
        [f"gantry at {address}  {taken:%Y-%m-%d %H:%M:%S}Z  audit cursor {registry.last_event_id}"],
        _nodes(registry, now),
        _deployments(snapshot),
        _bindings(registry),
        _capabilities(registry, now),
        _queue(snapshot, names),
        _recovery(snapshot.recovery, names),
        _failures(snapshot.recent_failed_jobs, names, now),
    ]
    return "\n".join(line.rstrip() for section in sections for line in section)


def status_json(snapshot: control_plane_pb2.DebugSnapshot) -> str:
    # The proto's own field names, as `gantry queue --json` and grpcurl print them.
    return json_format.MessageToJson(snapshot, indent=2, preserving_proto_field_name=True)


# ---- the command --------------------------------------------------------------------------------


def status_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        snapshot = control_plane_pb2_grpc.ControlPlaneStub(channel).GetDebugSnapshot(
            control_plane_pb2.GetDebugSnapshotRequest(recent_failures=MAX_FAILURES * 4),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print(status_json(snapshot))
    else:
        print(render_status(snapshot, address=context.address, now=dt.datetime.now(dt.UTC)))
    return 0
