"""`gantry scheduler`: run the scheduler server until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from gantry.common.process import run_until_signalled, setup_logging
from gantry.common.telemetry import setup_tracing
from gantry.scheduler.server import start_scheduler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gantry scheduler")
    parser.add_argument("--listen", default="127.0.0.1:50052")
    parser.add_argument("--service-token-file", type=Path, required=True)
    args = parser.parse_args(argv)
    setup_logging("scheduler")
    setup_tracing("gantry-scheduler")
    token = args.service_token_file.read_text().strip()

    async def serve() -> None:
        server, _ = await start_scheduler(listen=args.listen, service_token=token)
        logging.getLogger(__name__).info("scheduler listening on port %d", server.port)
        await run_until_signalled()
        await server.stop()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
