"""What every Gantry service process does at start: logging, and waiting for a stop signal."""

from __future__ import annotations

import asyncio
import logging
import os
import signal


def setup_logging(role: str) -> None:
    logging.basicConfig(
        level=os.environ.get("GANTRY_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s",
    )


async def run_until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
