"""OpenTelemetry setup for every Gantry process, and W3C context carried in stream envelopes.

Stream messages carry a `trace_context` map because one stream carries many operations; gRPC
metadata would only describe the stream itself.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, MutableMapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

# Where a process writes its finished spans as JSON lines (one span per line). Children inherit it,
# so the model host's spans land beside the worker's.
TRACE_FILE_ENV = "GANTRY_TRACE_FILE"

_setup_lock = threading.Lock()
_configured = False


class JsonLinesSpanExporter(SpanExporter):
    """Appends each span as one JSON line; safe for several processes appending to one file."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(
            json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n" for span in spans
        )
        with self._lock, open(self._path, "a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def setup_tracing(service_name: str, *, synchronous: bool = False) -> TracerProvider | None:
    """Install one TracerProvider per process (idempotent) when spans have somewhere to go, and
    return it; None when no exporter is configured.

    Without an exporter the API's no-op tracer stays in place: a recording span that nobody
    exports still costs its creation and context propagation on every hop of every call (about
    0.1 ms per span here), for nothing. W3C context still flows through the stream envelopes.
    `synchronous` exports each span as it ends: for short-lived children such as the model host,
    whose spans must not die in a batch buffer when the process is killed.
    """
    global _configured
    with _setup_lock:
        provider = trace.get_tracer_provider()
        if _configured and isinstance(provider, TracerProvider):
            return provider
        trace_file = os.environ.get(TRACE_FILE_ENV)
        if not trace_file:
            return None
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        exporter = JsonLinesSpanExporter(trace_file)
        processor = (
            SimpleSpanProcessor(exporter)
            if synchronous
            else BatchSpanProcessor(exporter, schedule_delay_millis=500)
        )
        provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _configured = True
        return provider


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_context(carrier: MutableMapping[str, str]) -> None:
    """Write the current span's W3C context into a stream message's trace_context map."""
    propagate.inject(carrier)


def extract_context(carrier: Mapping[str, str]) -> otel_context.Context:
    return propagate.extract(dict(carrier))


def flush_tracing() -> None:
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(timeout_millis=2000)
