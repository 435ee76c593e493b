"""The `gantry` entry point: global options, subcommands, and one-line error reporting."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from gantry.cli import (
    artifact_set_commands,
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
from gantry.cli.connection import ADDRESS_ENV, DEFAULT_ADDRESS, CommandContext, command_tls
from gantry.cli.errors import CliError, format_gantry_error, format_rpc_error
from gantry.cli.migrate import migrate
from gantry.cli.output import add_output_argument
from gantry.cli.roles import ROLE_HELP, ROLES, run_role
from gantry.cli.state import DEFAULT_STATE_DIR, STATE_DIR_ENV, locate_state_dir
from gantry.common.arg_types import non_negative, positive
from gantry.common.errors import GantryError
from gantry.common.tls import TlsSettingsError, add_client_tls_arguments

Handler = Callable[[CommandContext, argparse.Namespace], int]
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

    if args.resource_domains:
        # Refused before anything starts, as the worker itself would refuse it (exit 2).
        from gantry.worker.resource_domains import ResourceDomainError, parse_declaration

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
        )
    )


def _global_options() -> argparse.ArgumentParser:
    # SUPPRESS defaults let the options appear before or after the subcommand without the
    # subcommand's defaults overwriting a value given before it.
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--address",
        default=argparse.SUPPRESS,
        help=f"control plane HOST:PORT (env {ADDRESS_ENV}, default {DEFAULT_ADDRESS})",
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


def _add_wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-wait", action="store_true", help="start it and return; do not wait for its result"
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=pipeline_commands.DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long to wait (default {pipeline_commands.DEFAULT_WAIT_S:g})",
    )


def _version() -> str:
    try:
        return importlib.metadata.version("gantry-libs")
    except importlib.metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    options = _global_options()
    # No abbreviations: `up --tls` would otherwise be ambiguous with the global --tls-* options.
    parser = argparse.ArgumentParser(
        prog="gantry",
        description="Gantry: a runtime plane for ML models.",
        parents=[options],
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"gantry {_version()}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[options], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    for role, help_text in ROLE_HELP.items():
        # Dispatched before parsing (see _role_invocation); listed here for --help.
        sub = commands.add_parser(role, help=help_text, add_help=False)
        sub.add_argument("service_args", nargs=argparse.REMAINDER)

    up = command("up", _up, "start scheduler, control plane, worker and the bundled model")
    # `up` creates ./.gantry where it runs unless told otherwise; it never adopts a parent's.
    up.set_defaults(walk_up_for_state=False)
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
        "--device",
        type=parse_device,
        default="auto",
        metavar="DEVICE",
        help=f"where the bundled model runs: {DEVICE_CHOICES} (default auto: CUDA when the "
        "worker's default environment reports it, else the CPU); used when `up` first deploys it",
    )
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

    migrate_parser = command(
        "migrate", migrate, "create or upgrade the control plane's database schema"
    )
    migrate_parser.add_argument(
        "--database-url",
        metavar="URL",
        help="SQLAlchemy URL (default: the SQLite database in the state directory)",
    )

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

    artifacts = commands.add_parser("artifacts", help="register and list artifact sets")
    artifacts.set_defaults(help_parser=artifacts)
    artifact_commands = artifacts.add_subparsers(title="commands", metavar="COMMAND")
    register = artifact_commands.add_parser(
        "register", parents=[options], help="hash a model directory and register it"
    )
    register.set_defaults(handler=operator_commands.artifacts_register)
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
    artifact_set_commands.add_artifact_set_arguments(artifact_commands, options)

    deployments_parser = command(
        "deployments", operator_commands.deployments, "list deployments and residencies"
    )
    add_output_argument(deployments_parser)
    deployments_parser.add_argument(
        "--all", action="store_true", help="deleted deployments too (hidden by default)"
    )
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

    assess = command(
        "assess", pipeline_commands.assess, "inspect an artifact set statically on a node"
    )
    assess.add_argument("artifact_set_id", metavar="ARTIFACT_SET_ID")
    assess.add_argument(
        "--node", metavar="NODE", help="a node id or name (default: any connected node)"
    )
    assess.add_argument(
        "--environment",
        metavar="ENV_ID",
        help="the worker's runtime environment to inspect in, e.g. vision (default: its default)",
    )
    _add_wait_options(assess)
    add_output_argument(assess)

    profile = command(
        "profile", pipeline_commands.profile, "create a runtime profile from an assessment"
    )
    profile.add_argument("assessment_id", metavar="ASSESSMENT_ID")
    profile.add_argument("--name", required=True)
    profile.add_argument(
        "--adapter",
        default="sentence_transformers",
        help="sentence_transformers (embeddings), sentence_transformers_cross_encoder "
        "(reranking), transformers_whisper (speech recognition), transformers_trocr (text "
        "recognition in images), transformers_siglip2 (image embeddings and classification), "
        "transformers_causal_lm (text generation in a model host) or llama_cpp_server (a GGUF "
        "served by llama.cpp's server, which the worker starts; vllm_server where vLLM is "
        "installed)",
    )
    profile.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 (default cpu)")
    profile.add_argument(
        "--language", default="", help="transformers_whisper: a code such as en (default: detect)"
    )
    profile.add_argument(
        "--task", default="", help="transformers_whisper: transcribe (default) or translate"
    )
    # Preprocessing: inspection fills in what is left unset; a value given must agree with the
    # artifact's own processor (the control plane refuses one that does not).
    profile.add_argument(
        "--image-size",
        type=pipeline_commands.positive_whole,
        default=0,
        metavar="N",
        help="image adapters: the square side the processor hands the model (default: inspected)",
    )
    profile.add_argument(
        "--image-mean",
        type=pipeline_commands.channel_values,
        default=[],
        metavar="A,B,C",
        help="image adapters: per-channel normalisation mean (default: inspected)",
    )
    profile.add_argument(
        "--image-std",
        type=pipeline_commands.channel_values,
        default=[],
        metavar="A,B,C",
        help="image adapters: per-channel normalisation std (default: inspected)",
    )
    profile.add_argument(
        "--sampling-rate",
        type=pipeline_commands.positive_whole,
        default=0,
        metavar="HZ",
        help="transformers_whisper: the feature extractor's sampling rate (default: inspected)",
    )
    profile.add_argument(
        "--max-new-tokens",
        type=pipeline_commands.positive_whole,
        default=0,
        metavar="N",
        help="generation adapters: the most new tokens one call may ask (default: the "
        "adapter's, 1024)",
    )
    profile.add_argument("--normalize", action="store_true", help="L2-normalise embeddings")
    profile.add_argument("--max-batch-size", type=int, default=0, metavar="N")
    profile.add_argument("--max-input-length", type=int, default=0, metavar="TOKENS")
    profile.add_argument("--ram-estimate", type=int, default=0, metavar="BYTES")
    profile.add_argument("--vram-estimate", type=int, default=0, metavar="BYTES")
    profile.add_argument(
        "--allow-pickle-weights",
        action="store_true",
        help="let this profile load pickle-based weights (recorded in the audit log)",
    )
    add_output_argument(profile)

    probe = command(
        "probe",
        pipeline_commands.probe,
        "probe a profile (gantry probe PROFILE_ID), or: probe show|cancel PROBE_ID, probe list",
    )
    probe.add_argument("words", nargs="+", metavar="PROFILE_ID | show PROBE_ID | list")
    probe.add_argument(
        "--node", metavar="NODE", help="a node id or name (default: the assessing node)"
    )
    _add_wait_options(probe)
    add_output_argument(probe)

    add_output_argument(
        command("candidates", pipeline_commands.candidates, "list deployment candidates")
    )

    approve = command(
        "approve", pipeline_commands.approve, "approve a LAB_READY candidate for production"
    )
    approve.add_argument("candidate_id", metavar="CANDIDATE_ID")
    approve.add_argument("--reason", required=True, help="why it may serve (recorded)")
    add_output_argument(approve)

    deploy = command("deploy", operator_commands.deploy, "deploy an approved candidate")
    deploy.add_argument("approval_id", metavar="APPROVAL_ID")
    deploy.add_argument("--capability", required=True, metavar="NAME")
    # uint32 on the wire: a negative count is refused here, as a usage error, not a traceback.
    deploy.add_argument("--replicas", type=non_negative, default=1)
    deploy.add_argument(
        "--min-replicas",
        type=non_negative,
        default=0,
        metavar="N",
        help="autoscale floor (default: replicas)",
    )
    deploy.add_argument(
        "--max-replicas",
        type=non_negative,
        default=0,
        metavar="N",
        help="autoscale ceiling (default: replicas)",
    )
    deploy.add_argument(
        "--placement",
        choices=sorted(operator_commands.PLACEMENT_POLICIES),
        default="bin-pack",
        help="bin-pack: fill the fullest node that fits; spread: the least loaded node",
    )

    bind = command("bind", pipeline_commands.bind, "bind a capability to exactly one deployment")
    bind.add_argument("capability", metavar="CAPABILITY")
    bind.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    add_output_argument(bind)

    deployment_commands.add_wait_arguments(deploy)
    add_output_argument(deploy)
    check_command.add_check_arguments(
        command(
            "check",
            check_command.check_command,
            "deep health now: a real forward pass on every resident replica (exit 1 if one fails)",
        )
    )

    unload = command("unload", operator_commands.unload, "unload a deployment")
    unload.add_argument("deployment_id", metavar="DEPLOYMENT_ID")
    deployment_commands.add_wait_arguments(unload)
    add_output_argument(unload)
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

    embed_parser = command("embed", embed.embed, "embed texts with the local client key")
    embed_parser.set_defaults(command_parser=embed_parser)
    embed_parser.add_argument("texts", nargs="*", metavar="TEXT")
    embed_parser.add_argument(
        "--file",
        dest="files",
        action="append",
        default=[],
        metavar="PATH",
        help="embed the text of a file ('-': standard input); repeatable, after the TEXTs",
    )
    embed_parser.add_argument(
        "--lines", action="store_true", help="each non-empty line of a --file is one text"
    )
    embed_parser.add_argument(
        "--truncate",
        action="store_true",
        help="cut texts past the model's token limit instead of refusing them (INPUT_TOO_LONG)",
    )
    target = embed_parser.add_mutually_exclusive_group()
    target.add_argument("--capability", default="minilm")
    target.add_argument("--deployment-id")
    embed_parser.add_argument("--json", action="store_true", help="print every value as JSON")
    # ocr, embed-image, classify, transcribe: images and audio, with the local client key.
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
    return parser


def _role_invocation(arguments: Sequence[str]) -> tuple[str, list[str]] | None:
    """`gantry [globals] <role> ARGS`: the role and its untouched arguments.

    Roles bypass argparse so every argument (including --help) reaches the service's own parser.
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
        address = getattr(args, "address", None) or os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS
        handler: Handler | None = getattr(args, "handler", None)
        if handler is None:
            getattr(args, "help_parser", parser).print_help(sys.stderr)
            return 2
        paths = locate_state_dir(
            flag=getattr(args, "state_dir", None),
            env=os.environ,
            cwd=Path.cwd(),
            walk_up=getattr(args, "walk_up_for_state", True),
        )
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
