"""`gantry scheduler`: run the scheduler server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from gantry.common.process import run_until_signalled, setup_logging
from gantry.common.telemetry import setup_tracing
from gantry.common.tls import (
    TlsSettingsError,
    add_server_tls_arguments,
    listener_mode,
    server_tls_from,
)
from gantry.scheduler.server import start_scheduler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gantry scheduler")
    parser.add_argument("--listen", default="127.0.0.1:50052")
    parser.add_argument("--service-token-file", type=Path, required=True)
    parser.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1 alone, plaintext, here (probes that cannot speak TLS)",
    )
    add_server_tls_arguments(parser)
    args = parser.parse_args(argv)
    try:
        tls = server_tls_from(args)
        if tls is not None:
            tls.credentials()  # every file readable now, before the port is bound
    except TlsSettingsError as exc:
        parser.error(str(exc))
    setup_logging("scheduler")
    setup_tracing("gantry-scheduler")
    token = args.service_token_file.read_text().strip()

    async def serve() -> None:
        server, _ = await start_scheduler(
            listen=args.listen, service_token=token, tls=tls, health_listen=args.health_listen
        )
        logging.getLogger(__name__).info(
            "scheduler listening on port %d (%s)", server.port, listener_mode(tls)
        )
        await run_until_signalled()
        await server.stop()

    try:
        asyncio.run(serve())
    except TlsSettingsError as exc:  # an unreadable certificate or key: one line, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
