"""`gantry jobs`: serving jobs (LOAD, UNLOAD, HEALTH, INSPECT, PROBE), their states and outcomes.

Over ListServingJobs/GetServingJob (operator token). The control plane filters by node and
deployment; type and state are filtered here, and the newest jobs (by creation time; ids are
random) are shown last. Rendering is pure: jobs in, text out.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Sequence

from google.protobuf import json_format, timestamp_pb2

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, Metadata, paged
from gantry.cli.errors import CliError
from gantry.cli.output import add_output_argument, wants_json
from gantry.cli.tables import enum_label, format_timestamp, render_table
from gantry.common.arg_types import non_negative
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, worker_gateway_pb2

DEFAULT_LIMIT = 50
# The CLI's spelling of each ServingJobType / ServingJobState: the enum names, lowercase.
JOB_TYPES = {
    enum_label(name, "SERVING_JOB_TYPE_").lower(): value
    for name, value in control_plane_pb2.ServingJobType.items()
    if value != control_plane_pb2.SERVING_JOB_TYPE_UNSPECIFIED
}
JOB_STATES = {
    enum_label(name, "SERVING_JOB_STATE_").lower(): value
    for name, value in control_plane_pb2.ServingJobState.items()
    if value != control_plane_pb2.SERVING_JOB_STATE_UNSPECIFIED
}
_RESULT_WIDTH = 60


def add_jobs_arguments(jobs: CommandSpec, options: CommandSpec) -> None:
    """`gantry jobs [filters]` (newest last), `gantry jobs show JOB_ID`.

    No `list` subcommand: a subcommand's defaults would overwrite filters given before it.
    """
    jobs.set_defaults(handler=jobs_list)
    jobs.add_argument("--node", metavar="NODE", help="a node id or name")
    jobs.add_argument("--deployment", metavar="DEPLOYMENT_ID")
    jobs.add_argument("--state", choices=sorted(JOB_STATES), type=str.lower)
    jobs.add_argument("--type", dest="job_type", choices=sorted(JOB_TYPES), type=str.lower)
    jobs.add_argument(
        "--limit",
        type=non_negative,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"the newest N that match (default {DEFAULT_LIMIT}; 0: all)",
    )
    add_output_argument(jobs)
    actions = jobs.add_subparsers(title="commands", metavar="COMMAND")
    show = actions.add_parser(
        "show", parents=[options], help="one job: times, lease, failure or health report"
    )
    show.set_defaults(handler=jobs_show)
    show.add_argument("job_id", metavar="JOB_ID")
    add_output_argument(show)


# ---- rendering (pure) ---------------------------------------------------------------------------


def job_type_label(value: int) -> str:
    return enum_label(control_plane_pb2.ServingJobType.Name(value), "SERVING_JOB_TYPE_")


def job_state_label(value: int) -> str:
    return enum_label(control_plane_pb2.ServingJobState.Name(value), "SERVING_JOB_STATE_")


def _failure_class(value: int) -> str:
    return enum_label(common_pb2.FailureClass.Name(value), "FAILURE_CLASS_")


def _health_status(value: int) -> str:
    return enum_label(worker_gateway_pb2.HealthStatus.Name(value), "HEALTH_STATUS_")


def subject(job: control_plane_pb2.ServingJob) -> str:
    """What the job acts on: a deployment, or the probe or assessment of a pipeline job."""
    if job.deployment_id:
        return job.deployment_id
    if job.probe_id:
        return f"probe {job.probe_id}"
    if job.assessment_id:
        return f"assessment {job.assessment_id}"
    return "-"


def failure_text(failure: common_pb2.Failure) -> str:
    kind = _failure_class(failure.failure_class)
    head = f"{failure.reason} ({kind})" if failure.failure_class else failure.reason
    message = " ".join(failure.message.split())  # one line, whatever the worker put in it
    return f"{head}: {message}" if message else head


def health_text(job: control_plane_pb2.ServingJob) -> str:
    report = job.health
    layers = [
        (name, getattr(report, name))
        for name in ("process", "runtime", "model", "capability")
        if report.HasField(name)
    ]
    text = ", ".join(f"{name} {_health_status(layer.status)}" for name, layer in layers)
    return f"{text} in {report.latency_seconds:.3f}s" if report.latency_seconds else text


def outcome(job: control_plane_pb2.ServingJob) -> str:
    """Why it failed, else its health report, else `-`."""
    if job.HasField("failure") and job.failure.reason:
        return failure_text(job.failure)
    if job.HasField("health"):
        return health_text(job)
    return "-"


def shortened(text: str, width: int) -> str:
    """One line of at most `width` characters, cut with "..." (table cells)."""
    return text if len(text) <= width else text[: width - 3] + "..."


def matching_jobs(
    jobs: Sequence[control_plane_pb2.ServingJob], *, state: str | None, job_type: str | None
) -> list[control_plane_pb2.ServingJob]:
    """The jobs of this state and type (None: any), oldest first."""
    matching = [
        job
        for job in jobs
        if (state is None or job.state == JOB_STATES[state])
        and (job_type is None or job.job_type == JOB_TYPES[job_type])
    ]
    matching.sort(key=lambda job: (job.created_at.ToNanoseconds(), job.job_id))
    return matching


def render_jobs(jobs: Sequence[control_plane_pb2.ServingJob]) -> str:
    rows = [
        [
            job.job_id,
            job_type_label(job.job_type),
            job_state_label(job.state),
            job.node_id or "-",
            subject(job),
            str(job.attempt_count),
            format_timestamp(job.updated_at),
            shortened(outcome(job), _RESULT_WIDTH),
        ]
        for job in jobs
    ]
    headers = ["ID", "TYPE", "STATE", "NODE", "SUBJECT", "ATTEMPTS", "UPDATED", "RESULT"]
    return render_table(headers, rows)


def _when(value: timestamp_pb2.Timestamp) -> str:
    return format_timestamp(value) if value.seconds or value.nanos else "-"


def render_job(job: control_plane_pb2.ServingJob) -> str:
    lines = [
        ("job_id", job.job_id),
        ("type", job_type_label(job.job_type)),
        ("state", job_state_label(job.state)),
        ("node", job.node_id or "-"),
        ("generation", str(job.generation)),
        ("deployment", job.deployment_id or "-"),
        ("residency", job.residency_id or "-"),
    ]
    if job.probe_id:
        lines.append(("probe", job.probe_id))
    if job.assessment_id:
        lines.append(("assessment", job.assessment_id))
    lines += [
        ("attempts", str(job.attempt_count)),
        ("created", _when(job.created_at)),
        ("updated", _when(job.updated_at)),
        ("lease expires", _when(job.lease_expires_at)),
    ]
    if job.HasField("failure") and job.failure.reason:
        lines.append(("failure", failure_text(job.failure)))
        lines += [(f"  {key}", value) for key, value in sorted(job.failure.metadata.items())]
    if job.HasField("health"):
        lines.append(("health", health_text(job)))
        for name in ("process", "runtime", "model", "capability"):
            if job.health.HasField(name):
                layer = getattr(job.health, name)
                detail = f" ({' '.join(layer.detail.split())})" if layer.detail else ""
                lines.append((f"  {name}", f"{_health_status(layer.status)}{detail}"))
    width = max(len(key) for key, _ in lines) + 2
    return "\n".join(f"{key.ljust(width)}{value}" for key, value in lines)


def job_dict(job: control_plane_pb2.ServingJob) -> dict[str, object]:
    # The proto's own field names, as grpcurl and `gantry queue --json` print them.
    return json_format.MessageToDict(job, preserving_proto_field_name=True)


# ---- the commands -------------------------------------------------------------------------------


def resolve_node_id(
    stub: control_plane_pb2_grpc.ControlPlaneStub, node: str, metadata: Metadata
) -> str:
    """A node id as given, or the id of the node with this name."""
    try:
        return str(uuid.UUID(node))
    except ValueError:
        pass
    found = paged(
        stub.ListNodes,
        control_plane_pb2.ListNodesRequest,
        lambda response: response.nodes,
        metadata=metadata,
    )
    for candidate in found:
        if candidate.name == node:
            return str(candidate.node_id)
    raise CliError(f"no node has the id or name {node!r} (see `gantry nodes`)")


def jobs_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        node_id = resolve_node_id(stub, args.node, metadata) if args.node else ""
        deployment_id = args.deployment or ""

        def request(*, page_size: int, page_token: str) -> control_plane_pb2.ListServingJobsRequest:
            return control_plane_pb2.ListServingJobsRequest(
                page_size=page_size,
                page_token=page_token,
                deployment_id=deployment_id,
                node_id=node_id,
            )

        found = list(
            paged(stub.ListServingJobs, request, lambda response: response.jobs, metadata=metadata)
        )
    matching = matching_jobs(found, state=args.state, job_type=args.job_type)
    shown = matching[-args.limit :] if args.limit else matching
    if wants_json(args):
        print(json.dumps([job_dict(job) for job in shown], indent=2))
        return 0
    print(render_jobs(shown))
    hidden = len(matching) - len(shown)
    if hidden:
        print(f"({hidden} older not shown; --limit 0 shows all)", file=sys.stderr)
    return 0


def jobs_show(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        job = control_plane_pb2_grpc.ControlPlaneStub(channel).GetServingJob(
            control_plane_pb2.GetServingJobRequest(job_id=args.job_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    print(json.dumps(job_dict(job), indent=2) if wants_json(args) else render_job(job))
    return 0
