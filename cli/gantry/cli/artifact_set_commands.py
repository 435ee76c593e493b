"""`gantry artifacts list [--all]` and `gantry artifacts delete ARTIFACT_SET_ID`.

Deleting an artifact set removes its record from lists and from new work; the files under the
artifact root are the operator's and are never touched.
"""

from __future__ import annotations

import argparse

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, paged
from gantry.cli.delete_commands import add_delete_kind
from gantry.cli.output import add_output_argument, print_json, print_records, wants_json
from gantry.cli.tables import format_bytes
from gantry.v1 import control_plane_pb2, control_plane_pb2_grpc

HEADERS = ["ID", "NAME", "LOCATION", "FILES", "SIZE", "DIGEST"]


def add_artifact_set_arguments(
    actions: CommandSpec,
    options: CommandSpec,
) -> None:
    """`list` and `delete` under `gantry artifacts` (whose `register` is operator_commands.py's)."""
    listing = actions.add_parser(
        "list", parents=[options], help="list artifact sets (deleted ones with --all)"
    )
    listing.set_defaults(handler=artifacts_list)
    listing.add_argument("--all", action="store_true", help="deleted artifact sets too")
    add_output_argument(listing)
    delete = actions.add_parser(
        "delete",
        parents=[options],
        help="delete an artifact set no deployment uses (the files on disk are kept)",
    )
    delete.set_defaults(handler=artifacts_delete)
    add_delete_artifact_set_arguments(delete)


def add_delete_artifact_set_arguments(parser: CommandSpec) -> None:
    """ARTIFACT_SET_ID and --output: shared by `gantry artifacts delete` and `gantry delete`."""
    parser.add_argument("artifact_set_id", metavar="ARTIFACT_SET_ID")
    add_output_argument(parser)


def artifact_set_row(artifact_set: control_plane_pb2.ArtifactSet) -> list[str]:
    name = artifact_set.name
    if artifact_set.HasField("deleted_at"):
        name += " (deleted)"
    return [
        artifact_set.artifact_set_id,
        name,
        artifact_set.location,
        str(artifact_set.file_count),
        format_bytes(artifact_set.total_size_bytes),
        artifact_set.manifest_digest[:16],
    ]


def artifacts_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    include_deleted = bool(getattr(args, "all", False))

    def request(*, page_size: int, page_token: str) -> control_plane_pb2.ListArtifactSetsRequest:
        return control_plane_pb2.ListArtifactSetsRequest(
            page_size=page_size, page_token=page_token, include_deleted=include_deleted
        )

    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(
            paged(stub.ListArtifactSets, request, lambda r: r.artifact_sets, metadata=metadata)
        )
    print_records(args, found, HEADERS, artifact_set_row)
    return 0


def artifacts_delete(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        deleted = control_plane_pb2_grpc.ControlPlaneStub(channel).DeleteArtifactSet(
            control_plane_pb2.DeleteArtifactSetRequest(artifact_set_id=args.artifact_set_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print_json(deleted)
    else:
        print(
            f"artifact set {deleted.artifact_set_id} ({deleted.name}) deleted; the files under"
            f" {deleted.location} were not touched"
        )
    return 0


def _delete_artifact_set_kind(context: CommandContext, args: argparse.Namespace) -> int:
    args.artifact_set_id = args.object_id  # `gantry delete artifacts ID` = `artifacts delete ID`
    return artifacts_delete(context, args)


add_delete_kind(
    "artifacts",
    _delete_artifact_set_kind,
    "delete an artifact set no deployment uses (the files on disk are not touched)",
    id_metavar="ARTIFACT_SET_ID",
)
