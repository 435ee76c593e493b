"""Logging what a worker said: bounded excerpts, rate-limited per node.

A node credential must not be able to fill the control plane's disk (issue 26, item 5: 8 MB
progress strings logged verbatim, 1.14 GB in under a minute). Everything the gateway logs that a
worker supplied goes through `WorkerLog`: each text argument becomes an excerpt (its first
`EXCERPT_CHARS` characters, quoted so a newline cannot forge a log line, and its total length),
and each node has a small token bucket; what a full bucket suppresses is counted and reported
with the node's next line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

EXCERPT_CHARS = 200
# Per node: a burst of lines, then a steady rate.
LOG_BURST = 20
LOG_RATE_PER_S = 2.0
# Buckets kept at most (one per node heard from); past it, full ones are forgotten first.
MAX_SOURCES = 10_000


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` quoted, cut to `limit` characters with its full length said when longer."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    suppressed: int = 0


class SourceRateLimiter:
    """A token bucket per source: `admit` says whether a line may be written now, and how many
    were suppressed since the last one that was."""

    def __init__(
        self,
        *,
        burst: int = LOG_BURST,
        rate_per_s: float = LOG_RATE_PER_S,
        max_sources: int = MAX_SOURCES,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._rate = rate_per_s
        self._max_sources = max_sources
        self._now = now
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, source: str) -> tuple[bool, int]:
        now = self._now()
        bucket = self._buckets.get(source)
        if bucket is None:
            self._make_room()
            bucket = self._buckets[source] = _Bucket(tokens=float(self._burst), at=now)
        bucket.tokens = min(float(self._burst), bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            bucket.suppressed += 1
            return False, 0
        bucket.tokens -= 1.0
        suppressed, bucket.suppressed = bucket.suppressed, 0
        return True, suppressed

    def _make_room(self) -> None:
        if len(self._buckets) < self._max_sources:
            return
        # Buckets that suppressed nothing lose nothing by being forgotten; else drop the oldest.
        quiet = [source for source, bucket in self._buckets.items() if not bucket.suppressed]
        for source in quiet or list(self._buckets)[: max(1, self._max_sources // 10)]:
            del self._buckets[source]


# One bucket per node for every module's WorkerLog: a node's budget is the same wherever it logs.
SHARED_LIMITER = SourceRateLimiter()


class WorkerLog:
    """The one way the gateway logs worker-supplied text: `log(level, node_id, fmt, *args)`
    writes `node <id>: fmt % args` with every str argument made an excerpt, within the node's
    rate (`SHARED_LIMITER` unless a test gives its own)."""

    def __init__(self, logger: logging.Logger, limiter: SourceRateLimiter | None = None) -> None:
        self._logger = logger
        self._limiter = limiter or SHARED_LIMITER

    def log(
        self, level: int, node_id: str, fmt: str, *args: object, exc_info: bool = False
    ) -> bool:
        """True when the line was written (False: over the node's rate, or the level is off)."""
        if not self._logger.isEnabledFor(level):
            return False
        admitted, suppressed = self._limiter.admit(node_id)
        if not admitted:
            return False
        values = tuple(excerpt(a) if isinstance(a, str) else a for a in args)
        if suppressed:
            fmt += " (%d earlier lines from this node suppressed)"
            values += (suppressed,)
        self._logger.log(level, "node %s: " + fmt, node_id, *values, exc_info=exc_info)
        return True

    def info(self, node_id: str, fmt: str, *args: object) -> bool:
        return self.log(logging.INFO, node_id, fmt, *args)

    def warning(self, node_id: str, fmt: str, *args: object) -> bool:
        return self.log(logging.WARNING, node_id, fmt, *args)

    def error(self, node_id: str, fmt: str, *args: object) -> bool:
        return self.log(logging.ERROR, node_id, fmt, *args)

    def exception(self, node_id: str, fmt: str, *args: object) -> bool:
        """An error with the traceback being handled (a worker can trigger one repeatedly)."""
        return self.log(logging.ERROR, node_id, fmt, *args, exc_info=True)
