"""The `gantry` entry point: global options, subcommands, and one-line error reporting."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from gantry.cli import (
    bench_command,
    check_command,
    delete_commands,
    deployment_commands,
    describe_commands,
    embed,
    endpoint_commands,
    events_commands,
    generate_command,
    inventory_commands,
    jobs_commands,
    key_commands,
    media_commands,
    migrate,
    node_commands,
    operator_commands,
    pipeline_commands,
    queue_commands,
    reclaim_command,
    status_commands,
    tenant_commands,
    transcribe_command,
)
from gantry.cli.bootstrap import DEVICE_CHOICES, parse_device
from gantry.cli.click_parser import CommandSpec
from gantry.cli.connection import (
    ADDRESS_ENV,
    DEFAULT_ADDRESS,
    AddCommand,
    CommandContext,
    Handler,
    command_address,
    command_tls,
)
from gantry.cli.errors import CliError, format_gantry_error, format_rpc_error
from gantry.cli.roles import ROLE_HELP, ROLES, run_role
from gantry.cli.state import DEFAULT_STATE_DIR, STATE_DIR_ENV, locate_state_dir
from gantry.common.arg_types import positive
from gantry.common.errors import GantryError
from gantry.common.tls import TlsSettingsError, add_client_tls_arguments

# The installed distribution (cli/pyproject.toml) whose version `gantry --version` reports.
DISTRIBUTION = "gantry-cli"
_GLOBAL_OPTIONS = (
    "--address",
    "--state-dir",
    "--tls-ca",
    "--tls-cert",
    "--tls-key",
    "--tls-server-name",
)


def _up(context: CommandContext, args: argparse.Namespace) -> int:
    from gantry.cli.up import UpSettings, run_up  # only `up` needs the supervisor machinery
    from gantry.cli.up_plan import replica_database_url

    if "," in context.address:
        raise CliError(f"gantry up listens on one --address, not a list: {context.address}")
    if args.resource_domains:
        # Refused before anything starts, in the worker's own words: the grammar is shared.
        from gantry.common.resource_declaration import ResourceDomainError, parse_declaration

        try:
            parse_declaration(args.resource_domains)
        except ResourceDomainError as exc:
            raise CliError(f"--resource-domain: {exc}") from None
    return run_up(
        UpSettings(
            paths=context.paths,
            address=context.address,
            scheduler_address=args.scheduler_address,
            startup_timeout_s=args.startup_timeout,
            ready_timeout_s=args.ready_timeout,
            tls=args.tls,
            metrics=not args.no_metrics,
            http_address=None if args.no_http else args.http_address,
            device=args.device,
            max_residents=args.max_residents,
            resource_domains=tuple(args.resource_domains),
            warm_pool=not args.no_warm_pool,
            control_planes=args.control_planes,
            # Refused before anything starts: several replicas need a shared PostgreSQL.
            database_url=replica_database_url(args.control_planes, args.database_url),
        )
    )


def _global_options() -> CommandSpec:
    # SUPPRESS defaults let the options appear before or after the subcommand without the
    # subcommand's defaults overwriting a value given before it.
    options = CommandSpec("gantry")
    options.add_argument(
        "--address",
        default=argparse.SUPPRESS,
        help=(
            f"control plane HOST:PORT, or its replicas HOST:PORT,HOST:PORT,... (env {ADDRESS_ENV};"
            f" else <state>/control-planes, one per line; default {DEFAULT_ADDRESS})"
        ),
    )
    options.add_argument(
        "--state-dir",
        default=argparse.SUPPRESS,
        help=(
            f"local state directory (env {STATE_DIR_ENV}; default: the nearest {DEFAULT_STATE_DIR}/"
            " from the working directory up, else ./.gantry)"
        ),
    )
    # Without any of these, commands use <state>/tls/ca.pem while `gantry up --tls` serves.
    add_client_tls_arguments(options, peer="the control plane", default=argparse.SUPPRESS)
    return options


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed)"


def build_parser() -> CommandSpec:
    """Every command, declared; `build_parser().parse_args(argv)` parses with Click."""
    options = _global_options()
    parser = CommandSpec(
        "gantry", help_text="Gantry: a runtime plane for ML models.", parents=[options]
    )
    parser.add_argument("--version", action="version", version=f"gantry {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    command = _command_adder(commands, options)
    # The order here is the order `gantry --help` lists them in.
    _add_role_commands(commands)
    _add_up_command(command)
    migrate.add_migrate_command(command)
    _add_object_commands(commands, command, options)
    _add_observation_commands(command, options)
    _add_pipeline_commands(commands, command, options)
    _add_inference_commands(command)
    return parser


def _command_adder(
    commands: CommandSpec,
    options: CommandSpec,
) -> AddCommand:
    """`command(name, handler, help)`: a subcommand taking the global options, run by handler."""

    def command(name: str, handler: Handler, help_text: str) -> CommandSpec:
        sub = commands.add_parser(name, parents=[options], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    return command


def _add_role_commands(commands: CommandSpec) -> None:
    for role, help_text in ROLE_HELP.items():
        # Dispatched before parsing (see _role_invocation); listed here for --help.
        sub = commands.add_parser(role, help=help_text, add_help=False)
        sub.add_argument("service_args", nargs=argparse.REMAINDER)


def _add_up_command(command: AddCommand) -> None:
    up = command("up", _up, "start scheduler, control plane, worker and the bundled model")
    # `up` creates ./.gantry where it runs unless told otherwise; it never adopts a parent's.
    up.set_defaults(walk_up_for_state=False, calls_control_planes=False)
    up.add_argument("--scheduler-address", default="127.0.0.1:50052", metavar="HOST:PORT")
    up.add_argument("--startup-timeout", type=float, default=60.0, metavar="SECONDS")
    up.add_argument("--ready-timeout", type=float, default=300.0, metavar="SECONDS")
    up.add_argument(
        "--tls",
        action="store_true",
        help="serve TLS with a local CA under <state>/tls/ (mTLS between the services)",
    )
    up.add_argument(
        "--no-metrics",
        action="store_true",
        help="serve no Prometheus /metrics (on by default at 127.0.0.1:9464, :9465, :9466)",
    )
    up.add_argument(
        "--http-address",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="where the control plane serves the OpenAI-compatible HTTP API (default "
        "127.0.0.1:8080)",
    )
    up.add_argument("--no-http", action="store_true", help="serve no OpenAI-compatible HTTP API")
    up.add_argument(
        "--control-planes",
        type=positive,
        default=1,
        metavar="N",
        help="control-plane replicas on one PostgreSQL database (--database-url): the first on "
        "--address, the others on free ports, with a standby scheduler; listed in "
        "<state>/control-planes (default 1)",
    )
    up.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="the database every control plane uses, migrated first (postgresql://USER@HOST/DB; "
        "default: <state>/gantry.db, SQLite, one replica)",
    )
    up.add_argument(
        "--device",
        type=parse_device,
        default="auto",
        metavar="DEVICE",
        help=f"where the bundled model runs: {DEVICE_CHOICES} (default auto: CUDA when the "
        "worker's default environment reports it, else the CPU); used when `up` first deploys it",
    )
    _add_up_worker_arguments(up)


def _add_up_worker_arguments(up: CommandSpec) -> None:
    worker = up.add_argument_group("the worker's own flags, passed through (gantry worker --help)")
    worker.add_argument(
        "--max-residents",
        type=positive,
        default=None,
        metavar="N",
        help="the most model hosts the worker holds at once; a deployment finding it full stays "
        "PENDING with the reason until one is unloaded (default: the worker's, 8)",
    )
    worker.add_argument(
        "--resource-domain",
        dest="resource_domains",
        action="append",
        default=[],
        metavar="NAME=KIND:CAPACITY[:MARGIN]",
        help="a resource domain placement may fill, repeatable, as `gantry worker` takes it "
        "(e.g. host.ram=ram:16GiB:10%%); default: measured (host RAM, each GPU's VRAM by NVML)",
    )
    worker.add_argument(
        "--no-warm-pool",
        action="store_true",
        help="spawn each model host as a fresh interpreter instead of forking it from the "
        "worker's preloaded fork server",
    )


def _add_object_commands(
    commands: CommandSpec,
    command: AddCommand,
    options: CommandSpec,
) -> None:
    """nodes, keys, endpoints, artifacts, deployments, describe, jobs: the objects Gantry keeps."""
    node_commands.add_nodes_arguments(
        command(
            "nodes",
            node_commands.nodes_list,
            "worker nodes: list, register, drain, enable, rotate-credential, delete",
        ),
        options,
    )
    key_commands.add_keys_arguments(
        command("keys", key_commands.keys_list, "client API keys: list, create, revoke"),
        options,
    )
    endpoint_commands.add_endpoints_arguments(
        command(
            "endpoints",
            endpoint_commands.endpoints_list,
            "servers run outside Gantry: list, adopt (never started or stopped by Gantry)",
        ),
        options,
    )
    operator_commands.add_artifacts_command(commands, options)
    operator_commands.add_deployments_command(command)
    describe_commands.add_describe_arguments(
        command(
            "describe",
            describe_commands.describe_command,
            "one object: state, last failure, evidence chain, residencies, history",
        )
    )
    jobs_commands.add_jobs_arguments(
        command(
            "jobs",
            jobs_commands.jobs_list,
            "serving jobs (load, unload, health, inspect, probe): list with filters, show JOB_ID",
        ),
        options,
    )


def _add_observation_commands(command: AddCommand, options: CommandSpec) -> None:
    """tenants, queue, status, events, inventory, reclaim: what the system is doing now."""
    tenant_commands.add_tenant_arguments(
        command(
            "tenants",
            tenant_commands.tenants_list,
            "tenants and their scheduling policies: list, show TENANT, set TENANT --weight N ...",
        ),
        options,
    )
    queue_commands.add_queue_arguments(
        command(
            "queue",
            queue_commands.queue_command,
            "the scheduler's queue, per-tenant shares, ledger, breakers and autoscale advice",
        )
    )
    status_commands.add_status_arguments(
        command(
            "status",
            status_commands.status_command,
            "the whole system on one screen: nodes, deployments, bindings, queue, failures",
        )
    )
    events_commands.add_events_arguments(
        command(
            "events",
            events_commands.events_command,
            "the audit trail: the newest events, or --follow them live",
        )
    )
    inventory_commands.add_inventory_arguments(
        command(
            "inventory",
            inventory_commands.inventory_command,
            "what a node last reported: model hosts, environments, resource domains",
        )
    )
    reclaim_command.add_reclaim_arguments(
        command(
            "reclaim",
            reclaim_command.reclaim_command,
            "drain, unload and verify one residency (exit 0 only when verified COLD)",
        )
    )


def _add_pipeline_commands(
    commands: CommandSpec,
    command: AddCommand,
    options: CommandSpec,
) -> None:
    """The evidence pipeline in the order an artifact walks it, then a deployment's life."""
    pipeline_commands.add_assess_command(command)
    pipeline_commands.add_profile_command(command)
    pipeline_commands.add_probe_command(command)
    pipeline_commands.add_candidates_command(command)
    pipeline_commands.add_approve_command(command)
    operator_commands.add_deploy_command(command)
    pipeline_commands.add_bind_command(command)
    check_command.add_check_arguments(
        command(
            "check",
            check_command.check_command,
            "deep health now: a real forward pass on every resident replica (exit 1 if one fails)",
        )
    )
    operator_commands.add_unload_command(command)
    deployment_commands.add_drain_arguments(
        command(
            "drain",
            deployment_commands.drain,
            "unload a deployment without losing a call: no new calls, those in flight finish"
            " (until --deadline), then unload",
        )
    )
    deployment_commands.add_restart_arguments(
        command(
            "restart",
            deployment_commands.restart,
            "unload and place a deployment again from a fresh start (also an UNLOADED or FAILED"
            " one)",
        )
    )
    deployment_commands.add_scale_arguments(
        command("scale", deployment_commands.scale, "change a live deployment's replicas")
    )
    # Every kind registered with delete_commands.add_delete_kind (on its module's import).
    delete_commands.add_delete_arguments(
        commands.add_parser("delete", help="delete what nothing uses any more: delete KIND ID"),
        options,
    )


def _add_inference_commands(command: AddCommand) -> None:
    """embed, ocr, embed-image, classify, transcribe, generate (the local client key), bench."""
    embed.add_embed_command(command)
    media_commands.add_media_commands(command)
    transcribe_command.add_transcribe_command(command)
    generate_command.add_generate_command(command)
    bench_command.add_bench_arguments(
        command(
            "bench",
            bench_command.bench,
            "load a capability or deployment with Embed/Rerank calls; latency, throughput, errors",
        )
    )


def _role_invocation(arguments: Sequence[str]) -> tuple[str, list[str]] | None:
    """`gantry [globals] <role> ARGS`: the role and its untouched arguments.

    Roles bypass Click so every argument (including --help) reaches the service's own parser.
    """
    index = 0
    while index < len(arguments):
        token = arguments[index]
        if token in _GLOBAL_OPTIONS:
            index += 2
        elif token.startswith(tuple(f"{option}=" for option in _GLOBAL_OPTIONS)):
            index += 1
        else:
            return (token, list(arguments[index + 1 :])) if token in ROLES else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    role = _role_invocation(arguments)
    address = DEFAULT_ADDRESS
    try:
        if role is not None:
            return run_role(*role)
        parser = build_parser()
        args = parser.parse_args(arguments)
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:  # a group named without its subcommand: its help
            print(args._context.get_help(), file=sys.stderr)
            return 2
        paths = locate_state_dir(
            flag=getattr(args, "state_dir", None),
            env=os.environ,
            cwd=Path.cwd(),
            walk_up=getattr(args, "walk_up_for_state", True),
        )
        # `gantry up` is told where to listen, never which replicas to call.
        replicas_file = paths if getattr(args, "calls_control_planes", True) else None
        address = command_address(getattr(args, "address", None), os.environ, replicas_file)
        context = CommandContext(address=address, paths=paths, tls=command_tls(args, paths))
        return int(handler(context, args))
    except grpc.RpcError as exc:
        print(format_rpc_error(exc, address=address), file=sys.stderr)
    except GantryError as exc:
        print(format_gantry_error(exc), file=sys.stderr)
    except (CliError, TlsSettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
