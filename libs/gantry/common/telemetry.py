"""OpenTelemetry setup for every Gantry process, and W3C context carried in stream envelopes.

Stream messages carry a `trace_context` map because one stream carries many operations; gRPC
metadata would only describe the stream itself.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import OTEL_SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gantry.common.bounded_spans import (
    DROPPED_SPAN,
    FAILURE_LOG_INTERVAL_S,
    PROCESS_DROPS,
    SHUTDOWN_BOUND_S,
    BoundedSpanProcessor,
)

# Where a process writes its finished spans as JSON lines (one span per line). Children inherit it,
# so the model host's spans land beside the worker's.
TRACE_FILE_ENV = "GANTRY_TRACE_FILE"

# The standard variables that turn OTLP span export on (the exporter reads the rest itself:
# headers, insecure, certificates, compression, timeout).
OTLP_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
OTLP_TIMEOUT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
# Without an operator's timeout, one export attempt (its retries included) gives up after this:
# the SDK's default of 10 s would hold a batch's share of the in-flight bound that long.
DEFAULT_EXPORT_TIMEOUT_S = 5.0
_OTLP_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"

logger = logging.getLogger("gantry.telemetry")

_setup_lock = threading.RLock()
_configured = False
# The processors that export to a collector: spans the model host relays (it may not open a
# socket itself) are handed to these, never to the trace file, which the host writes itself.
_relay_sinks: list[SpanProcessor] = []


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


class _OncePerInterval(logging.Filter):
    """Lets one record through per interval: a dead collector must not flood the logs."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._passed_at: float | None = None
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._passed_at is not None and now - self._passed_at < self._interval_s:
                return False
            self._passed_at = now
            return True


def otlp_traces_configured(environ: Mapping[str, str] | None = None) -> bool:
    """True when the standard variables ask for OTLP span export: an endpoint is set and
    OTEL_TRACES_EXPORTER (a comma list) is unset or names `otlp` (`none` turns it off)."""
    env = os.environ if environ is None else environ
    if not any(env.get(name, "").strip() for name in OTLP_ENDPOINT_ENVS):
        return False
    chosen = {part.strip().lower() for part in env.get(TRACES_EXPORTER_ENV, "").split(",")}
    chosen.discard("")
    return not chosen or "otlp" in chosen


def service_resource(service_name: str) -> Resource:
    """This process's resource: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME as the standard
    says, `service_name` when neither names the service; `gantry.component` always says which
    Gantry process it is (an operator may give every process one service name)."""
    detected = Resource.create({"gantry.component": service_name})
    named = bool(os.environ.get(OTEL_SERVICE_NAME, "").strip()) or not str(
        detected.attributes.get("service.name", "unknown_service")
    ).startswith("unknown_service")
    if named:
        return detected
    return Resource.create({"gantry.component": service_name, "service.name": service_name})


def otlp_span_exporter() -> SpanExporter:
    """The OTLP gRPC span exporter, configured by the standard OTEL_EXPORTER_OTLP_* variables."""
    # Imported here: grpc has no business in a process that does not export (the model host).
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    exporter_logger = logging.getLogger(_OTLP_EXPORTER_LOGGER)
    if not any(isinstance(f, _OncePerInterval) for f in exporter_logger.filters):
        exporter_logger.addFilter(_OncePerInterval(FAILURE_LOG_INTERVAL_S))
    operator_timeout = any(os.environ.get(name, "").strip() for name in OTLP_TIMEOUT_ENVS)
    return OTLPSpanExporter(timeout=None if operator_timeout else DEFAULT_EXPORT_TIMEOUT_S)


def start_otlp_export() -> BoundedSpanProcessor | None:
    """A bounded OTLP export processor when the environment asks for one (None otherwise), for
    the caller to add to its provider; it also takes the spans model hosts relay."""
    if not otlp_traces_configured():
        return None
    processor = BoundedSpanProcessor(otlp_span_exporter(), name="otlp")
    with _setup_lock:
        _relay_sinks.append(processor)
    return processor


def stop_otlp_export(processor: BoundedSpanProcessor) -> None:
    """Stop taking relayed spans, then shut the processor down (bounded)."""
    with _setup_lock:
        if processor in _relay_sinks:
            _relay_sinks.remove(processor)
    processor.shutdown()


def export_relayed_spans(spans: Sequence[ReadableSpan]) -> None:
    """Spans another process finished (a model host's), to this process's collector export;
    counted as dropped when this process exports to no collector. Never blocks."""
    with _setup_lock:
        sinks = list(_relay_sinks)
    if not sinks:
        PROCESS_DROPS.add(DROPPED_SPAN, len(spans))
        return
    for span in spans:
        for sink in sinks:
            sink.on_end(span)


def setup_tracing(service_name: str, *, relay: SpanExporter | None = None) -> TracerProvider | None:
    """Install one TracerProvider per process (idempotent) when spans have somewhere to go, and
    return it; None when no exporter is configured.

    Spans go to the trace file (GANTRY_TRACE_FILE) and, when the standard OTEL_* variables ask
    for it, to an OTLP collector over gRPC; each through its own `BoundedSpanProcessor`, so
    export never runs on a request's thread and never blocks it. `relay` replaces the OTLP
    exporter in a process that may not open a socket (the model host hands its spans to its
    worker, which exports them).

    Without an exporter the API's no-op tracer stays in place: a recording span that nobody
    exports still costs its creation and context propagation on every hop of every call (about
    0.1 ms per span here), for nothing. W3C context still flows through the stream envelopes.
    At a normal exit the provider's shutdown exports what is queued, within `SHUTDOWN_BOUND_S`;
    a process that is killed loses the spans still queued.
    """
    global _configured
    with _setup_lock:
        current = trace.get_tracer_provider()
        if _configured and isinstance(current, TracerProvider):
            return current
        trace_file = os.environ.get(TRACE_FILE_ENV)
        otlp = otlp_traces_configured()
        if not trace_file and not otlp:
            return None
        provider = TracerProvider(resource=service_resource(service_name))
        if trace_file:
            provider.add_span_processor(
                BoundedSpanProcessor(JsonLinesSpanExporter(trace_file), name="file")
            )
        if otlp and relay is not None:
            provider.add_span_processor(BoundedSpanProcessor(relay, name="relay"))
        elif otlp:
            processor = start_otlp_export()
            if processor is not None:
                provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _configured = True
        return provider


class _CurrentSpan:
    """`start_as_current_span`'s scope while no TracerProvider is installed: the span already
    current, unchanged. The API's no-op tracer would make a non-recording copy of that span's
    context and attach it, which carries the same W3C context on, for about 25 us a call."""

    __slots__ = ()

    def __enter__(self) -> trace.Span:
        return trace.get_current_span()

    def __exit__(self, *exc_info: object) -> None:
        return None


_CURRENT_SPAN = _CurrentSpan()


class _ParentSpan:
    """`start_as_current_span(context=...)`'s scope while no TracerProvider is installed: the
    context's span made current, as the no-op tracer does (its span is that one's context), so
    a remote parent read from a stream envelope flows on, without the no-op tracer's own work."""

    __slots__ = ("_span", "_token")

    def __init__(self, context: otel_context.Context) -> None:
        self._span = trace.get_current_span(context)

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, *exc_info: object) -> None:
        otel_context.detach(self._token)


class GantryTracer(trace.Tracer):
    """The API's tracer for `name`, whose `start_as_current_span` costs next to nothing on a
    process that records no spans (no provider installed: `setup_tracing` found no exporter),
    with the W3C context flowing on as the no-op tracer would carry it. `start_span` is the API
    tracer's own."""

    def __init__(self, name: str) -> None:
        self._tracer = trace.get_tracer(name)

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._tracer.start_span(*args, **kwargs)

    def start_as_current_span(  # type: ignore[override]
        self, name: str, context: otel_context.Context | None = None, **options: Any
    ) -> AbstractContextManager[trace.Span]:
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return self._tracer.start_as_current_span(name, context, **options)
        return _CURRENT_SPAN if context is None else _ParentSpan(context)


def tracer(name: str) -> GantryTracer:
    return GantryTracer(name)


def inject_context(carrier: MutableMapping[str, str]) -> None:
    """Write the current span's W3C context into a stream message's trace_context map."""
    propagate.inject(carrier)


def extract_context(carrier: Mapping[str, str]) -> otel_context.Context:
    return propagate.extract(dict(carrier))


def flush_tracing(timeout_s: float = SHUTDOWN_BOUND_S) -> None:
    """Export what this process's spans queued, waiting at most `timeout_s`."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(timeout_millis=int(timeout_s * 1000))


def dropped_observations() -> dict[str, int]:
    """Observations this process gave up on, by kind ("span": the queue was full;
    "span_export_failed": the exporter failed). Thread-safe; counts only grow."""
    return PROCESS_DROPS.snapshot()
