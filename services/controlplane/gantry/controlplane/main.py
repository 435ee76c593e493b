"""`gantry controlplane`: run the control plane server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from gantry.common.arg_types import positive, positive_seconds
from gantry.common.inference_limits import (
    InferenceLimits,
    LimitSettingsError,
    add_limit_arguments,
    limits_from,
)
from gantry.common.metrics import add_metrics_argument, start_metrics
from gantry.common.process import (
    add_log_format_argument,
    run_until_signalled,
    setup_logging,
)
from gantry.common.telemetry import setup_tracing
from gantry.common.tls import (
    SCHEDULER_CLIENT_TLS,
    ClientTls,
    ServerTls,
    TlsSettingsError,
    add_client_tls_arguments,
    add_server_tls_arguments,
    client_tls_from,
    listener_mode,
    server_tls_from,
)
from gantry.controlplane.app import ControlPlaneSettings, start_control_plane
from gantry.controlplane.deployments.lifecycle import DEFAULT_LEASE_SECONDS
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.platform.database import DatabaseNotInitialised
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.controlplane.serving.openai_http import DoorBounds, HttpListenError


def _add_http_bound_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DoorBounds()
    group = parser.add_argument_group("bounds of the HTTP API's connections")
    group.add_argument(
        "--http-max-connections",
        type=positive,
        default=defaults.max_connections,
        help="connections held at once; at the cap a new one takes the place of the one that "
        "has waited longest for a request's headers, or is reset when every one is mid-request. "
        "Never more than half the open-descriptor limit (raised to its hard limit at start), so "
        "gRPC, the database and the workers keep theirs (default %(default)s)",
    )
    group.add_argument(
        "--http-header-timeout-s",
        type=positive_seconds,
        default=defaults.header_timeout_s,
        help="seconds a connection has to send a request's headers, at its start and after each "
        "answer on a kept-alive connection; then it is closed (default %(default)s)",
    )
    group.add_argument(
        "--http-body-timeout-s",
        type=positive_seconds,
        default=defaults.body_timeout_s,
        help="seconds a request's body has to arrive once its headers have; then the call is "
        "refused CLIENT_TOO_SLOW (default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The control plane's flags (and their environment defaults)."""
    parser = argparse.ArgumentParser(prog="gantry controlplane")
    parser.add_argument("--listen", default="127.0.0.1:50051")
    parser.add_argument("--database-url", default="sqlite+aiosqlite:///.gantry/gantry.db")
    parser.add_argument("--scheduler", default="127.0.0.1:50052")
    parser.add_argument("--scheduler-token-file", type=Path, required=True)
    parser.add_argument("--bootstrap-operator-token-file", type=Path)
    parser.add_argument("--artifact-root", type=Path, help="accepted for symmetry; unused here")
    parser.add_argument(
        "--endpoint-key-file",
        type=Path,
        default=Path(os.environ["GANTRY_ENDPOINT_KEY_FILE"])
        if os.environ.get("GANTRY_ENDPOINT_KEY_FILE")
        else None,
        help="the key sealing adopted endpoints' credentials (minted, mode 0600, if absent; env "
        "GANTRY_ENDPOINT_KEY_FILE). Without one the key is held in memory: a credential stored "
        "by this process cannot be opened after a restart",
    )
    parser.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1 alone, plaintext, here (probes that cannot speak TLS)",
    )
    parser.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        default=os.environ.get("GANTRY_HTTP_LISTEN") or None,
        help="also serve the OpenAI-compatible HTTP API (/v1/embeddings, /v1/completions, "
        "/v1/chat/completions, /v1/models) here, with the same TLS (env GANTRY_HTTP_LISTEN; "
        "default: not served; `gantry up` serves it on 127.0.0.1:8080)",
    )
    _add_http_bound_arguments(parser)
    add_server_tls_arguments(parser)
    add_client_tls_arguments(
        parser.add_argument_group("TLS to the scheduler (plaintext unless one is given)"),
        SCHEDULER_CLIENT_TLS,
        peer="the scheduler",
    )
    _add_timing_arguments(parser)
    add_limit_arguments(parser)
    add_log_format_argument(parser)
    add_metrics_argument(parser)
    return parser


def _add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    """The reconciler's intervals and the job lease (each checked positive by parse_arguments)."""
    defaults = ReconcilerSettings()
    parser.add_argument(
        "--heartbeat-interval-s",
        type=float,
        default=defaults.heartbeat_interval_s,
        help="how often workers heartbeat; a node is stale after 3 missed intervals",
    )
    parser.add_argument(
        "--reconcile-interval-s",
        type=float,
        default=defaults.interval_s,
        help="how often the reconciler runs its time-driven rules",
    )
    parser.add_argument(
        "--absence-grace-s",
        type=float,
        default=defaults.absence_grace_s,
        help="after this long away a node's residencies are COLD and re-placed elsewhere",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=DEFAULT_LEASE_SECONDS,
        help="job lease length; an unrenewed lease is re-queued with a new token",
    )


@dataclass(frozen=True)
class ParsedArguments:
    """The flags, with the TLS and inference limits they name already read and checked."""

    args: argparse.Namespace
    tls: ServerTls | None
    scheduler_tls: ClientTls | None
    limits: InferenceLimits


def parse_arguments(argv: list[str] | None) -> ParsedArguments:
    """Parse and check the flags; a bad one exits through parser.error (status 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in (
        "heartbeat_interval_s",
        "reconcile_interval_s",
        "absence_grace_s",
        "lease_seconds",
    ):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        tls = server_tls_from(args)
        scheduler_tls = client_tls_from(args, SCHEDULER_CLIENT_TLS)
        for given in (tls, scheduler_tls):
            if given is not None:
                given.credentials()  # every file readable now, not at the first connection
    except TlsSettingsError as exc:
        parser.error(str(exc))
    try:
        limits = limits_from(args)
    except LimitSettingsError as exc:
        parser.error(str(exc))
    return ParsedArguments(args=args, tls=tls, scheduler_tls=scheduler_tls, limits=limits)


def build_settings(parsed: ParsedArguments) -> ControlPlaneSettings:
    """The control plane's settings from the flags (reads the token files)."""
    args = parsed.args
    bootstrap = args.bootstrap_operator_token_file
    return ControlPlaneSettings(
        listen=args.listen,
        database_url=args.database_url,
        scheduler_address=args.scheduler,
        scheduler_token=args.scheduler_token_file.read_text().strip(),
        bootstrap_operator_token=bootstrap.read_text().strip() if bootstrap else None,
        reconciler=ReconcilerSettings(
            interval_s=args.reconcile_interval_s,
            heartbeat_interval_s=args.heartbeat_interval_s,
            absence_grace_s=args.absence_grace_s,
        ),
        lease_seconds=args.lease_seconds,
        tls=parsed.tls,
        health_listen=args.health_listen,
        scheduler_tls=parsed.scheduler_tls,
        inference=InferenceSettings(limits=parsed.limits),
        endpoint_key_file=args.endpoint_key_file,
        http_listen=args.http_listen,
        http_bounds=DoorBounds(
            max_connections=args.http_max_connections,
            header_timeout_s=args.http_header_timeout_s,
            body_timeout_s=args.http_body_timeout_s,
        ),
    )


async def serve(settings: ControlPlaneSettings) -> None:
    """Run the control plane until SIGINT/SIGTERM, then stop it."""
    control_plane = await start_control_plane(settings)
    logging.getLogger(__name__).info(
        "control plane listening on port %d (%s); scheduler link %s",
        control_plane.port,
        listener_mode(settings.tls),
        "plaintext" if settings.scheduler_tls is None else "TLS",
    )
    await run_until_signalled()
    await control_plane.stop()


def main(argv: list[str] | None = None) -> int:
    parsed = parse_arguments(argv)
    setup_logging("controlplane", parsed.args.log_format)
    setup_tracing("gantry-controlplane")
    if not start_metrics("gantry-controlplane", parsed.args.metrics_address):
        return 2
    if parsed.args.endpoint_key_file is None:
        logging.getLogger(__name__).warning(
            "no --endpoint-key-file: adopted endpoints' credentials are sealed with a key held "
            "in memory and cannot be opened after a restart"
        )
    settings = build_settings(parsed)
    try:
        asyncio.run(serve(settings))
    except (DatabaseNotInitialised, TlsSettingsError, HttpListenError) as exc:
        # An operator's mistake, not a bug: one line that names the fix, no traceback.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
