"""The event loop a service runs on: asyncio's own, or uvloop where GANTRY_EVENT_LOOP=uvloop
asks for it and it is installed (issue 29 measured both; see `make bench`'s note).

One place for the choice, so the services' `main`s do not each decide it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

EVENT_LOOP_ENV = "GANTRY_EVENT_LOOP"

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop GANTRY_EVENT_LOOP names (asyncio unless uvloop)."""
    if os.environ.get(EVENT_LOOP_ENV, "asyncio") == "uvloop":
        try:
            import uvloop
        except ImportError:
            logging.getLogger(__name__).warning(
                "%s=uvloop but uvloop is not installed; running on asyncio's loop", EVENT_LOOP_ENV
            )
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)
