"""Span export that never touches the request path: at most 64 spans in flight, the rest dropped
and counted, one daemon thread exporting in batches.

`on_end` only appends to a bounded queue and returns: a slow, failing or hanging exporter can
cost a process its spans, never an invocation its latency. Nothing here blocks longer than its
stated bound except the export thread itself, which only the exporter's own timeout can free.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger("gantry.telemetry")

# Issue 10: "at most 64 observation writes in flight, the rest counted as dropped". In flight
# means accepted and not yet through an export attempt, so a hung export holds its batch's share.
MAX_IN_FLIGHT = 64
# A batch waits this long for company before it goes out: one export call per span would cost
# the exporting process more than the spans are worth.
SCHEDULE_DELAY_S = 0.5
# force_flush and shutdown never wait longer than this, whatever the exporter does.
SHUTDOWN_BOUND_S = 2.0
# Export failures are logged once per this interval (with their count), never once per span.
FAILURE_LOG_INTERVAL_S = 60.0

# Kinds of lost observation, the label values of gantry_observations_dropped_total{kind}.
DROPPED_SPAN = "span"  # queue full, or ended after shutdown
FAILED_SPAN_EXPORT = "span_export_failed"  # in a batch the exporter failed, raised on, or refused


class ObservationDrops:
    """Thread-safe counts of observations a process gave up on, by kind (only ever grow)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def add(self, kind: str, count: int = 1) -> None:
        with self._lock:
            self._counts[kind] += count

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


# The process's one tally; processors count into it unless a test hands them their own.
PROCESS_DROPS = ObservationDrops()


class BoundedSpanProcessor(SpanProcessor):
    """Queues finished spans for one exporter; drops (and counts) what does not fit.

    The export thread starts with the first span, not with the processor: the model host installs
    its processor before it enters its sandbox, which refuses a process that runs a second thread.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        name: str,
        drops: ObservationDrops = PROCESS_DROPS,
        max_in_flight: int = MAX_IN_FLIGHT,
        schedule_delay_s: float = SCHEDULE_DELAY_S,
        shutdown_bound_s: float = SHUTDOWN_BOUND_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._exporter = exporter
        self._name = name
        self._drops = drops
        self._max_in_flight = max_in_flight
        self._schedule_delay_s = schedule_delay_s
        self._shutdown_bound_s = shutdown_bound_s
        self._clock = clock
        self._changed = threading.Condition()
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._in_flight = 0
        self._accepted = 0
        self._settled = 0  # accepted spans through an export attempt, exported or not
        self._flush_wanted = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._failed_since_log = 0
        self._last_failure: str = ""
        self._failure_logged_at: float | None = None

    # -- the span's thread: never blocks ---------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        with self._changed:
            if self._stopping or self._in_flight >= self._max_in_flight:
                accepted = False
            else:
                accepted = True
                self._queue.append(span)
                self._in_flight += 1
                self._accepted += 1
                if self._thread is None:
                    self._start_thread()
                elif len(self._queue) == 1 or len(self._queue) == self._max_in_flight // 2:
                    # The first span starts the thread's schedule delay; half full ends it.
                    self._changed.notify_all()
        if not accepted:
            self._drops.add(DROPPED_SPAN)

    @property
    def in_flight(self) -> int:
        with self._changed:
            return self._in_flight

    def _start_thread(self) -> None:
        self._thread = threading.Thread(
            target=self._export_loop, name=f"span-export-{self._name}", daemon=True
        )
        self._thread.start()

    # -- the export thread -----------------------------------------------------------------------

    def _next_batch(self) -> list[ReadableSpan] | None:
        """Wait for spans (up to the schedule delay for a fuller batch); None once stopped."""
        with self._changed:
            while not self._queue:
                if self._stopping:
                    return None
                self._changed.wait()
            deadline = self._clock() + self._schedule_delay_s
            while (
                len(self._queue) < self._max_in_flight // 2
                and not (self._flush_wanted or self._stopping)
                and (remaining := deadline - self._clock()) > 0
            ):
                self._changed.wait(remaining)
            batch = list(self._queue)
            self._queue.clear()
            return batch

    def _export_loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            failure = self._export(batch)
            # Counted before the batch settles: a flush that returns has its failures counted.
            if failure is not None:
                self._drops.add(FAILED_SPAN_EXPORT, len(batch))
                self._note_failure(len(batch), failure)
            with self._changed:
                self._in_flight -= len(batch)
                self._settled += len(batch)
                self._changed.notify_all()

    def _export(self, batch: list[ReadableSpan]) -> str | None:
        """None when exported, else why not; an exporter's exception stops here."""
        try:
            result = self._exporter.export(batch)
        except Exception as exc:  # whatever the exporter does, the thread must live on
            return f"{type(exc).__name__}: {exc}"
        if result is not SpanExportResult.SUCCESS:
            return f"the exporter answered {result.name}"
        return None

    def _note_failure(self, count: int, failure: str) -> None:
        self._failed_since_log += count
        self._last_failure = failure
        now = self._clock()
        if (
            self._failure_logged_at is not None
            and now - self._failure_logged_at < FAILURE_LOG_INTERVAL_S
        ):
            return
        logger.warning(
            "span export (%s) failed: %d spans lost since the last report; last failure: %s",
            self._name,
            self._failed_since_log,
            self._last_failure,
        )
        self._failure_logged_at = now
        self._failed_since_log = 0

    # -- flush and shutdown: bounded -------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every span accepted so far went through an export attempt; False when the
        bound (the smaller of `timeout_millis` and the shutdown bound) passed first."""
        bound_s = min(timeout_millis / 1000, self._shutdown_bound_s)
        with self._changed:
            target = self._accepted
            self._flush_wanted = True
            self._changed.notify_all()
            try:
                return self._changed.wait_for(lambda: self._settled >= target, timeout=bound_s)
            finally:
                self._flush_wanted = False

    def shutdown(self) -> None:
        """Export what is queued, within the shutdown bound; spans ended later are dropped.

        A process that is killed loses the spans still queued: export is off the request path,
        so nothing was written when the span ended.
        """
        with self._changed:
            if self._stopping:
                return
            self._stopping = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(self._shutdown_bound_s)
            if thread.is_alive():
                logger.warning(
                    "span export (%s) still busy after %.1fs at shutdown; %d spans not exported",
                    self._name,
                    self._shutdown_bound_s,
                    self.in_flight,
                )
        try:
            self._exporter.shutdown()
        except Exception:
            logger.exception("span exporter (%s) failed to shut down", self._name)
