"""`gantry nodes`: list, register, drain, enable, rotate-credential and delete worker nodes.

A node credential is shown once (only its hash is stored): `register` and `rotate-credential`
print it, or write it to a file kept private (0600) with --credential-file, and say how the
node's worker is given it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, paged
from gantry.cli.delete_commands import add_delete_kind
from gantry.cli.errors import CliError
from gantry.cli.jobs_commands import resolve_node_id
from gantry.cli.output import (
    add_output_argument,
    print_json,
    print_records,
    print_secret_record,
    wants_json,
)
from gantry.cli.state import write_secret
from gantry.cli.tables import enum_label, format_timestamp
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

DEFAULT_DRAIN_WAIT_S = 300.0
POLL_INTERVAL_S = 0.5
REMIND_EVERY_S = 5.0


def add_nodes_arguments(nodes: CommandSpec, options: CommandSpec) -> None:
    """`gantry nodes [list]` and its actions; with no action it lists, as it always did."""
    nodes.set_defaults(handler=nodes_list)
    _add_list_options(nodes)
    actions = nodes.add_subparsers(title="commands", metavar="COMMAND")

    def action(name: str, handler: object, help_text: str) -> CommandSpec:
        sub = actions.add_parser(name, parents=[options], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    _add_list_options(action("list", nodes_list, "list worker nodes (deleted ones with --all)"))

    _add_register_arguments(
        action("register", nodes_register, "register a node: prints its id and credential (once)")
    )
    _add_drain_arguments(
        action(
            "drain",
            nodes_drain,
            "disable a node: unload what it runs (re-placed elsewhere), refuse its worker",
        )
    )

    enable = action("enable", nodes_enable, "let a disabled (drained) node take work again")
    enable.add_argument("node", metavar="NODE", help="a node id or name")

    rotate = action(
        "rotate-credential",
        nodes_rotate_credential,
        "a new credential for a node (shown once); the old one stops working at once",
    )
    rotate.add_argument("node", metavar="NODE", help="a node id or name")
    _add_credential_options(rotate)

    delete = action(
        "delete",
        nodes_delete,
        "delete a drained node (refused while it runs anything); its credential stops working",
    )
    add_delete_node_arguments(delete)


def _add_register_arguments(register: CommandSpec) -> None:
    register.add_argument("name", metavar="NAME")
    register.add_argument(
        "--label",
        dest="labels",
        action="append",
        default=[],
        type=_label,
        metavar="KEY=VALUE",
        help="a label placement may require (repeatable)",
    )
    _add_credential_options(register)


def _add_drain_arguments(drain: CommandSpec) -> None:
    drain.add_argument("node", metavar="NODE", help="a node id or name")
    drain.add_argument("--reason", default="", help="why (recorded, shown on the node)")
    drain.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait until every residency on the node is COLD (default: wait)",
    )
    drain.add_argument(
        "--wait-timeout",
        type=float,
        default=DEFAULT_DRAIN_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait (default {DEFAULT_DRAIN_WAIT_S:g})",
    )


def add_delete_node_arguments(parser: CommandSpec) -> None:
    """NODE and --output: shared by `gantry nodes delete` and a `gantry delete node` kind."""
    parser.add_argument("node", metavar="NODE", help="a node id or name")
    add_output_argument(parser)


def _add_list_options(parser: CommandSpec) -> None:
    parser.add_argument("--all", action="store_true", help="deleted nodes too")
    add_output_argument(parser)


def _add_credential_options(parser: CommandSpec) -> None:
    parser.add_argument(
        "--credential-file",
        type=Path,
        metavar="PATH",
        help="write the credential to PATH (mode 0600) instead of printing it",
    )
    add_output_argument(parser)


def _label(text: str) -> tuple[str, str]:
    key, separator, value = text.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"a label is KEY=VALUE, not {text!r}")
    return key, value


# ---- rendering (pure) ---------------------------------------------------------------------------


def node_state(state: int) -> str:
    return enum_label(common_pb2.NodeState.Name(state), "NODE_STATE_")


def residency_state(state: int) -> str:
    return enum_label(common_pb2.ResidencyState.Name(state), "RESIDENCY_STATE_")


def node_row(node: control_plane_pb2.Node) -> list[str]:
    row = [
        node.node_id,
        node.name,
        node_state(node.state),
        str(node.generation),
        format_timestamp(node.last_seen_at),
    ]
    if node.HasField("deleted_at"):
        row[2] = f"DELETED ({row[2]})"
    return row


def warm_residencies(
    deployments: Sequence[control_plane_pb2.Deployment], node_id: str
) -> list[common_pb2.Residency]:
    """The residencies on the node that are not COLD yet: what a drain waits for."""
    return [
        residency
        for deployment in deployments
        for residency in deployment.residencies
        if residency.node_id == node_id and residency.state != common_pb2.RESIDENCY_STATE_COLD
    ]


def drain_status(residencies: Sequence[common_pb2.Residency]) -> str:
    """One line: each residency still on the node, its deployment and state (and failure)."""
    parts = []
    for residency in residencies:
        part = f"{residency.deployment_id} {residency_state(residency.state)}"
        if residency.last_failure.reason:
            part += f" ({residency.last_failure.reason}: {residency.last_failure.message})"
        parts.append(part)
    return "; ".join(parts)


def credential_notes(
    node: control_plane_pb2.Node, *, address: str, written_to: Path | None
) -> list[str]:
    """What an operator does with a node credential (printed on stderr)."""
    where = str(written_to) if written_to is not None else "FILE"
    notes = [
        "The credential is shown only once (only its hash is stored); keep it private.",
        f"Give it to node {node.name}'s worker as a file only that worker can read:",
        f"  gantry worker --control-plane {address} --credential-file {where} --artifact-root DIR",
    ]
    if written_to is None:
        notes.insert(1, "Save it, e.g. with --credential-file PATH next time (mode 0600).")
    return notes


# ---- the commands -------------------------------------------------------------------------------


def _stub(channel: grpc.Channel) -> control_plane_pb2_grpc.ControlPlaneStub:
    return control_plane_pb2_grpc.ControlPlaneStub(channel)


def nodes_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    include_deleted = bool(getattr(args, "all", False))

    def request(*, page_size: int, page_token: str) -> control_plane_pb2.ListNodesRequest:
        return control_plane_pb2.ListNodesRequest(
            page_size=page_size, page_token=page_token, include_deleted=include_deleted
        )

    with context.open_channel() as channel:
        found = list(paged(_stub(channel).ListNodes, request, lambda r: r.nodes, metadata=metadata))
    print_records(args, found, ["ID", "NAME", "STATE", "GENERATION", "LAST SEEN"], node_row)
    return 0


def _show_credential(
    context: CommandContext,
    args: argparse.Namespace,
    response: control_plane_pb2.RegisterNodeResponse,
    *,
    verb: str,
) -> int:
    written_to: Path | None = args.credential_file
    if written_to is not None:
        write_secret(written_to, response.credential)
    print_secret_record(
        args,
        response,
        secret_field="credential",
        fields=[("node_id", response.node.node_id), ("name", response.node.name)],
        written_to=written_to,
    )
    print(f"node {response.node.name} {verb}.", file=sys.stderr)
    for line in credential_notes(response.node, address=context.address, written_to=written_to):
        print(line, file=sys.stderr)
    return 0


def _refuse_existing_file(path: Path | None) -> None:
    if path is not None and path.exists():
        raise CliError(f"{path} exists; a credential is never written over another one")


def nodes_register(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    _refuse_existing_file(args.credential_file)  # before registering: the credential shows once
    with context.open_channel() as channel:
        response = _stub(channel).RegisterNode(
            control_plane_pb2.RegisterNodeRequest(name=args.name, labels=dict(args.labels)),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    return _show_credential(context, args, response, verb="registered")


def nodes_rotate_credential(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = _stub(channel)
        node_id = resolve_node_id(stub, args.node, metadata)
        response = stub.RotateNodeCredential(
            control_plane_pb2.RotateNodeCredentialRequest(node_id=node_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    # Written over the old file on purpose: the old credential no longer works anyway.
    return _show_credential(context, args, response, verb="has a new credential")


def nodes_enable(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = _stub(channel)
        node = stub.EnableNode(
            control_plane_pb2.EnableNodeRequest(node_id=resolve_node_id(stub, args.node, metadata)),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    print(f"node {node.node_id} ({node.name}): {node_state(node.state)}")
    return 0


def nodes_delete(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = _stub(channel)
        node = stub.DeleteNode(
            control_plane_pb2.DeleteNodeRequest(node_id=resolve_node_id(stub, args.node, metadata)),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print_json(node)
    else:
        print(
            f"node {node.node_id} ({node.name}) deleted: its credential no longer works;"
            " a new node may register under this name"
        )
    return 0


def nodes_drain(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        stub = _stub(channel)
        node_id = resolve_node_id(stub, args.node, metadata)
        node = stub.DisableNode(
            control_plane_pb2.DisableNodeRequest(node_id=node_id, reason=args.reason),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
        print(f"node {node.node_id} ({node.name}): {node_state(node.state)}", file=sys.stderr)
        if args.wait:
            _wait_drained(stub, metadata, node, timeout_s=args.wait_timeout)
    print(f"node {node.node_id} ({node.name}) drained: {node_state(node.state)}")
    return 0


def _wait_drained(
    stub: control_plane_pb2_grpc.ControlPlaneStub,
    metadata: Sequence[tuple[str, str]],
    node: control_plane_pb2.Node,
    *,
    timeout_s: float,
) -> None:
    """Poll until no residency on the node is warm; progress on stderr, CliError on timeout."""
    started = time.monotonic()
    said, said_at = "", started
    while True:
        deployments = list(
            paged(
                stub.ListDeployments,
                control_plane_pb2.ListDeploymentsRequest,
                lambda response: response.deployments,
                metadata=metadata,
            )
        )
        warm = warm_residencies(deployments, node.node_id)
        if not warm:
            return
        status = drain_status(warm)
        elapsed = time.monotonic() - started
        if status != said or time.monotonic() - said_at >= REMIND_EVERY_S:
            print(
                f"waiting for {len(warm)} residency(ies): {status} ({elapsed:.0f}s)",
                file=sys.stderr,
            )
            said, said_at = status, time.monotonic()
        if elapsed >= timeout_s:
            raise CliError(
                f"node {node.node_id} is not drained after {timeout_s:g}s: {status}"
                " (the drain goes on; `gantry nodes drain NODE` again to wait more)"
            )
        time.sleep(POLL_INTERVAL_S)


def _delete_node_kind(context: CommandContext, args: argparse.Namespace) -> int:
    args.node = args.object_id  # `gantry delete node NODE` is `gantry nodes delete NODE`
    return nodes_delete(context, args)


add_delete_kind(
    "node",
    _delete_node_kind,
    "delete a drained node (kept with its history; its credential stops working)",
    id_metavar="NODE",
)
