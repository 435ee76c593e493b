"""`gantry scheduler`'s flags and configuration variables (its TLS, its logging), read and
checked in one place (`read_settings`, on `gantry.common.service_settings`), and the
`SchedulerSettings` of its core.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import Field

from gantry.common.metrics import add_metrics_argument
from gantry.common.process import add_log_format_argument
from gantry.common.service_settings import (
    ProcessSettings,
    ServerTlsSettings,
    parse_settings,
)
from gantry.common.tls import add_server_tls_arguments
from gantry.scheduler.policy.core import CoreSettings
from gantry.scheduler.policy.credits import DEFAULT_CREDITS_PER_TENANT
from gantry.scheduler.service import DEFAULT_MAX_STREAMS, SchedulerSettings

# The operator's escape hatch where flags are not at hand (`gantry up` starts the scheduler).
CREDITS_ENV = "GANTRY_SCHEDULER_CREDITS_PER_TENANT"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The scheduler's flags (their variables are read by `SchedulerConfig`)."""
    parser = argparse.ArgumentParser(prog="gantry scheduler")
    parser.add_argument("--listen", default="127.0.0.1:50052")
    parser.add_argument("--service-token-file", type=Path, required=True)
    parser.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1 alone, plaintext, here (probes that cannot speak TLS)",
    )
    parser.add_argument(
        "--max-streams",
        type=_positive_int,
        default=DEFAULT_MAX_STREAMS,
        help="control-plane streams (replicas) connected at once; past it QUEUE_FULL "
        "(default %(default)s)",
    )
    defaults = CoreSettings()
    _add_queueing_arguments(parser.add_argument_group("queueing and admission"), defaults)
    breakers = parser.add_argument_group("circuit breakers")
    breakers.add_argument(
        "--breaker-threshold",
        type=_positive_int,
        default=defaults.breaker_threshold,
        help="consecutive INFRA failures that open a breaker (default %(default)s)",
    )
    breakers.add_argument(
        "--breaker-cooldown-s",
        type=_positive_float,
        default=defaults.breaker_cooldown_seconds,
        help="seconds an open breaker waits before one probe call (default %(default)s)",
    )
    add_server_tls_arguments(parser)
    add_metrics_argument(parser)
    add_log_format_argument(parser)
    return parser


def _add_queueing_arguments(queueing: argparse._ArgumentGroup, defaults: CoreSettings) -> None:
    queueing.add_argument(
        "--global-queue-depth",
        type=_positive_int,
        default=defaults.global_queue_depth,
        help="calls waiting across all tenants; past it QUEUE_FULL (default %(default)s)",
    )
    queueing.add_argument(
        "--tenant-queue-depth",
        type=_positive_int,
        default=defaults.tenant_queue_depth,
        help="a tenant's waiting calls when its policy sets none (default %(default)s)",
    )
    queueing.add_argument(
        "--tenant-concurrency",
        type=_positive_int,
        default=defaults.tenant_concurrency,
        help="a tenant's outstanding calls when its policy sets none (default %(default)s)",
    )
    queueing.add_argument(
        "--credits-per-tenant",
        type=_non_negative_int,
        help="credits a control-plane stream holds per (deployment, tenant) to dispatch "
        f"uncontended calls itself, with no scheduler round trip; 0 turns credits off "
        f"(default {DEFAULT_CREDITS_PER_TENANT}; variable {CREDITS_ENV})",
    )
    queueing.add_argument(
        "--aging-s",
        type=_positive_float,
        default=defaults.aging_seconds,
        help="BATCH work waiting this long competes as INTERACTIVE (default %(default)s)",
    )


class SchedulerConfig(ProcessSettings, ServerTlsSettings):
    """Every flag of `gantry scheduler` and the variables that may stand in for one."""

    listen: str
    service_token_file: Path
    health_listen: str | None = None
    max_streams: int
    global_queue_depth: int
    tenant_queue_depth: int
    tenant_concurrency: int
    credits_per_tenant: int = Field(DEFAULT_CREDITS_PER_TENANT, ge=0, validation_alias=CREDITS_ENV)
    aging_s: float
    breaker_threshold: int
    breaker_cooldown_s: float

    def scheduler_settings(self) -> SchedulerSettings:
        return SchedulerSettings(
            core=CoreSettings(
                global_queue_depth=self.global_queue_depth,
                tenant_queue_depth=self.tenant_queue_depth,
                tenant_concurrency=self.tenant_concurrency,
                credits_per_tenant=self.credits_per_tenant,
                aging_seconds=self.aging_s,
                breaker_threshold=self.breaker_threshold,
                breaker_cooldown_seconds=self.breaker_cooldown_s,
            ),
            max_streams=self.max_streams,
        )


def read_settings(argv: list[str] | None) -> SchedulerConfig:
    """The flags and variables, checked; a bad one exits through parser.error (status 2)."""
    return parse_settings(build_parser(), SchedulerConfig, argv)
