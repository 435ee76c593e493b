"""`gantry scheduler`: run the scheduler server until SIGINT/SIGTERM.

Its flags and configuration variables are read and checked in `settings.py`; this module only
starts what they describe.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from gantry.common.metrics import start_metrics
from gantry.common.process import run_until_signalled, setup_logging
from gantry.common.telemetry import setup_tracing
from gantry.common.tls import TlsSettingsError, listener_mode
from gantry.scheduler.server import start_scheduler
from gantry.scheduler.settings import SchedulerConfig, read_settings


def main(argv: list[str] | None = None) -> int:
    config = read_settings(argv)
    setup_logging("scheduler", config.log_format, environ=config.logging_environment())
    setup_tracing("gantry-scheduler")
    if not start_metrics("gantry-scheduler", config.metrics_address):
        return 2
    token = config.service_token_file.read_text().strip()
    try:
        asyncio.run(_serve(config, token=token))
    except TlsSettingsError as exc:  # an unreadable certificate or key: one line, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


async def _serve(config: SchedulerConfig, *, token: str) -> None:
    tls = config.server_tls()
    server, _ = await start_scheduler(
        listen=config.listen,
        service_token=token,
        tls=tls,
        health_listen=config.health_listen,
        settings=config.scheduler_settings(),
    )
    logging.getLogger(__name__).info(
        "scheduler listening on port %d (%s)", server.port, listener_mode(tls)
    )
    await run_until_signalled()
    await server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
