"""`gantry controlplane`: its flags and configuration variables, read and checked in one place
(`read_settings`, on `gantry.common.service_settings`) into the `ControlPlaneSettings` that
`start_control_plane` is built from, then the server run until SIGINT/SIGTERM. The variables:
TLS, the scheduler link's TLS, the inference limits, GANTRY_ENDPOINT_KEY_FILE,
GANTRY_HTTP_LISTEN, GANTRY_LEADER_LEASE_SECONDS and the logging ones.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from gantry.common import event_loop
from gantry.common.arg_types import positive, positive_seconds
from gantry.common.inference_limits import add_limit_arguments
from gantry.common.metrics import add_metrics_argument, start_metrics
from gantry.common.process import add_log_format_argument, run_until_signalled, setup_logging
from gantry.common.service_settings import (
    InferenceLimitSettings,
    PositiveFloat,
    ProcessSettings,
    SchedulerTlsSettings,
    ServerTlsSettings,
    parse_settings,
)
from gantry.common.telemetry import setup_tracing
from gantry.common.tls import (
    SCHEDULER_CLIENT_TLS,
    TlsSettingsError,
    add_client_tls_arguments,
    add_server_tls_arguments,
    listener_mode,
)
from gantry.controlplane.app import ControlPlaneSettings, start_control_plane
from gantry.controlplane.deployments.lifecycle import DEFAULT_LEASE_SECONDS
from gantry.controlplane.deployments.reconciler import ReconcilerSettings
from gantry.controlplane.platform.database import DatabaseNotInitialised
from gantry.controlplane.platform.leadership import DEFAULT_LEADER_LEASE_SECONDS
from gantry.controlplane.platform.scheduler_assignment_rules import parse_addresses
from gantry.controlplane.platform.scheduler_link import (
    DEFAULT_FAILOVER_HOLD_SECONDS,
)
from gantry.controlplane.platform.scheduler_silence import DEFAULT_SILENCE_TIMEOUT_SECONDS
from gantry.controlplane.serving.inference_service import InferenceSettings
from gantry.controlplane.serving.openai_http import DoorBounds, HttpListenError

ENDPOINT_KEY_FILE_ENV = "GANTRY_ENDPOINT_KEY_FILE"
HTTP_LISTEN_ENV = "GANTRY_HTTP_LISTEN"
LEADER_LEASE_ENV = "GANTRY_LEADER_LEASE_SECONDS"


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
    """The control plane's flags (their variables are read by `ControlPlaneConfig`)."""
    parser = argparse.ArgumentParser(prog="gantry controlplane")
    parser.add_argument("--listen", default="127.0.0.1:50051")
    parser.add_argument("--database-url", default="sqlite+aiosqlite:///.gantry/gantry.db")
    parser.add_argument(
        "--scheduler",
        default="127.0.0.1:50052",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the scheduler, or several in order of preference: one is active at a time, the "
        "same for every replica; when it stops answering for --scheduler-silence-timeout-s the "
        "leader moves every replica to the next that answers (default %(default)s)",
    )
    parser.add_argument("--scheduler-token-file", type=Path, required=True)
    parser.add_argument("--bootstrap-operator-token-file", type=Path)
    parser.add_argument("--artifact-root", type=Path, help="accepted for symmetry; unused here")
    parser.add_argument(
        "--endpoint-key-file",
        type=Path,
        help="the key sealing adopted endpoints' credentials (minted, mode 0600, if absent; env "
        f"{ENDPOINT_KEY_FILE_ENV}). Without one the key is held in memory: a credential stored "
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
        help="also serve the OpenAI-compatible HTTP API (/v1/embeddings, /v1/completions, "
        f"/v1/chat/completions, /v1/models) here, with the same TLS (env {HTTP_LISTEN_ENV}; "
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
    """The reconciler's intervals and the job lease (each checked positive by the settings)."""
    defaults = ReconcilerSettings()
    parser.add_argument(
        "--heartbeat-interval-s",
        type=float,
        default=defaults.heartbeat_interval_s,
        help="how often workers heartbeat; a node is stale after 3 missed intervals (a longer "
        "interval told to a large fleet: after it and 2 base intervals)",
    )
    parser.add_argument(
        "--max-heartbeats-per-s",
        type=float,
        default=defaults.max_heartbeats_per_s,
        help="heartbeats a second this replica takes from its workers: past that many streams "
        "per interval it tells them a longer one (a multiple of --heartbeat-interval-s), and "
        "a silent worker is found that much later",
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
    parser.add_argument(
        "--scheduler-silence-timeout-s",
        type=float,
        default=DEFAULT_SILENCE_TIMEOUT_SECONDS,
        help="a scheduler that answers no health ping for this long (stopped, stuck) counts as "
        "unavailable: waiting and new calls fail SCHEDULER_UNAVAILABLE until it answers again "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--scheduler-failover-hold-s",
        type=float,
        default=DEFAULT_FAILOVER_HOLD_SECONDS,
        help="with several --scheduler addresses: how long a call waits for the link while it "
        "moves to another scheduler before it is refused SCHEDULER_UNAVAILABLE, never past the "
        "call's own deadline (default %(default)s)",
    )
    parser.add_argument(
        "--leader-lease-seconds",
        type=float,
        help="replicas on one PostgreSQL database: a leader whose session to the database is "
        "silent this long (paused, cut off) loses the lead and another replica leads, with the "
        f"next fencing epoch; pings and takeover tries come every third of it (env "
        f"{LEADER_LEASE_ENV}; default {DEFAULT_LEADER_LEASE_SECONDS:g}; unused on SQLite)",
    )


def _scheduler_addresses(value: str) -> str:
    """`--scheduler`, checked (no empty or repeated address) and written without spaces."""
    return ",".join(parse_addresses(value))


class ControlPlaneConfig(
    ProcessSettings, ServerTlsSettings, SchedulerTlsSettings, InferenceLimitSettings
):
    """Every flag of `gantry controlplane` and the variables that may stand in for one."""

    listen: str
    database_url: str
    scheduler: Annotated[str, AfterValidator(_scheduler_addresses)]
    scheduler_token_file: Path
    bootstrap_operator_token_file: Path | None = None
    artifact_root: Path | None = None  # accepted for symmetry; unused
    endpoint_key_file: Path | None = Field(None, validation_alias=ENDPOINT_KEY_FILE_ENV)
    health_listen: str | None = None
    http_listen: str | None = Field(None, validation_alias=HTTP_LISTEN_ENV)
    http_max_connections: int
    http_header_timeout_s: float
    http_body_timeout_s: float
    heartbeat_interval_s: PositiveFloat
    max_heartbeats_per_s: PositiveFloat
    reconcile_interval_s: PositiveFloat
    absence_grace_s: PositiveFloat
    lease_seconds: PositiveFloat
    scheduler_silence_timeout_s: PositiveFloat
    scheduler_failover_hold_s: PositiveFloat
    leader_lease_seconds: PositiveFloat = Field(
        DEFAULT_LEADER_LEASE_SECONDS, validation_alias=LEADER_LEASE_ENV
    )

    def control_plane_settings(self) -> ControlPlaneSettings:
        """What `start_control_plane` is given (reads the token files)."""
        bootstrap = self.bootstrap_operator_token_file
        return ControlPlaneSettings(
            listen=self.listen,
            database_url=self.database_url,
            scheduler_address=self.scheduler,
            scheduler_token=self.scheduler_token_file.read_text().strip(),
            bootstrap_operator_token=bootstrap.read_text().strip() if bootstrap else None,
            reconciler=ReconcilerSettings(
                interval_s=self.reconcile_interval_s,
                heartbeat_interval_s=self.heartbeat_interval_s,
                max_heartbeats_per_s=self.max_heartbeats_per_s,
                absence_grace_s=self.absence_grace_s,
            ),
            lease_seconds=self.lease_seconds,
            scheduler_silence_timeout_s=self.scheduler_silence_timeout_s,
            scheduler_failover_hold_s=self.scheduler_failover_hold_s,
            leader_lease_seconds=self.leader_lease_seconds,
            tls=self.server_tls(),
            health_listen=self.health_listen,
            scheduler_tls=self.scheduler_tls(),
            inference=InferenceSettings(limits=self.inference_limits()),
            endpoint_key_file=self.endpoint_key_file,
            http_listen=self.http_listen,
            http_bounds=DoorBounds(
                max_connections=self.http_max_connections,
                header_timeout_s=self.http_header_timeout_s,
                body_timeout_s=self.http_body_timeout_s,
            ),
        )


def read_settings(argv: list[str] | None) -> ControlPlaneConfig:
    """The flags and variables, checked; a bad one exits through parser.error (status 2)."""
    return parse_settings(build_parser(), ControlPlaneConfig, argv)


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
    config = read_settings(argv)
    setup_logging("controlplane", config.log_format, environ=config.logging_environment())
    setup_tracing("gantry-controlplane")
    if not start_metrics("gantry-controlplane", config.metrics_address):
        return 2
    if config.endpoint_key_file is None:
        logging.getLogger(__name__).warning(
            "no --endpoint-key-file: adopted endpoints' credentials are sealed with a key held "
            "in memory and cannot be opened after a restart"
        )
    settings = config.control_plane_settings()
    try:
        event_loop.run(serve(settings))
    except (DatabaseNotInitialised, TlsSettingsError, HttpListenError) as exc:
        # An operator's mistake, not a bug: one line that names the fix, no traceback.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
