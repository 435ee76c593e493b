"""`gantry reclaim RESIDENCY_ID`: drain, unload and verify one residency (operator token).

Exit 0 only when the worker verified the reclaim (the model host exited) and the residency is
COLD; otherwise 1, with why: UNCERTAIN (the worker could not verify it) or still UNLOADING (the
deadline came first; the reclaim goes on). Rendering is pure: a response in, text out.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from google.protobuf import json_format

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import CommandContext
from gantry.cli.jobs_commands import failure_text, job_state_label
from gantry.cli.tables import enum_label
from gantry.common.arg_types import positive_seconds
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc, worker_gateway_pb2

# The control plane waits at most 60 s for the worker's result; this leaves it room to answer.
DEFAULT_TIMEOUT_S = 65.0


def add_reclaim_arguments(reclaim: CommandSpec) -> None:
    reclaim.set_defaults(handler=reclaim_command)
    reclaim.add_argument("residency_id", metavar="RESIDENCY_ID")
    reclaim.add_argument("--json", action="store_true", help="print the response as JSON")
    reclaim.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the verified reclaim (default {DEFAULT_TIMEOUT_S:g})",
    )


# ---- rendering (pure) ---------------------------------------------------------------------------


def _residency_state(state: int) -> str:
    return enum_label(common_pb2.ResidencyState.Name(state), "RESIDENCY_STATE_")


def evidence_text(evidence: worker_gateway_pb2.UnloadEvidence) -> str:
    if not evidence.pid and not evidence.process_exited:
        return "none reported yet"
    if not evidence.process_exited:
        return f"pid {evidence.pid} did not exit"
    if evidence.has_exit_code:
        return f"pid {evidence.pid} exited with code {evidence.exit_code}"
    if evidence.exit_signal:
        return f"pid {evidence.pid} exited on signal {evidence.exit_signal}"
    return f"pid {evidence.pid} exited"


def verified(response: control_plane_pb2.ReclaimResidencyResponse) -> bool:
    return response.reclaim_verified and (
        response.residency.state == common_pb2.RESIDENCY_STATE_COLD
    )


def why_not_verified(response: control_plane_pb2.ReclaimResidencyResponse) -> str:
    residency = response.residency
    state = _residency_state(residency.state)
    if residency.state == common_pb2.RESIDENCY_STATE_UNLOADING:
        return (
            f"still UNLOADING: the deadline came first and the reclaim goes on "
            f"(`gantry jobs show {response.unload_job.job_id}` follows it)"
        )
    if residency.last_failure.reason:
        return f"{state}: {failure_text(residency.last_failure)}"
    return f"{state}: the worker did not verify the reclaim"


def render_reclaim(response: control_plane_pb2.ReclaimResidencyResponse) -> str:
    residency = response.residency
    job = response.unload_job
    lines = [
        ("residency", residency.residency_id),
        ("deployment", residency.deployment_id or "-"),
        ("node", residency.node_id or "-"),
        ("state", _residency_state(residency.state)),
        ("verified", "yes" if response.reclaim_verified else "no"),
        ("unload job", f"{job.job_id} {job_state_label(job.state)}" if job.job_id else "-"),
        ("evidence", evidence_text(response.evidence)),
    ]
    if not verified(response):
        lines.append(("reason", why_not_verified(response)))
    width = max(len(key) for key, _ in lines) + 2
    return "\n".join(f"{key.ljust(width)}{value}" for key, value in lines)


# ---- the command --------------------------------------------------------------------------------


def reclaim_command(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        try:
            response = control_plane_pb2_grpc.ControlPlaneStub(channel).ReclaimResidency(
                control_plane_pb2.ReclaimResidencyRequest(residency_id=args.residency_id),
                metadata=metadata,
                timeout=args.timeout,
            )
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.NOT_FOUND:
                # The code is the reason here: say it once, with what to look at.
                print(
                    f"error: NOT_FOUND: no residency {args.residency_id} "
                    "(see `gantry status` or `gantry deployments`)",
                    file=sys.stderr,
                )
                return 1
            raise
    if args.json:
        print(json_format.MessageToJson(response, indent=2, preserving_proto_field_name=True))
    else:
        print(render_reclaim(response))
    if verified(response):
        return 0
    print(f"not reclaimed: {why_not_verified(response)}", file=sys.stderr)
    return 1
