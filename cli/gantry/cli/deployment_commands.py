"""A deployment's lifecycle from the CLI: restart, scale, drain, delete, and `--wait` for the ones
that start work (deploy and unload live in operator_commands.py and wait with the same options).

Waiting follows the deployment until it settles (deployment_wait.py), saying each change on
stderr; a failure prints its reason and message and exits 1, and so does a timeout.
"""

from __future__ import annotations

import argparse
import re
import sys

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, Metadata
from gantry.cli.delete_commands import add_delete_kind
from gantry.cli.deployment_wait import Goal, deployment_state, wait_for_deployment
from gantry.cli.output import add_output_argument, print_json, wants_json
from gantry.common.arg_types import non_negative, positive, positive_seconds
from gantry.common.node_labels import FORMAT as LABEL_FORMAT
from gantry.common.node_labels import is_node_label
from gantry.common.resource_declaration import parse_size
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

DEFAULT_WAIT_S = 600.0

Stub = control_plane_pb2_grpc.ControlPlaneStub


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_wait_arguments(parser: CommandSpec) -> None:
    """`--wait` (the default) / `--no-wait`, and `--wait-timeout SECONDS`."""
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--wait",
        dest="no_wait",
        action="store_false",
        help="wait until the deployment settles (the default)",
    )
    choice.add_argument(
        "--no-wait", dest="no_wait", action="store_true", help="start it and return at once"
    )
    parser.set_defaults(no_wait=False)
    parser.add_argument(
        "--wait-timeout",
        type=positive_seconds,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait (default {DEFAULT_WAIT_S:g})",
    )


def summary(deployment: control_plane_pb2.Deployment) -> str:
    resident = sum(r.state == common_pb2.RESIDENCY_STATE_RESIDENT for r in deployment.residencies)
    deleted = ", deleted" if deployment.HasField("deleted_at") else ""
    return (
        f"deployment {deployment.deployment_id} ({deployment.capability}):"
        f" {deployment_state(deployment)}{deleted}, {resident}/{deployment.replicas} resident"
    )


def settle(
    stub: Stub,
    metadata: Metadata,
    deployment: control_plane_pb2.Deployment,
    args: argparse.Namespace,
    *,
    goal: Goal,
) -> control_plane_pb2.Deployment:
    """The deployment once settled (or as it is, with --no-wait); CliError when it will not."""
    if args.no_wait:
        return deployment
    return wait_for_deployment(
        stub,
        metadata,
        deployment.deployment_id,
        goal=goal,
        timeout_s=args.wait_timeout,
        say=_say,
    )


def _show(args: argparse.Namespace, deployment: control_plane_pb2.Deployment) -> int:
    if wants_json(args):
        print_json(deployment)
    else:
        print(summary(deployment))
    return 0


def restart(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        restarted = stub.RestartDeployment(
            control_plane_pb2.RestartDeploymentRequest(deployment_id=args.deployment_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
        _say(f"deployment {restarted.deployment_id} restarted: {deployment_state(restarted)}")
        return _show(args, settle(stub, metadata, restarted, args, goal=Goal.READY))


def scale(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        scaled = stub.ScaleDeployment(
            control_plane_pb2.ScaleDeploymentRequest(
                deployment_id=args.deployment_id,
                replicas=args.replicas,
                min_replicas=args.min_replicas,
                max_replicas=args.max_replicas,
            ),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
        _say(
            f"deployment {scaled.deployment_id} scaled to {scaled.replicas} replica(s)"
            f" (min {scaled.min_replicas}, max {scaled.max_replicas})"
        )
        return _show(args, settle(stub, metadata, scaled, args, goal=Goal.READY))


def drain(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        drained = stub.DrainDeployment(
            control_plane_pb2.DrainDeploymentRequest(
                deployment_id=args.deployment_id, deadline_seconds=args.deadline or 0
            ),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
        _say(f"deployment {drained.deployment_id} draining: {deployment_state(drained)}")
        # --wait (the default): until UNLOADED, every call finished (or cut at the deadline)
        # and every model host's exit confirmed.
        return _show(args, settle(stub, metadata, drained, args, goal=Goal.UNLOADED))


def delete_deployment(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        deleted = control_plane_pb2_grpc.ControlPlaneStub(channel).DeleteDeployment(
            control_plane_pb2.DeleteDeploymentRequest(deployment_id=args.object_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    return _show(args, deleted)


add_delete_kind(
    "deployment",
    delete_deployment,
    "delete an UNLOADED or FAILED deployment (kept with its history; its binding is removed)",
    id_metavar="DEPLOYMENT_ID",
)


def add_restart_arguments(parser: CommandSpec) -> None:
    parser.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    add_wait_arguments(parser)
    add_output_argument(parser)


def add_drain_arguments(parser: CommandSpec) -> None:
    parser.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    parser.add_argument(
        "--deadline",
        type=positive,
        default=None,
        metavar="SECONDS",
        help="how long calls in flight may take to finish before they are cut (the server's"
        " default 30, at most 3600)",
    )
    add_wait_arguments(parser)
    add_output_argument(parser)


def add_scale_arguments(parser: CommandSpec) -> None:
    parser.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    # uint32 on the wire: a negative count is a usage error here; 0 is the server's to refuse.
    parser.add_argument("--replicas", type=non_negative, required=True, metavar="N")
    add_autoscale_bounds_arguments(parser)
    add_wait_arguments(parser)
    add_output_argument(parser)


_COMPUTE_CAPABILITY = re.compile(r"\d{1,2}\.\d{1,2}")


def byte_size(text: str) -> int:
    """Bytes from "8GiB", "512MiB", "1.5GB" or plain bytes."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def compute_capability(text: str) -> str:
    if not _COMPUTE_CAPABILITY.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not major.minor (e.g. 8.0)")
    return text


def node_label(text: str) -> str:
    if not is_node_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not {LABEL_FORMAT}")
    return text


def add_placement_constraint_arguments(parser: CommandSpec) -> None:
    """What a node must offer a replica beyond its adapter's needs (`gantry deploy`): none met by
    any node, the deployment waits PENDING with each node's reason."""
    parser.add_argument(
        "--gpu-model",
        metavar="NAME",
        default="",
        help="a part of the GPU's name as NVML gives it, any case (H100, A10G)",
    )
    parser.add_argument(
        "--min-compute-capability",
        type=compute_capability,
        default=None,
        metavar="MAJOR.MINOR",
        help="the GPU's CUDA compute capability is at least this (8.0)",
    )
    parser.add_argument(
        "--min-free-vram",
        type=byte_size,
        default=0,
        metavar="SIZE",
        help="the GPU has at least this much VRAM that placement has not given away (8GiB)",
    )
    parser.add_argument(
        "--node-label",
        dest="node_labels",
        action="append",
        type=node_label,
        default=[],
        metavar="KEY=VALUE",
        help="a label the node's worker was started with (--label), repeatable",
    )


def placement_constraints(args: argparse.Namespace) -> common_pb2.PlacementConstraints:
    return common_pb2.PlacementConstraints(
        gpu_model=args.gpu_model,
        min_compute_capability=args.min_compute_capability or "",
        min_free_vram_bytes=args.min_free_vram,
        node_labels=list(args.node_labels or ()),
    )


def add_autoscale_bounds_arguments(parser: CommandSpec) -> None:
    """--min-replicas and --max-replicas: shared by `gantry deploy` and `gantry scale`."""
    parser.add_argument(
        "--min-replicas",
        type=non_negative,
        default=0,
        metavar="N",
        help="autoscale floor (default: replicas)",
    )
    parser.add_argument(
        "--max-replicas",
        type=non_negative,
        default=0,
        metavar="N",
        help="autoscale ceiling (default: replicas)",
    )
