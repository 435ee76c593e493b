"""The metrics seam: bounded labels, nothing installed without an address, bad addresses refused,
the scheduler's tenant labels bounded, and `gantry up` turning the endpoints on (or off)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gantry.cli.state import StatePaths
from gantry.cli.up import METRICS_ADDRESSES, UpSettings, banner, child_specs
from gantry.common.metrics import OTHER, BoundedValues, MetricsAddressError, parse_address

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_python(script: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter: the meter provider is set once per process, so each check gets one."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )


def test_bounded_values_keep_the_first_values_and_fold_the_rest_into_other():
    labels = BoundedValues(50)
    seen = {labels(f"tenant-{index}") for index in range(1000)}
    assert len(seen) == 51
    assert OTHER in seen
    assert {labels(f"tenant-{index}") for index in range(50)} == {
        f"tenant-{index}" for index in range(50)
    }
    assert labels("tenant-999") == OTHER  # still folded on a second sight
    assert len(labels) == 50


def test_bounded_values_refuse_a_limit_below_one():
    with pytest.raises(ValueError):
        BoundedValues(0)


@pytest.mark.parametrize("address", ["9464", "127.0.0.1", ":9464", "127.0.0.1:port", "h:99999"])
def test_a_malformed_metrics_address_names_the_flag(address: str):
    with pytest.raises(MetricsAddressError, match="--metrics-address"):
        parse_address(address)


def test_ipv6_and_any_port_addresses_parse():
    assert parse_address("[::1]:9464") == ("::1", 9464)
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)


def test_without_an_address_or_otlp_nothing_is_installed_and_instruments_cost_nothing():
    completed = _run_python(
        """
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from gantry.common import metrics as gantry_metrics
        import gantry.controlplane.platform.metrics as controlplane
        import gantry.scheduler.metrics as scheduler
        import gantry.worker.metrics as worker

        before = metrics.get_meter_provider()
        assert gantry_metrics.setup_metrics("gantry-test", address=None) is None
        assert metrics.get_meter_provider() is before
        assert not isinstance(metrics.get_meter_provider(), MeterProvider)
        assert not gantry_metrics.metrics_enabled()
        controlplane.invocation_answered("Embed", None, 0.01)  # a no-op, never an error
        worker.job_ran("load", "", 1.0)
        print("nothing installed")
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert "nothing installed" in completed.stdout


def test_scheduler_tenant_labels_stay_bounded_under_a_thousand_tenants():
    completed = _run_python(
        """
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        from gantry.scheduler.metrics import TENANT_LABELS, SchedulerMetrics
        from gantry.scheduler.policy.events import Dispatched

        recorder = SchedulerMetrics()
        for index in range(1000):
            recorder.submitted(f"work-{index}", f"tenant-{index}", 0.0)
            recorder.decided(Dispatched(f"work-{index}", "r", "n", "d"), 0.5)
        points = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points[metric.name] = list(metric.data.data_points)
        tenants = {p.attributes["tenant"] for p in points["gantry_scheduler_dispatches"]}
        assert len(tenants) == TENANT_LABELS + 1, len(tenants)
        assert "_other" in tenants
        assert sum(p.value for p in points["gantry_scheduler_dispatches"]) == 1000
        waits = points["gantry_scheduler_queue_wait_seconds"]
        assert len(waits) == TENANT_LABELS + 1
        assert sum(p.count for p in waits) == 1000
        assert not any("work-" in str(p.attributes) for p in waits)
        print("bounded")
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert "bounded" in completed.stdout


def _up_settings(tmp_path: Path, *, metrics: bool) -> UpSettings:
    return UpSettings(
        paths=StatePaths(tmp_path / "state"),
        address="127.0.0.1:50051",
        scheduler_address="127.0.0.1:50052",
        startup_timeout_s=1,
        ready_timeout_s=1,
        metrics=metrics,
    )


def test_up_gives_each_service_its_metrics_address_and_prints_where(tmp_path: Path):
    settings = _up_settings(tmp_path, metrics=True)
    specs = child_specs(settings)
    for role, address in METRICS_ADDRESSES.items():
        argv = specs[role].argv
        assert argv[argv.index("--metrics-address") + 1] == address
    shown = banner(settings, "deployment-1")
    assert "http://127.0.0.1:9464/metrics" in shown and "http://127.0.0.1:9466/metrics" in shown
    quiet = _up_settings(tmp_path, metrics=False)
    assert not any("--metrics-address" in spec.argv for spec in child_specs(quiet).values())
    assert "metrics        off" in banner(quiet, "deployment-1")


@pytest.mark.parametrize(("flags", "expected"), [([], True), (["--no-metrics"], False)])
def test_up_turns_metrics_on_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], expected: bool
):
    import gantry.cli.up as up
    from gantry.cli.main import main

    chosen: list[UpSettings] = []
    monkeypatch.setattr(up, "run_up", lambda settings: chosen.append(settings) or 0)
    assert main(["--state-dir", str(tmp_path / "state"), "up", *flags]) == 0
    assert [settings.metrics for settings in chosen] == [expected]


def test_dropped_observations_from_telemetry_are_served_as_a_counter():
    completed = _run_python(
        """
        import urllib.request
        from gantry.common import metrics, telemetry

        # What telemetry's bounded span queue reports (a stand-in for its real counts).
        telemetry.dropped_observations = lambda: {"span": 7, "span_export_failed": 2}
        endpoint = metrics.setup_metrics("gantry-test", address="127.0.0.1:0")
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'gantry_observations_dropped_total{kind="span"} 7.0' in text, text
        assert 'gantry_observations_dropped_total{kind="span_export_failed"} 2.0' in text, text
        print("served")
        """
    )
    assert completed.returncode == 0, completed.stderr
    assert "served" in completed.stdout
