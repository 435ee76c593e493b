"""promtool, where installed, parses deploy/prometheus and every dashboard query for real.

Prometheus's own parser checks the alert rules, both scrape configurations and each dashboard
query, and runs the alert unit tests in tests/unit/prometheus_alerts_test.yml; without promtool
(Debian: `apt-get install prometheus`) these skip, and tests/unit/test_deploy_observability.py's
parser checks still run. Kept here because promtool is a process, which the unit suite's guard
refuses.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy_observability_support import (
    ALERTS,
    PROMETHEUS_COMPOSE,
    PROMETHEUS_KUBERNETES,
    dashboard_queries,
    load_dashboard,
)
from tests.unit.test_deploy_observability import ALERT_UNIT_TESTS

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert promtool is not None
    return subprocess.run(
        [promtool, *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    result = _promtool("check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_alerts_fire_on_the_series_that_should_fire_them() -> None:
    result = _promtool("test", "rules", ALERT_UNIT_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_accepts_the_compose_prometheus_config() -> None:
    result = _promtool("check", "config", PROMETHEUS_COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_accepts_the_kubernetes_prometheus_config() -> None:
    result = _promtool("check", "config", PROMETHEUS_KUBERNETES)
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        pytest.skip("this promtool is built without Kubernetes discovery (Debian's is)")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path, dashboard: dict[str, Any]) -> None:
    """Each query as a recording rule: `promtool check rules` parses it with Prometheus's own
    PromQL parser."""
    queries = dashboard_queries(dashboard)
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@needs_promtool
def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum(up"}]}]})
    )
    assert _promtool("check", "rules", path).returncode != 0
