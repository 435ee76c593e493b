"""The model host's spans, relayed to its worker over the host's channel for the worker to export.

The host may not reach an OTLP collector itself: its seccomp filter refuses every socket but
AF_UNIX and AF_NETLINK (and Landlock refuses TCP connect where the kernel has network rules), so
a loopback collector is as unreachable as a remote one, by design. Its finished spans therefore
travel as `HostSpans` frames (an OTLP `ExportTraceServiceRequest`, serialized) on the pipe it
already has, and the worker hands them to its own bounded OTLP export. The host sends from its
span export thread, never from the serving loop; the worker decodes on its event loop (a few
spans per frame, microseconds each) and only queues them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from gantry.common.bounded_spans import DROPPED_SPAN, PROCESS_DROPS
from gantry.common.telemetry import export_relayed_spans
from gantry.v1 import model_host_pb2

logger = logging.getLogger("gantry.worker.model_host")

# HostSpans frames answer no request.
RELAY_REQUEST_ID = 0

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


class HostSpanRelay(SpanExporter):
    """The host's side: each batch becomes one HostSpans frame, sent with `send` (the host's
    `ResponseWriter.send`, whose lock keeps the frame whole beside the serving loop's answers)."""

    def __init__(self, send: Callable[[model_host_pb2.HostResponse], None]) -> None:
        self._send = send

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        request = encode_spans(spans)
        self._send(
            model_host_pb2.HostResponse(
                request_id=RELAY_REQUEST_ID,
                spans=model_host_pb2.HostSpans(otlp_export_request=request.SerializeToString()),
            )
        )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def export_host_spans(relayed: model_host_pb2.HostSpans, deployment_id: str) -> None:
    """The worker's side: a host's HostSpans frame into this process's OTLP export (never blocks;
    a frame that does not decode is counted as dropped, it never breaks the channel)."""
    try:
        spans = decode_spans(relayed.otlp_export_request)
    except (DecodeError, ValueError) as exc:
        PROCESS_DROPS.add(DROPPED_SPAN)
        logger.warning("model host %s relayed spans that do not decode: %s", deployment_id, exc)
        return
    export_relayed_spans(spans)


def decode_spans(payload: bytes) -> list[ReadableSpan]:
    """The finished spans an OTLP ExportTraceServiceRequest carries, as the SDK's spans."""
    request = ExportTraceServiceRequest.FromString(payload)
    spans: list[ReadableSpan] = []
    for resource_spans in request.resource_spans:
        resource = Resource(
            _attributes(resource_spans.resource.attributes), resource_spans.schema_url or None
        )
        for scope_spans in resource_spans.scope_spans:
            scope = InstrumentationScope(
                scope_spans.scope.name,
                scope_spans.scope.version or None,
                scope_spans.schema_url or None,
            )
            spans.extend(_span(span, resource, scope) for span in scope_spans.spans)
    return spans


def _span(span: OtlpSpan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = _identifier(span.trace_id, 16, "trace id")
    trace_state = TraceState.from_header([span.trace_state]) if span.trace_state else None
    parent = None
    if span.parent_span_id:
        parent = SpanContext(
            trace_id,
            _identifier(span.parent_span_id, 8, "parent span id"),
            is_remote=bool(span.flags & SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK),
            trace_flags=_SAMPLED,
        )
    code = StatusCode(span.status.code)
    return ReadableSpan(
        name=span.name,
        context=SpanContext(
            trace_id,
            _identifier(span.span_id, 8, "span id"),
            is_remote=False,
            trace_flags=_SAMPLED,
            trace_state=trace_state,
        ),
        parent=parent,
        resource=resource,
        attributes=_attributes(span.attributes),
        events=[
            Event(event.name, _attributes(event.attributes), event.time_unix_nano)
            for event in span.events
        ],
        links=[
            Link(
                SpanContext(
                    _identifier(link.trace_id, 16, "link trace id"),
                    _identifier(link.span_id, 8, "link span id"),
                    is_remote=bool(link.flags & SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK),
                ),
                _attributes(link.attributes),
            )
            for link in span.links
        ],
        # OTLP numbers the kinds from 1 (0 is unspecified); the SDK from 0.
        kind=SpanKind(span.kind - 1) if span.kind else SpanKind.INTERNAL,
        status=Status(code, span.status.message if code is StatusCode.ERROR else None),
        start_time=span.start_time_unix_nano,
        end_time=span.end_time_unix_nano,
        instrumentation_scope=scope,
    )


def _identifier(raw: bytes, width: int, what: str) -> int:
    if len(raw) != width:
        raise ValueError(f"a relayed span's {what} has {len(raw)} bytes, not {width}")
    return int.from_bytes(raw, "big")


def _attributes(pairs: Sequence[KeyValue]) -> Mapping[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)
