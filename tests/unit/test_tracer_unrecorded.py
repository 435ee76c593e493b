"""GantryTracer (gantry.common.telemetry.tracer): with no TracerProvider installed its spans cost
next to nothing, yet carry the W3C context on exactly as the API's no-op tracer does; with one
installed they are the API's own recording spans."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gantry.common.telemetry import extract_context, inject_context, tracer

PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.fixture
def no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)


def _carried() -> dict[str, str]:
    carrier: dict[str, str] = {}
    inject_context(carrier)
    return carrier


def test_a_span_without_a_context_leaves_the_current_one_current(no_provider: None) -> None:
    with trace.use_span(trace.get_current_span(extract_context(PARENT))):
        with tracer("test").start_as_current_span("op", attributes={"a": "b"}) as span:
            span.set_attribute("c", "d")  # a no-op on a span nobody records
            assert span is trace.get_current_span()
            assert _carried() == PARENT


def test_a_remote_parent_flows_on_as_the_no_op_tracer_carries_it(no_provider: None) -> None:
    context = extract_context(PARENT)
    with trace.NoOpTracer().start_as_current_span("op", context=context):
        expected = _carried()
    with tracer("test").start_as_current_span("op", context=context) as span:
        assert _carried() == expected == PARENT
        assert span.get_span_context().trace_id == int(PARENT["traceparent"][3:35], 16)
    assert _carried() == {}  # the parent is current only inside the scope


def test_with_a_provider_the_spans_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    traced = tracer("test")
    monkeypatch.setattr(traced, "_tracer", provider.get_tracer("test"))
    with traced.start_as_current_span("op", context=extract_context(PARENT), attributes={"a": "b"}):
        assert _carried()["traceparent"] != PARENT["traceparent"]  # a span of its own
    (span,) = exporter.get_finished_spans()
    assert span.name == "op" and span.attributes == {"a": "b"}
    assert span.context.trace_id == int(PARENT["traceparent"][3:35], 16)
