"""The bounded span processor: at most 64 spans in flight, the rest dropped and counted; a failing
or hanging exporter never reaches the thread that ends a span; flush and shutdown are bounded."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gantry.common.bounded_spans import (
    DROPPED_SPAN,
    FAILED_SPAN_EXPORT,
    FAILURE_LOG_INTERVAL_S,
    MAX_IN_FLIGHT,
    BoundedSpanProcessor,
    ObservationDrops,
)
from gantry.common.telemetry import dropped_observations, otlp_traces_configured


def finished_span(name: str = "work") -> ReadableSpan:
    span = TracerProvider().get_tracer("test").start_span(name)
    span.end()
    assert isinstance(span, ReadableSpan)
    return span


class HangingExporter(SpanExporter):
    """Blocks every export until released: a collector that accepts and never answers."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.exported: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait()
        self.exported.extend(spans)
        return SpanExportResult.SUCCESS


class RaisingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionRefusedError("collector down")


class RecordingExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported.extend(spans)
        return SpanExportResult.SUCCESS


def test_the_65th_span_in_flight_is_dropped_and_counted() -> None:
    exporter = HangingExporter()
    drops = ObservationDrops()
    processor = BoundedSpanProcessor(exporter, name="test", drops=drops, schedule_delay_s=0)
    span = finished_span()
    processor.on_end(span)
    assert exporter.entered.wait(5), "the export thread never started"
    for _ in range(MAX_IN_FLIGHT - 1):
        processor.on_end(span)
    assert processor.in_flight == MAX_IN_FLIGHT
    assert drops.snapshot() == {}

    processor.on_end(span)

    assert drops.snapshot() == {DROPPED_SPAN: 1}
    assert processor.in_flight == MAX_IN_FLIGHT
    exporter.release.set()
    assert processor.force_flush()
    assert len(exporter.exported) == MAX_IN_FLIGHT
    assert processor.in_flight == 0
    processor.shutdown()


def test_a_hanging_exporter_never_blocks_on_end() -> None:
    exporter = HangingExporter()
    drops = ObservationDrops()
    processor = BoundedSpanProcessor(exporter, name="test", drops=drops, schedule_delay_s=0)
    span = finished_span()
    processor.on_end(span)
    assert exporter.entered.wait(5)

    # The exporter stays blocked until release is set below: had on_end waited for it, this
    # loop would never end (the test's timeout would fail it); it ends with every span past the
    # bound dropped instead.
    for _ in range(10_000):
        processor.on_end(span)
    assert not exporter.release.is_set()
    assert drops.snapshot()[DROPPED_SPAN] == 10_000 - (MAX_IN_FLIGHT - 1)
    exporter.release.set()
    processor.shutdown()


def test_a_raising_exporter_counts_failures_and_the_thread_lives_on() -> None:
    exporter = RaisingExporter()
    drops = ObservationDrops()
    processor = BoundedSpanProcessor(exporter, name="test", drops=drops, schedule_delay_s=0)
    span = finished_span()
    for _ in range(3):
        processor.on_end(span)
    assert processor.force_flush()
    processor.on_end(span)
    assert processor.force_flush()
    assert exporter.calls >= 2
    assert drops.snapshot() == {FAILED_SPAN_EXPORT: 4}
    processor.shutdown()


def test_failures_are_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    processor = BoundedSpanProcessor(
        RaisingExporter(),
        name="test",
        drops=ObservationDrops(),
        schedule_delay_s=0,
        clock=lambda: now[0],
    )
    span = finished_span()
    caplog.set_level(logging.WARNING, logger="gantry.telemetry")
    for _ in range(20):
        processor.on_end(span)
        assert processor.force_flush()
    assert len(caplog.records) == 1

    now[0] += FAILURE_LOG_INTERVAL_S
    processor.on_end(span)
    assert processor.force_flush()
    assert len(caplog.records) == 2
    assert "20 spans lost" in caplog.records[1].getMessage()
    processor.shutdown()


def test_shutdown_is_bounded_while_the_exporter_hangs() -> None:
    exporter = HangingExporter()
    drops = ObservationDrops()
    processor = BoundedSpanProcessor(
        exporter, name="test", drops=drops, schedule_delay_s=0, shutdown_bound_s=0.3
    )
    span = finished_span()
    processor.on_end(span)
    assert exporter.entered.wait(5)

    # The export stays blocked until release is set below, so both return without waiting for
    # it: the flush reports it did not finish, and shutdown gives up at its own bound.
    assert processor.force_flush(timeout_millis=60_000) is False
    processor.shutdown()
    assert not exporter.release.is_set()
    processor.on_end(span)  # after shutdown: dropped, never queued
    assert drops.snapshot() == {DROPPED_SPAN: 1}
    exporter.release.set()


def test_shutdown_exports_what_is_queued() -> None:
    exporter = RecordingExporter()
    processor = BoundedSpanProcessor(exporter, name="test", drops=ObservationDrops())
    span = finished_span()
    for _ in range(5):
        processor.on_end(span)
    processor.shutdown()  # well before the 0.5 s schedule delay
    assert len(exporter.exported) == 5


def test_the_thread_starts_with_the_first_span_not_before() -> None:
    # The model host installs its processor before its sandbox, which refuses a second thread.
    before = {thread.name for thread in threading.enumerate()}
    processor = BoundedSpanProcessor(RecordingExporter(), name="lazy", drops=ObservationDrops())
    assert "span-export-lazy" not in {thread.name for thread in threading.enumerate()} - before
    processor.on_end(finished_span())
    assert "span-export-lazy" in {thread.name for thread in threading.enumerate()}
    processor.shutdown()


def test_dropped_observations_is_a_snapshot_by_kind() -> None:
    counts = dropped_observations()
    assert isinstance(counts, dict)
    assert all(isinstance(kind, str) and count >= 0 for kind, count in counts.items())


@pytest.mark.parametrize(
    ("environ", "configured"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "otlp"}, True),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "console"},
            False,
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ],
)
def test_otlp_export_follows_the_standard_variables(
    environ: dict[str, str], configured: bool
) -> None:
    assert otlp_traces_configured(environ) is configured


def test_a_lone_span_is_exported_after_the_schedule_delay_without_a_flush() -> None:
    exported = threading.Semaphore(0)

    class SignallingExporter(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for _ in spans:
                exported.release()
            return SpanExportResult.SUCCESS

    processor = BoundedSpanProcessor(
        SignallingExporter(), name="test", drops=ObservationDrops(), schedule_delay_s=0.05
    )
    span = finished_span()
    processor.on_end(span)
    assert exported.acquire(timeout=5), "a lone span was never exported"
    # The thread is idle again now: a later lone span must wake it too.
    processor.on_end(span)
    assert exported.acquire(timeout=5), "the second lone span was never exported"
    processor.shutdown()
