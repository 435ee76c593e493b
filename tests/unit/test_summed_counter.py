"""SummedCounter (gantry.common.metrics): a hot-path counter summed per attribute set and handed to
the SDK when a reader collects; every read counts every add made before it."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from gantry.common.metrics import SummedCounter, _flush_summed


def _points(reader: InMemoryMetricReader) -> dict[str, dict[tuple[tuple[str, object], ...], float]]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, dict[tuple[tuple[str, object], ...], float]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    assert isinstance(point, NumberDataPoint)
                    key = tuple(sorted((point.attributes or {}).items()))
                    found.setdefault(metric.name, {})[key] = point.value
    return found


def _provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    # The module's flush runs as an observable callback of its own meter; here, of this one.
    provider.get_meter("flush").create_observable_gauge("flush", callbacks=[_flush_summed])
    return provider, reader


def test_every_add_before_a_read_is_counted_per_attribute_set() -> None:
    provider, reader = _provider()
    summed = SummedCounter(provider.get_meter("test").create_counter("calls"))
    for _ in range(5):
        summed.add(1, {"code": "OK"})
    summed.add(2, {"code": "INTERNAL"})
    summed.add(1, {"code": "OK"})
    assert _points(reader)["calls"] == {(("code", "INTERNAL"),): 2, (("code", "OK"),): 6}
    summed.add(3, {"code": "OK"})  # cumulative across reads, as the SDK's own counter
    assert _points(reader)["calls"][(("code", "OK"),)] == 9


def test_the_flush_exports_no_series_of_its_own_and_a_negative_add_is_refused() -> None:
    provider, reader = _provider()
    summed = SummedCounter(provider.get_meter("test").create_counter("calls"))
    summed.add(1)
    summed.add(-4)  # the SDK refuses it (a counter only grows), never subtracted from the sum
    points = _points(reader)
    assert points == {"calls": {(): 1}}
