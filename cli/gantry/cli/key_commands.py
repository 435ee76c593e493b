"""`gantry keys`: create, list and revoke client API keys (the keys `Inference` calls carry).

A key is shown once (only its hash is stored): `create` prints it, or writes it to a file kept
private (0600) with --key-file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import DEFAULT_TIMEOUT_S, CommandContext, paged
from gantry.cli.errors import CliError
from gantry.cli.output import (
    add_output_argument,
    print_json,
    print_records,
    print_secret_record,
    wants_json,
)
from gantry.cli.state import write_secret
from gantry.cli.tables import format_timestamp
from gantry.v1 import control_plane_pb2, control_plane_pb2_grpc

HEADERS = ["ID", "TENANT", "NAME", "CREATED", "REVOKED"]


def add_keys_arguments(keys: CommandSpec, options: CommandSpec) -> None:
    """`gantry keys [list]`, `gantry keys create`, `gantry keys revoke`."""
    keys.set_defaults(handler=keys_list)
    _add_list_options(keys)
    actions = keys.add_subparsers(title="commands", metavar="COMMAND")
    listing = actions.add_parser("list", parents=[options], help="client API keys (no secrets)")
    listing.set_defaults(handler=keys_list)
    _add_list_options(listing)
    create = actions.add_parser(
        "create", parents=[options], help="a new client API key for a tenant (shown once)"
    )
    create.set_defaults(handler=keys_create)
    create.add_argument("--tenant", required=True, metavar="TENANT", help="created on first use")
    create.add_argument("--name", default="", help="what the key is for (default: default)")
    create.add_argument(
        "--key-file",
        type=Path,
        metavar="PATH",
        help="write the key to PATH (mode 0600) instead of printing it",
    )
    add_output_argument(create)
    revoke = actions.add_parser(
        "revoke", parents=[options], help="revoke a key: calls with it are refused from now on"
    )
    revoke.set_defaults(handler=keys_revoke)
    revoke.add_argument("api_key_id", metavar="API_KEY_ID")
    add_output_argument(revoke)


def _add_list_options(parser: CommandSpec) -> None:
    parser.add_argument("--tenant", metavar="TENANT", help="only this tenant's keys")
    add_output_argument(parser)


def key_row(key: control_plane_pb2.ApiKey) -> list[str]:
    revoked = format_timestamp(key.revoked_at) if key.HasField("revoked_at") else "-"
    return [key.api_key_id, key.tenant_id, key.name, format_timestamp(key.created_at), revoked]


def keys_list(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    tenant_id = getattr(args, "tenant", None) or ""

    def request(*, page_size: int, page_token: str) -> control_plane_pb2.ListApiKeysRequest:
        return control_plane_pb2.ListApiKeysRequest(
            page_size=page_size, page_token=page_token, tenant_id=tenant_id
        )

    with context.open_channel() as channel:
        stub = control_plane_pb2_grpc.ControlPlaneStub(channel)
        found = list(paged(stub.ListApiKeys, request, lambda r: r.api_keys, metadata=metadata))
    print_records(args, found, HEADERS, key_row)
    return 0


def keys_create(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    key_file: Path | None = args.key_file
    if key_file is not None and key_file.exists():
        # Checked before the key is made: it is shown once, and never over another key.
        raise CliError(f"{key_file} exists; a key is never written over another one")
    with context.open_channel() as channel:
        created = control_plane_pb2_grpc.ControlPlaneStub(channel).CreateApiKey(
            control_plane_pb2.CreateApiKeyRequest(tenant_id=args.tenant, name=args.name),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if key_file is not None:
        write_secret(key_file, created.api_key)
    print_secret_record(
        args,
        created,
        secret_field="api_key",
        fields=[("api_key_id", created.api_key_id), ("tenant", created.tenant_id)],
        written_to=key_file,
    )
    print(
        "The key is shown only once (only its hash is stored); clients send it as"
        " `authorization: Bearer KEY` on Inference calls.",
        file=sys.stderr,
    )
    return 0


def keys_revoke(context: CommandContext, args: argparse.Namespace) -> int:
    metadata = context.operator_metadata()
    with context.open_channel() as channel:
        key = control_plane_pb2_grpc.ControlPlaneStub(channel).RevokeApiKey(
            control_plane_pb2.RevokeApiKeyRequest(api_key_id=args.api_key_id),
            metadata=metadata,
            timeout=DEFAULT_TIMEOUT_S,
        )
    if wants_json(args):
        print_json(key)
    else:
        print(f"API key {key.api_key_id} of tenant {key.tenant_id} revoked")
    return 0
