"""The metrics seam in a fresh interpreter: nothing installed without an address, the scheduler's
tenant labels bounded under a thousand tenants, and dropped telemetry served as a counter.

The bounded labels and the address parsing are tested in tests/unit/test_metrics.py; these run a
process each, which the unit guard refuses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
