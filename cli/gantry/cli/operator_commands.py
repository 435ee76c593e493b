"""Operator commands: artifacts register, deployments, deploy, unload (operator token).

Nodes: node_commands.py; artifacts list and delete: artifact_set_commands.py.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from gantry.cli import deployment_commands
from gantry.cli.artifact_set_commands import add_artifact_set_arguments
from gantry.cli.artifacts import artifact_location, hash_directory
from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, AddCommand, CommandContext, paged
from gantry.cli.deployment_wait import Goal
from gantry.cli.jobs_commands import failure_text, shortened
from gantry.cli.output import add_output_argument, print_json, print_records, wants_json
from gantry.cli.tables import enum_label, format_bytes
from gantry.common.arg_types import non_negative
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

# `gantry deploy --placement`: the CLI's spelling of each PlacementPolicy.
PLACEMENT_POLICIES = {
    "bin-pack": common_pb2.PLACEMENT_POLICY_BIN_PACK,
    "spread": common_pb2.PLACEMENT_POLICY_SPREAD,
}


# Wide enough for a reason and the start of its message; `gantry describe deployment ID` and
# -o json show the whole of it.
_WHY_WIDTH = 80


def _deployment_state(state: int) -> str:
    return enum_label(control_plane_pb2.DeploymentState.Name(state), "DEPLOYMENT_STATE_")


def _residency_state(state: int) -> str:
    return enum_label(common_pb2.ResidencyState.Name(state), "RESIDENCY_STATE_")


# ---- arguments ----------------------------------------------------------------------------------


def add_artifacts_command(
    commands: CommandSpec,
    options: CommandSpec,
) -> None:
    """`gantry artifacts register`, with `list` and `delete` from artifact_set_commands."""
    artifacts = commands.add_parser("artifacts", help="register and list artifact sets")
    actions = artifacts.add_subparsers(title="commands", metavar="COMMAND")
    register = actions.add_parser(
        "register", parents=[options], help="hash a model directory and register it"
    )
    register.set_defaults(handler=artifacts_register)
    register.add_argument("directory", metavar="DIR", help="a directory under the artifact root")
    add_output_argument(register)
    register.add_argument("--name", help="artifact set name (default: the directory name)")
    register.add_argument(
        "--artifact-root",
        help="the servers' artifact root, when not <state-dir>/artifacts",
    )
    register.add_argument(
        "--allow-pickle-weights",
        action="store_true",
        help="accept pickle-based weight files (audited; a profile must allow loading them too)",
    )
    add_artifact_set_arguments(actions, options)


def add_deployments_command(command: AddCommand) -> None:
    parser = command("deployments", deployments, "list deployments and residencies")
    add_output_argument(parser)
    parser.add_argument(
        "--all", action="store_true", help="deleted deployments too (hidden by default)"
    )


def add_deploy_command(command: AddCommand) -> None:
    parser = command("deploy", deploy, "deploy an approved candidate")
    parser.add_argument("approval_id", metavar="APPROVAL_ID")
    parser.add_argument("--capability", required=True, metavar="NAME")
    # uint32 on the wire: a negative count is refused here, as a usage error, not a traceback.
    parser.add_argument("--replicas", type=non_negative, default=1)
    deployment_commands.add_autoscale_bounds_arguments(parser)
    parser.add_argument(
        "--placement",
        choices=sorted(PLACEMENT_POLICIES),
        default="bin-pack",
        help="bin-pack: fill the fullest node that fits; spread: the least loaded node",
    )
    deployment_commands.add_placement_constraint_arguments(parser)
    deployment_commands.add_wait_arguments(parser)
    add_output_argument(parser)


def add_unload_command(command: AddCommand) -> None:
    parser = command("unload", unload, "unload a deployment")
    parser.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    deployment_commands.add_wait_arguments(parser)
    add_output_argument(parser)


# ---- commands -----------------------------------------------------------------------------------


def artifacts_register(context: CommandContext, args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    root = Path(args.artifact_root) if args.artifact_root else context.paths.artifacts
    location = artifact_location(directory, root)
    name = args.name or directory.resolve().name
    metadata = context.operator_metadata()  # before hashing: a missing token should fail fast
    manifest = hash_directory(directory.resolve(), allow_pickle=args.allow_pickle_weights)
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        # Registering is idempotent (the same bytes at the same location are the set already
        # registered); what was there before tells the operator which answer this is.
        known = {
            artifact_set.artifact_set_id
            for artifact_set in paged(
                stub.ListArtifactSets,
                control_plane_pb2.ListArtifactSetsRequest,
                lambda response: response.artifact_sets,
                metadata=metadata,
            )
            if artifact_set.location == location
        }
        registered = stub.RegisterArtifactSet(
            control_plane_pb2.RegisterArtifactSetRequest(
                name=name,
                location=location,
                manifest=manifest,
                allow_pickle_weights=args.allow_pickle_weights,
            ),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if registered.artifact_set_id in known:
        print(
            f"{location} is already registered as {registered.artifact_set_id}"
            f" (same manifest digest {registered.manifest_digest[:16]}…); nothing changed",
            file=sys.stderr,
        )
    if wants_json(args):
        print_json(registered)
        return 0
    size = sum(entry.size_bytes for entry in manifest)
    print(f"artifact_set_id  {registered.artifact_set_id}")
    print(f"manifest_digest  {registered.manifest_digest}")
    print(f"name             {registered.name or name}")
    print(f"location         {registered.location or location}")
    print(f"files            {len(manifest)} ({format_bytes(size)})")
    return 0


def deployments(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(
            paged(
                stub.ListDeployments,
                # --all: the deleted ones too (the server hides them otherwise).
                functools.partial(
                    control_plane_pb2.ListDeploymentsRequest,
                    include_deleted=getattr(args, "all", False),
                ),
                lambda response: response.deployments,
                metadata=metadata,
            )
        )
    print_records(
        args,
        found,
        ["ID", "CAPABILITY", "STATE", "READY/WANTED", "NODE", "RESIDENCY", "WHY NOT ALL READY"],
        lambda deployment: [
            deployment.deployment_id,
            deployment.capability,
            _deployment_state(deployment.state)
            + ("/deleted" if deployment.HasField("deleted_at") else ""),
            f"{_resident(deployment)}/{deployment.replicas}",
            ",".join(r.node_id for r in _placed(deployment)) or "-",
            ",".join(_residency_state(r.state) for r in _placed(deployment)) or "-",
            _why_not_all_ready(deployment),
        ],
    )
    return 0


def _resident(deployment: control_plane_pb2.Deployment) -> int:
    return sum(r.state == common_pb2.RESIDENCY_STATE_RESIDENT for r in deployment.residencies)


def _why_not_all_ready(deployment: control_plane_pb2.Deployment) -> str:
    """The last failure, while the deployment serves from fewer replicas than it asked for (a
    PENDING one waiting for room says NO_CAPACITY and each node's reason); `-` once all serve."""
    failure = deployment.last_failure
    if _resident(deployment) >= deployment.replicas or not failure.reason:
        return "-"
    return shortened(failure_text(failure), _WHY_WIDTH)


def _placed(deployment: control_plane_pb2.Deployment) -> list[common_pb2.Residency]:
    # COLD residencies are history (a restart, a drained node): `gantry describe` shows them.
    return [r for r in deployment.residencies if r.state != common_pb2.RESIDENCY_STATE_COLD]


def deploy(context: CommandContext, args: argparse.Namespace) -> int:
    """Deploy an approved candidate: the artifact set, adapter and environment come from the
    approval's profile, so nothing reaches serving without passing every gate."""
    metadata = context.operator_metadata()
    request = control_plane_pb2.CreateDeploymentRequest(
        approval_id=args.approval_id,
        capability=args.capability,
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        placement_policy=PLACEMENT_POLICIES[args.placement],
        constraints=deployment_commands.placement_constraints(args),
    )
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        deployment = stub.CreateDeployment(request, metadata=metadata, timeout=DEFAULT_TIMEOUT_S)
        bound = "bound" if deployment.bound else "not bound yet: serves once it is READY"
        print(
            f"deployment {deployment.deployment_id} ({deployment.capability}, {bound}):"
            f" {_deployment_state(deployment.state)}",
            # With --output json, stdout holds the JSON only: this line goes with the progress.
            file=sys.stderr if wants_json(args) else sys.stdout,
            flush=True,
        )
        # --wait (the default): until READY with its replicas resident, or its failure (exit 1).
        settled = deployment_commands.settle(stub, metadata, deployment, args, goal=Goal.READY)
    if wants_json(args):
        print_json(settled)
    elif not args.no_wait:
        print(deployment_commands.summary(settled))
    return 0


def unload(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        deployment = stub.UnloadDeployment(
            control_plane_pb2.UnloadDeploymentRequest(deployment_id=args.deployment_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
        # --wait (the default): until UNLOADED, every model host's exit confirmed.
        deployment = deployment_commands.settle(
            stub, metadata, deployment, args, goal=Goal.UNLOADED
        )
    if wants_json(args):
        print_json(deployment)
        return 0
    print(f"deployment {deployment.deployment_id}: {_deployment_state(deployment.state)}")
    return 0
