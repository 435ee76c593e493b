"""Metrics for every Gantry process: one OpenTelemetry MeterProvider, read by Prometheus and OTLP.

Instruments are created at import time from `meter(...)`; until `setup_metrics` installs a
provider they are the API's proxies, which drop every call (a few attribute lookups): a process
without `--metrics-address` and without OTLP pays nothing. Label values that come from data
(tenant, deployment, node ids, reasons from the wire) go through `BoundedValues`, so a scrape
stays bounded whatever the traffic; request and work ids are never labels.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import ExemplarFilter

log = logging.getLogger(__name__)

OTHER = "_other"
# The capability and deployment of an invocation that never resolved to a deployment (refused
# before: a malformed request, a capability no binding names): one series for all of them, never
# one per name a client typed. Real names start with a letter or digit (validation._NAME), so
# neither this nor OTHER can be one.
UNRESOLVED = "_unresolved"
# Distinct capabilities and deployments a process labels invocations with; past these the rest
# count as OTHER until the process restarts (a series, once exported, stays until then anyway).
CAPABILITY_LABELS = 64
DEPLOYMENT_LABELS = 64
# Seconds: from a cached call (sub-millisecond) to a model load (minutes).
DURATION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
_OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
_OTLP_INTERVAL_MS = 10_000


class MetricsAddressError(ValueError):
    """`--metrics-address` is malformed or cannot be bound; the message names the flag."""


class BoundedValues:
    """A label's values, bounded: the first `limit` distinct values pass, the rest are OTHER.

    Safe from any thread: a value is either in the set or not, and a race between two new values
    at the limit only ever lets one of them in, never more than `limit` in all.
    """

    def __init__(self, limit: int, *, other: str = OTHER) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self._limit = limit
        self._other = other
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._kept:  # the hot path: no lock
            return value
        with self._lock:
            if value in self._kept:
                return value
            if len(self._kept) >= self._limit:
                return self._other
            self._kept.add(value)
            return value

    def __len__(self) -> int:
        return len(self._kept)


class ModelLabels:
    """The `capability` and `deployment` labels of an invocation, bounded by CAPABILITY_LABELS and
    DEPLOYMENT_LABELS. Callers pass only what the control plane resolved (the deployment id and
    that deployment's capability), so a label names a deployment that exists; an empty value (not
    resolved) is UNRESOLVED."""

    def __init__(
        self, *, capabilities: int = CAPABILITY_LABELS, deployments: int = DEPLOYMENT_LABELS
    ) -> None:
        self._capabilities = BoundedValues(capabilities)
        self._deployments = BoundedValues(deployments)

    def __call__(self, capability: str, deployment_id: str) -> tuple[str, str]:
        return (
            self._capabilities(capability) if capability else UNRESOLVED,
            self._deployments(deployment_id) if deployment_id else UNRESOLVED,
        )


def meter(name: str) -> Meter:
    """The meter of a module: a proxy until `setup_metrics` installs the provider."""
    return metrics.get_meter(name)


def duration_histogram(owner: Meter, name: str, description: str) -> metrics.Histogram:
    """A histogram of seconds with buckets fit for Gantry's operations (not the SDK's ms ones)."""
    return owner.create_histogram(
        name,
        unit="s",
        description=description,
        explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
    )


Labels = tuple[tuple[str, str], ...]  # a gauge's label set, as sorted (name, value) pairs


class GaugeSnapshot:
    """Values an observable gauge reports, published whole by the code that computes them.

    The scrape callback reads the last published mapping (one reference, swapped atomically)
    and never touches the state it summarises: no database reads, no iteration over a dict the
    event loop is changing.
    """

    def __init__(self) -> None:
        self._values: Mapping[Labels, float] = {}

    def publish(self, values: Mapping[Labels, float]) -> None:
        self._values = dict(values)

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, dict(labels)) for labels, value in self._values.items()]


def observable_gauge(owner: Meter, name: str, description: str, *, unit: str = "") -> GaugeSnapshot:
    snapshot = GaugeSnapshot()
    owner.create_observable_gauge(
        name, callbacks=[snapshot.observe], unit=unit, description=description
    )
    return snapshot


# ---- counters summed before the SDK sees them -------------------------------------------------


class SummedCounter:
    """A monotonic counter for a hot path: each `add` is summed here per attribute set, and the
    sums reach the SDK's counter (one add per set) when a reader collects, before it reads.

    An SDK add costs about 10 us (it cleans, copies and hashes the attributes every time); this
    one is a dict update. A scrape or an export still counts every add made before it, as the
    SDK's own counter would. Attribute values must be hashable (labels are strings); a negative
    amount goes to the SDK at once, which refuses it as it always has.
    """

    def __init__(self, counter: metrics.Counter) -> None:
        self._counter = counter
        self._sums: dict[tuple[tuple[str, Any], ...], tuple[Mapping[str, Any] | None, float]] = {}
        self._lock = threading.Lock()  # adds on the event loop, flushes on a reader's thread
        _summed.append(self)

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        if amount < 0:
            self._counter.add(amount, attributes)
            return
        key = tuple(attributes.items()) if attributes else ()
        with self._lock:
            held = self._sums.get(key)
            self._sums[key] = (attributes, amount if held is None else held[1] + amount)

    def flush(self) -> None:
        """Hand the sums to the SDK (every reader's collect does this first)."""
        with self._lock:
            sums, self._sums = self._sums, {}
        for attributes, amount in sums.values():
            self._counter.add(amount, attributes)


_summed: list[SummedCounter] = []


def _flush_summed(options: CallbackOptions) -> Iterable[Observation]:
    # A reader runs every observable callback before it reads what the instruments hold: the
    # sums land first. It observes nothing itself, so it exports no series of its own.
    for counter in list(_summed):
        counter.flush()
    return ()


meter("gantry.common.metrics").create_observable_gauge(
    "gantry_summed_counters_flush",
    callbacks=[_flush_summed],
    description="Never exported: hands the summed hot-path counters to the SDK before a read",
)


# ---- observations the telemetry pipeline dropped ----------------------------------------------

_dropped_sources: list[Callable[[], Mapping[str, int]]] = []


def register_dropped_source(source: Callable[[], Mapping[str, int]]) -> None:
    """Feed `gantry_observations_dropped_total{kind}` from `source` (kind -> count so far)."""
    if source not in _dropped_sources:
        _dropped_sources.append(source)


def _observe_dropped(options: CallbackOptions) -> Iterable[Observation]:
    totals: dict[str, int] = {}
    for source in list(_dropped_sources):
        try:
            counts = source()
        except Exception:  # a broken source must not break the scrape
            log.exception("observation-drop source failed")
            continue
        for kind, count in counts.items():
            totals[kind] = totals.get(kind, 0) + int(count)
    return [Observation(count, {"kind": kind}) for kind, count in sorted(totals.items())]


meter("gantry.common.metrics").create_observable_counter(
    "gantry_observations_dropped",
    callbacks=[_observe_dropped],
    description="Observations (spans, metric and audit writes) dropped rather than block serving",
)


# ---- the provider ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    """What `setup_metrics` installed: the Prometheus port (None without one), OTLP or not."""

    port: int | None
    otlp: bool


_setup_lock = threading.Lock()
_installed: MetricsEndpoint | None = None


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise MetricsAddressError(f"--metrics-address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port_text)


def otlp_configured(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(name) for name in _OTLP_ENDPOINT_VARIABLES)


def setup_metrics(service_name: str, *, address: str | None) -> MetricsEndpoint | None:
    """Install the process's MeterProvider when metrics have somewhere to go; None otherwise.

    `address` (HOST:PORT, port 0 for any) serves `/metrics` for Prometheus on its own port; OTLP
    export runs when OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT is set (the standard OTEL_* variables
    configure it). Once per process: a second call returns what the first installed (tests that
    run every service in one process share one endpoint). Raises MetricsAddressError when the
    address is malformed or cannot be bound.
    """
    global _installed
    with _setup_lock:
        if _installed is not None:
            return _installed
        otlp = otlp_configured()
        if address is None and not otlp:
            return None
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader
        from opentelemetry.sdk.resources import Resource

        readers: list[MetricReader] = []
        port: int | None = None
        if address is not None:
            port = _serve_prometheus(address)
            from opentelemetry.exporter.prometheus import PrometheusMetricReader

            readers.append(PrometheusMetricReader(scope_info_enabled=False))
        if otlp:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            readers.append(
                PeriodicExportingMetricReader(
                    OTLPMetricExporter(), export_interval_millis=_OTLP_INTERVAL_MS
                )
            )
        provider = MeterProvider(
            metric_readers=readers,
            resource=Resource.create({"service.name": service_name}),
            exemplar_filter=_exemplar_filter(otlp=otlp),
        )
        metrics.set_meter_provider(provider)
        _register_telemetry_drops()
        _installed = MetricsEndpoint(port=port, otlp=otlp)
        return _installed


def _exemplar_filter(*, otlp: bool) -> ExemplarFilter:
    """The SDK's default (an exemplar from each sampled span) where OTLP may carry exemplars;
    none where only Prometheus reads, whose exporter drops them: offering each measurement to
    the reservoirs is a third of every count and record on the hot path, for nothing."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, TraceBasedExemplarFilter

    return TraceBasedExemplarFilter() if otlp else AlwaysOffExemplarFilter()


def _register_telemetry_drops() -> None:
    # The span pipeline counts what it drops (telemetry.dropped_observations); read it when the
    # telemetry module offers it.
    from gantry.common import telemetry

    source = getattr(telemetry, "dropped_observations", None)
    if callable(source):
        register_dropped_source(source)


def _serve_prometheus(address: str) -> int:
    from prometheus_client import start_http_server

    host, port = parse_address(address)
    try:
        server: Any
        server, _ = start_http_server(port, addr=host)
    except OSError as exc:
        raise MetricsAddressError(f"--metrics-address {address}: {exc.strerror or exc}") from None
    return int(server.server_port)


def metrics_enabled() -> bool:
    """Whether instruments record: callers skip work that only feeds metrics (a count query)."""
    return _installed is not None


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off unless given)",
    )


def start_metrics(service_name: str, address: str | None) -> bool:
    """`setup_metrics` for a service's main: False after printing one line when it cannot start
    (the main then exits 2, as for any other bad flag)."""
    try:
        endpoint = setup_metrics(service_name, address=address)
    except MetricsAddressError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return False
    if endpoint is not None and endpoint.port is not None:
        log.info("metrics at http://%s:%d/metrics", parse_address(address or "")[0], endpoint.port)
    return True


_ATTRIBUTES: dict[tuple[str, ...], dict[str, str]] = {}


def cached_attributes(*pairs: str) -> dict[str, str]:
    """The attribute dict of (key, value, key, value, ...), built once per distinct set: a hot
    path hands the SDK the same dict every time. Bounded as long as its values are."""
    attributes = _ATTRIBUTES.get(pairs)
    if attributes is None:
        attributes = _ATTRIBUTES[pairs] = dict(zip(pairs[::2], pairs[1::2], strict=True))
    return attributes
