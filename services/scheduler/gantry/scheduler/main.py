"""`gantry scheduler`: run the scheduler server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from gantry.common.metrics import add_metrics_argument, start_metrics
from gantry.common.process import (
    add_log_format_argument,
    run_until_signalled,
    setup_logging,
)
from gantry.common.telemetry import setup_tracing
from gantry.common.tls import (
    ServerTls,
    TlsSettingsError,
    add_server_tls_arguments,
    listener_mode,
    server_tls_from,
)
from gantry.scheduler.policy.core import CoreSettings
from gantry.scheduler.server import start_scheduler
from gantry.scheduler.service import SchedulerSettings


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings = _settings(args)
    try:
        tls = server_tls_from(args)
        if tls is not None:
            tls.credentials()  # every file readable now, before the port is bound
    except TlsSettingsError as exc:
        parser.error(str(exc))
    setup_logging("scheduler", args.log_format)
    setup_tracing("gantry-scheduler")
    if not start_metrics("gantry-scheduler", args.metrics_address):
        return 2
    token = args.service_token_file.read_text().strip()
    try:
        asyncio.run(_serve(args, token=token, tls=tls, settings=settings))
    except TlsSettingsError as exc:  # an unreadable certificate or key: one line, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gantry scheduler")
    parser.add_argument("--listen", default="127.0.0.1:50052")
    parser.add_argument("--service-token-file", type=Path, required=True)
    parser.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1 alone, plaintext, here (probes that cannot speak TLS)",
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
        "--aging-s",
        type=_positive_float,
        default=defaults.aging_seconds,
        help="BATCH work waiting this long competes as INTERACTIVE (default %(default)s)",
    )


def _settings(args: argparse.Namespace) -> SchedulerSettings:
    return SchedulerSettings(
        core=CoreSettings(
            global_queue_depth=args.global_queue_depth,
            tenant_queue_depth=args.tenant_queue_depth,
            tenant_concurrency=args.tenant_concurrency,
            aging_seconds=args.aging_s,
            breaker_threshold=args.breaker_threshold,
            breaker_cooldown_seconds=args.breaker_cooldown_s,
        )
    )


async def _serve(
    args: argparse.Namespace, *, token: str, tls: ServerTls | None, settings: SchedulerSettings
) -> None:
    server, _ = await start_scheduler(
        listen=args.listen,
        service_token=token,
        tls=tls,
        health_listen=args.health_listen,
        settings=settings,
    )
    logging.getLogger(__name__).info(
        "scheduler listening on port %d (%s)", server.port, listener_mode(tls)
    )
    await run_until_signalled()
    await server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
