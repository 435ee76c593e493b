"""A model host's spans survive the relay to its worker: what the host encodes into a HostSpans
frame decodes into the same spans (ids, parent, resource, attributes, events, status)."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from gantry.v1 import model_host_pb2
from gantry.worker.model_host.span_relay import HostSpanRelay, decode_spans


def host_spans() -> list[ReadableSpan]:
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "gantry-model-host", "gantry.component": "gantry-model-host"}
        )
    )
    tracer = provider.get_tracer("gantry.model_host", "1.2")
    worker_invoke = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    parent = trace.set_span_in_context(trace.NonRecordingSpan(worker_invoke))
    embed = tracer.start_span(
        "model_host.embed",
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"gantry.input_count": 3, "gantry.ratio": 0.5, "gantry.tags": ("a", "b")},
        links=[Link(worker_invoke, {"why": "batch-mate"})],
    )
    embed.add_event("batched", {"gantry.batch_inputs": 7})
    embed.set_status(Status(StatusCode.ERROR, "forward pass failed"))
    embed.end()
    load = tracer.start_span("model_host.load")
    load.end()
    assert isinstance(embed, ReadableSpan) and isinstance(load, ReadableSpan)
    return [embed, load]


def test_host_spans_cross_the_relay_intact() -> None:
    frames: list[model_host_pb2.HostResponse] = []
    originals = host_spans()

    HostSpanRelay(frames.append).export(originals)

    assert len(frames) == 1
    frame = model_host_pb2.HostResponse.FromString(frames[0].SerializeToString())
    assert frame.request_id == 0 and frame.WhichOneof("kind") == "spans"
    decoded = {span.name: span for span in decode_spans(frame.spans.otlp_export_request)}
    assert decoded.keys() == {"model_host.embed", "model_host.load"}
    for original in originals:
        copy = decoded[original.name]
        assert copy.context.trace_id == original.context.trace_id
        assert copy.context.span_id == original.context.span_id
        assert copy.context.trace_flags.sampled
        assert (copy.start_time, copy.end_time) == (original.start_time, original.end_time)
        assert copy.resource.attributes["service.name"] == "gantry-model-host"
        assert copy.instrumentation_scope is not None
        assert copy.instrumentation_scope.name == "gantry.model_host"
    embed = decoded["model_host.embed"]
    assert embed.parent is not None
    assert embed.parent.span_id == 0x00F067AA0BA902B7 and embed.parent.is_remote
    assert embed.kind is SpanKind.SERVER
    assert dict(embed.attributes or {}) == {
        "gantry.input_count": 3,
        "gantry.ratio": 0.5,
        "gantry.tags": ("a", "b"),
    }
    assert [(event.name, dict(event.attributes or {})) for event in embed.events] == [
        ("batched", {"gantry.batch_inputs": 7})
    ]
    assert embed.links[0].context.span_id == 0x00F067AA0BA902B7
    assert embed.status.status_code is StatusCode.ERROR
    assert embed.status.description == "forward pass failed"
    assert decoded["model_host.load"].parent is None
    assert decoded["model_host.load"].status.status_code is StatusCode.UNSET


def test_a_relayed_frame_that_does_not_decode_is_refused() -> None:
    # The worker counts such a frame as dropped spans; it never breaks the host's channel.
    with pytest.raises((DecodeError, ValueError)):
        decode_spans(b"\x0a\x05garbage")
