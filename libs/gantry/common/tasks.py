"""Ending a background task: cancel it and wait until it has unwound."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (None or already done: nothing to do) and wait for it to finish, so what it
    holds is released before the caller goes on; its cancellation is not the caller's."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
