"""Drains a model host's stderr into the log and keeps its last lines for failure messages."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

logger = logging.getLogger("gantry.worker.model_host")

STDERR_TAIL_LINES = 50
_STDERR_CHUNK_BYTES = 64 * 1024
_STDERR_SETTLE_S = 0.5


class StderrTail:
    """Drains the child's stderr (a full pipe would block it), logs it, keeps the last lines."""

    def __init__(self, stream: asyncio.StreamReader, deployment_id: str) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._deployment_id = deployment_id
        self.task = asyncio.create_task(
            self._drain(stream), name=f"model-host-stderr-{deployment_id}"
        )

    def lines(self) -> list[str]:
        return list(self._lines)

    def text(self) -> str:
        return "\n".join(self._lines)

    async def settle(self) -> None:
        """Give the last lines of an exiting child a moment to arrive."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), _STDERR_SETTLE_S)

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        partial = b""
        while chunk := await stream.read(_STDERR_CHUNK_BYTES):
            *complete, partial = (partial + chunk).split(b"\n")
            for line in complete:
                self._record(line)
            if len(partial) > _STDERR_CHUNK_BYTES:
                self._record(partial)
                partial = b""
        if partial:
            self._record(partial)

    def _record(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip()
        if line:
            self._lines.append(line)
            logger.info("model-host %s: %s", self._deployment_id, line)
