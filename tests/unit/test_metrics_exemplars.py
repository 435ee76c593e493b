"""Exemplars are offered to the SDK's reservoirs only where OTLP may carry them: the Prometheus
exporter drops them, and offering each measurement costs a third of every record."""

from __future__ import annotations

from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from gantry.common.metrics import _exemplar_filter


def test_prometheus_alone_collects_no_exemplars_otlp_keeps_the_sdk_default() -> None:
    assert isinstance(_exemplar_filter(otlp=False), AlwaysOffExemplarFilter)
    assert isinstance(_exemplar_filter(otlp=True), TraceBasedExemplarFilter)


def test_without_exemplars_a_histogram_still_counts_every_record() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], exemplar_filter=_exemplar_filter(otlp=False))
    histogram = provider.get_meter("test").create_histogram("seconds")
    for value in (0.001, 0.002, 0.5):
        histogram.record(value, {"stage": "total"})
    data = reader.get_metrics_data()
    assert data is not None
    (point,) = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points
    assert isinstance(point, HistogramDataPoint)
    assert (point.count, point.exemplars) == (3, [])
    assert abs(point.sum - 0.503) < 1e-9
