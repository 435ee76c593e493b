"""`gantry endpoints`: adopt an OpenAI-compatible server that runs outside Gantry, and list the
adopted ones.

A server's credential is never taken on the command line (it would sit in shell history and in
`ps`): --credential-file reads it from a file, `-` from stdin. It is never printed back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, paged
from gantry.cli.errors import CliError
from gantry.cli.output import add_output_argument, print_json, print_records, wants_json
from gantry.cli.tables import enum_label, format_timestamp, render_table
from gantry.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

HEADERS = [
    "ID",
    "DEPLOYMENT",
    "CAPABILITY",
    "NODE",
    "URL",
    "MODEL",
    "STATE",
    "CREDENTIAL",
    "ADOPTED AT",
]


def add_endpoints_arguments(endpoints: CommandSpec, options: CommandSpec) -> None:
    """`gantry endpoints [list]`, `gantry endpoints adopt`."""
    endpoints.set_defaults(handler=endpoints_list)
    _add_list_options(endpoints)
    actions = endpoints.add_subparsers(title="commands", metavar="COMMAND")
    listing = actions.add_parser("list", parents=[options], help="adopted endpoints (no secrets)")
    listing.set_defaults(handler=endpoints_list)
    _add_list_options(listing)
    adopt = actions.add_parser(
        "adopt",
        parents=[options],
        help="route a capability to a server Gantry never starts or stops",
    )
    adopt.set_defaults(handler=endpoints_adopt)
    adopt.add_argument("--node", required=True, help="the node (id or name) whose worker calls it")
    adopt.add_argument(
        "--url", required=True, help="its base URL on that node, e.g. http://127.0.0.1:8080/v1"
    )
    adopt.add_argument("--model", required=True, help="the model name it lists at /v1/models")
    adopt.add_argument("--capability", required=True, help="the capability clients call")
    adopt.add_argument(
        "--credential-file",
        metavar="PATH",
        help="a file holding its bearer token ('-': read it from stdin)",
    )
    adopt.add_argument("--max-concurrency", type=int, default=0, help="calls at once (default 8)")
    adopt.add_argument("--max-new-tokens", type=int, default=0, help="per-call token bound")
    add_output_argument(adopt)


def _add_list_options(parser: CommandSpec) -> None:
    parser.add_argument("--include-deleted", action="store_true", help="forgotten ones too")
    add_output_argument(parser)


def endpoint_row(endpoint: common_pb2.AdoptedEndpoint) -> list[str]:
    return [
        endpoint.endpoint_id,
        endpoint.deployment_id,
        endpoint.capability,
        endpoint.node_id,
        endpoint.url,
        endpoint.model,
        enum_label(common_pb2.ResidencyState.Name(endpoint.state), "RESIDENCY_STATE_"),
        "sealed" if endpoint.has_credential else "-",
        format_timestamp(endpoint.created_at),
    ]


def endpoints_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    include_deleted = bool(getattr(args, "include_deleted", False))

    def request(*, page_size: int, page_token: str) -> control_plane_pb2.ListEndpointsRequest:
        return control_plane_pb2.ListEndpointsRequest(
            page_size=page_size, page_token=page_token, include_deleted=include_deleted
        )

    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(paged(stub.ListEndpoints, request, lambda r: r.endpoints, metadata=metadata))
    print_records(args, found, HEADERS, endpoint_row)
    return 0


def read_credential(source: str | None) -> str:
    """The token from a file or stdin, stripped of surrounding whitespace; "" without one."""
    if source is None:
        return ""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read the credential file {source}: {exc.strerror}") from None
    credential = text.strip()
    if not credential:
        raise CliError(f"the credential file {source} is empty")
    return credential


def endpoints_adopt(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    request = control_plane_pb2.AdoptEndpointRequest(
        node=args.node,
        url=args.url,
        model=args.model,
        capability=args.capability,
        credential=read_credential(args.credential_file),
        max_concurrency=max(0, args.max_concurrency),
        max_new_tokens=max(0, args.max_new_tokens),
    )
    with context.open_channel() as channel:
        residency = control_plane_pb2_grpc.ControlPlaneStub(channel).AdoptEndpoint(
            request, metadata=metadata, timeout=DEFAULT_TIMEOUT_S
        )
    if wants_json(args):
        print_json(residency)
        return 0
    endpoint = residency.endpoint
    print(
        render_table(
            ["RESIDENCY", "DEPLOYMENT", "NODE", "URL", "MODEL", "STATE"],
            [
                [
                    residency.residency_id,
                    residency.deployment_id,
                    residency.node_id,
                    endpoint.url,
                    endpoint.model,
                    enum_label(common_pb2.ResidencyState.Name(residency.state), "RESIDENCY_STATE_"),
                ]
            ],
        )
    )
    print(
        f"Adopted: Gantry routes {args.capability!r} to it once its worker reports it RESIDENT, "
        "and never starts or stops it (`gantry unload` only forgets it).",
        file=sys.stderr,
    )
    return 0
