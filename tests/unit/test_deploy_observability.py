"""Static checks on deploy/prometheus, deploy/grafana and docs/operations, and on how compose and
the Kubernetes manifests serve and scrape /metrics.

Every metric an alert or a dashboard panel reads must be one a service creates (read from the
instruments here; tests/integration/test_deploy_metrics_names.py checks the same names, and their
labels, against a real scrape). Where `promtool` is installed (Debian: `apt-get install
prometheus`), tests/integration/test_deploy_observability_promtool.py has it parse the rules, the
configurations and every dashboard query, and run the alert unit tests in
prometheus_alerts_test.yml; the parser checks here run either way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gantry.common.errors import REASONS
from gantry.controlplane.platform.state_machines import DeploymentState, NodeState, ResidencyState
from gantry.scheduler.policy.types import BreakerState
from tests.unit.deploy_manifests_support import (
    COMPOSE,
    METRICS_PORTS,
    MONITORING_NAMESPACE,
    README,
    SERVICES,
    by_kind_name,
    k8s_docs,
    load_compose,
    option_value,
    pod_spec,
    service_workload,
    worker_workloads,
)
from tests.unit.deploy_observability_support import (
    ALERTS,
    DASHBOARD,
    GRAFANA,
    PENDING_METRICS,
    PROMETHEUS,
    PROMETHEUS_COMPOSE,
    PROMETHEUS_KUBERNETES,
    RUNBOOKS,
    alert_rules,
    dashboard_problems,
    dashboard_queries,
    exposed_sample_names,
    instruments,
    load_dashboard,
    load_yaml,
    name_problems,
    read_query,
    rule_problems,
    runbook_files,
    syntax_problems,
)

HERE = Path(__file__).resolve().parent
ALERT_UNIT_TESTS = HERE / "prometheus_alerts_test.yml"
JOBS = {service: f"gantry-{service}" for service in SERVICES}
OBSERVABILITY_SERVICES = ("prometheus", "grafana", "jaeger")
# Label values an alert compares with: each must be one the services really emit.
KNOWN_VALUES = {
    "reason": set(REASONS) | {""},
    "state": {str(s) for s in (*NodeState, *ResidencyState, *DeploymentState)}
    | {s.name for s in BreakerState},
    "job": set(JOBS.values()),
}
_EQUALS = re.compile(r'([A-Za-z_]\w*)\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"')


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    return alert_rules()


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


@pytest.fixture(scope="module")
def known_names() -> set[str]:
    return set(exposed_sample_names())


# ---- alert rules -------------------------------------------------------------------------------


def test_every_alert_rule_is_complete_and_links_a_runbook_that_names_it(
    rules: list[dict[str, Any]],
) -> None:
    assert rules
    assert [p for rule in rules for p in rule_problems(rule)] == []


def test_the_issue_asks_for_these_alerts(rules: list[dict[str, Any]]) -> None:
    names = {rule["alert"] for rule in rules}
    assert {
        "GantryModelHostCrashLoop",
        "GantryCapabilityDegraded",
        "GantryQueueFullRejections",
        "GantryCircuitBreakerOpen",
        "GantryWorkerAbsent",
        "GantryLeaseExpiries",
    } <= names


def test_each_runbook_belongs_to_an_alert_and_the_index_lists_it(
    rules: list[dict[str, Any]],
) -> None:
    linked = {Path(rule["annotations"]["runbook_url"]).name for rule in rules}
    assert runbook_files() == linked
    index = (RUNBOOKS / "README.md").read_text()
    for name in sorted(linked):
        assert f"]({name})" in index, name
    for rule in rules:
        assert f"`{rule['alert']}`" in index, rule["alert"]


def test_alert_expressions_read_only_metrics_the_services_expose(
    rules: list[dict[str, Any]], known_names: set[str]
) -> None:
    problems = [
        p
        for rule in rules
        for p in syntax_problems(rule["alert"], rule["expr"])
        + name_problems(rule["alert"], rule["expr"], known_names)
    ]
    assert problems == []


def test_alert_label_values_are_ones_the_services_emit(rules: list[dict[str, Any]]) -> None:
    problems = []
    for rule in rules:
        for label, operator, value in _EQUALS.findall(rule["expr"]):
            known = KNOWN_VALUES.get(label)
            if known is None:
                continue
            matched = {v for v in known if re.fullmatch(value, v)} if operator == "=~" else None
            if (operator == "=" and value not in known) or matched == set():
                problems.append(f"{rule['alert']}: {label}{operator}{value!r} matches nothing")
    assert problems == []


def test_pending_metrics_are_still_pending(
    rules: list[dict[str, Any]], dashboard: dict[str, Any], known_names: set[str]
) -> None:
    """The allow-list holds exactly the names that are used and not yet exposed: remove an entry
    once its instrument exists (and check its labels against the rule)."""
    used = {m for rule in rules for m in read_query(rule["expr"]).metrics}
    used |= {m for _, expr in dashboard_queries(dashboard) for m in read_query(expr).metrics}
    for name in PENDING_METRICS:
        assert name not in known_names, f"{name} is exposed now: drop it from PENDING_METRICS"
        assert name in used, f"{name} is pending but nothing uses it"


def test_instrument_names_map_to_distinct_exposition_names() -> None:
    found = instruments()
    assert len(found) >= 30, sorted(found)
    families = [i.family() for i in found.values()]
    assert len(families) == len(set(families))
    # Spot checks of the mapping that the integration test proves on a real scrape.
    names = exposed_sample_names()
    for sample in (
        "gantry_invocations_total",
        "gantry_invocation_stage_duration_seconds_bucket",
        "gantry_scheduler_ledger_reserved_bytes",
        "gantry_observations_dropped_total",
        "gantry_nodes",
    ):
        assert sample in names, sample


# ---- the dashboard -----------------------------------------------------------------------------


def test_dashboard_loads_with_a_datasource_variable_and_well_formed_panels(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard_problems(dashboard) == []
    assert dashboard["uid"] and dashboard["title"]


def test_dashboard_queries_read_only_metrics_the_services_expose(
    dashboard: dict[str, Any], known_names: set[str]
) -> None:
    problems = [
        p
        for where, expr in dashboard_queries(dashboard)
        for p in name_problems(where, expr, known_names)
    ]
    assert problems == []


def test_dashboard_shows_what_the_issue_asks_for(dashboard: dict[str, Any]) -> None:
    read = {m for _, expr in dashboard_queries(dashboard) for m in read_query(expr).metrics}
    for metric in (
        "gantry_invocations_total",  # invocations by status and reason
        "gantry_invocation_stage_duration_seconds_bucket",  # latency per stage
        "gantry_scheduler_queue_depth",  # queue depth per tenant
        "gantry_scheduler_queue_wait_seconds_bucket",  # queue wait per tenant
        "gantry_scheduler_rejections_total",  # rejections by reason
        "gantry_scheduler_breakers",
        "gantry_residencies",
        "gantry_nodes",
        "gantry_model_host_restarts_total",
        "gantry_model_host_crash_loops_total",
        "gantry_jobs_total",  # job outcomes
        "gantry_scheduler_ledger_reserved_bytes",  # ledger use per domain
        "gantry_observations_dropped_total",
    ):
        assert metric in read, metric
    assert any(
        "histogram_quantile" in expr and "stage" in read_query(expr).grouping_labels
        for _, expr in dashboard_queries(dashboard)
    )


# ---- the checks themselves: each must reject a bad input ---------------------------------------


def test_the_checks_reject_bad_rules_and_queries(
    tmp_path: Path, known_names: set[str], dashboard: dict[str, Any]
) -> None:
    assert name_problems("x", "rate(gantry_invocation_total[5m])", known_names) == [
        "x: unknown metric gantry_invocation_total"
    ]
    assert name_problems("x", 'sum by (reason) (gantry_nodes{state="A"})', known_names) == []
    assert "unbalanced" in " ".join(syntax_problems("x", "sum(rate(gantry_nodes[5m])))"))
    assert "unclosed" in " ".join(syntax_problems("x", "sum(rate(gantry_nodes[5m])"))
    assert "unknown function summ()" in " ".join(syntax_problems("x", "summ(gantry_nodes)"))
    assert read_query('histogram_quantile(0.99, sum by (le, stage) (rate(a_bucket{x="}"}[5m])))')
    bad_rule: dict[str, Any] = {
        "alert": "Nope",
        "expr": "up == 0",
        "labels": {"severity": "page-everyone"},
        "annotations": {"summary": "s", "runbook_url": "docs/operations/nope.md"},
    }
    problems = " | ".join(rule_problems(bad_rule))
    for expected in ("no for", "severity 'page-everyone'", "no annotations.description", "nope.md"):
        assert expected in problems
    runbook = tmp_path / "docs" / "operations" / "other.md"
    runbook.parent.mkdir(parents=True)
    runbook.write_text("# Some other alert\n")
    other = {**bad_rule, "for": "1m", "labels": {"severity": "warning"}}
    other["annotations"] = {**bad_rule["annotations"], "description": "d"}
    other["annotations"]["runbook_url"] = "docs/operations/other.md"
    assert rule_problems(other, repo=tmp_path) == [
        "Nope: runbook docs/operations/other.md does not name the alert"
    ]
    broken = {**dashboard, "templating": {"list": []}}
    broken["panels"] = [
        {"id": 1, "title": "p", "type": "timeseries", "datasource": {"uid": "prom"}, "targets": []}
    ]
    problems = " | ".join(dashboard_problems(broken))
    for expected in ("datasource variable", "p: datasource is not", "p: no targets"):
        assert expected in problems


# ---- serving and scraping /metrics in deploy/ --------------------------------------------------


def test_compose_services_serve_metrics_where_prometheus_scrapes() -> None:
    compose = load_compose()
    services = compose["services"]
    config = load_yaml(PROMETHEUS_COMPOSE)
    targets = {
        job["job_name"]: [t for s in job["static_configs"] for t in s["targets"]]
        for job in config["scrape_configs"]
    }
    assert config["rule_files"] == [ALERTS.name]
    for service in SERVICES:
        address = option_value(services[service]["command"], "--metrics-address")
        assert address == f"0.0.0.0:{METRICS_PORTS[service]}", service
        assert targets[JOBS[service]] == [f"{service}:{METRICS_PORTS[service]}"]
        # Prometheus shares a network with each service it scrapes.
        assert set(services[service]["networks"]) & set(services["prometheus"]["networks"])
        assert "profiles" not in services[service]
        # Traces go to the profile's Jaeger only when the operator sets one variable.
        environment = services[service]["environment"]
        assert environment["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == (
            "${GANTRY_OTLP_TRACES_ENDPOINT:-}"
        )
    assert "ports" not in services["worker"] and "expose" not in services["worker"]


def test_compose_observability_profile_is_optional_pinned_and_provisioned() -> None:
    compose = load_compose()
    services = compose["services"]
    for name in OBSERVABILITY_SERVICES:
        service = services[name]
        assert service["profiles"] == ["observability"], name
        image, _, tag = service["image"].rpartition(":")
        assert image and tag and tag != "latest", name
        for port in service.get("ports") or []:
            assert str(port).startswith("127.0.0.1:"), (name, port)
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "control" in services["jaeger"]["networks"]
    prometheus_mounts = services["prometheus"]["volumes"]
    assert "./prometheus:/etc/prometheus:ro" in prometheus_mounts
    assert (COMPOSE.parent / "prometheus" / "prometheus.yml").samefile(PROMETHEUS_COMPOSE)
    grafana = services["grafana"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"] if ":" in m}
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "gantry.yaml")
    path = provider["providers"][0]["options"]["path"]
    assert mounts[f"{path}/{DASHBOARD.name}"] == f"./grafana/{DASHBOARD.name}"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    (source,) = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yaml")[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    assert set(grafana["networks"]) & set(services["prometheus"]["networks"])
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/run/secrets/")


def test_k8s_pods_serve_metrics_on_a_named_port_their_annotations_point_at() -> None:
    docs = k8s_docs()
    workloads = [service_workload(docs, s) for s in ("controlplane", "scheduler")]
    workloads += worker_workloads(docs)
    for doc in workloads:
        service = doc["metadata"]["name"].removeprefix("gantry-").split("-")[0]
        port = METRICS_PORTS[service]
        annotations = doc["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
        (container,) = (pod_spec(doc) or {})["containers"]
        assert option_value(container["args"], "--metrics-address") == f"0.0.0.0:{port}"
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named["metrics"] == port
        assert (
            doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
            == (JOBS[service])
        )


def test_k8s_network_policies_admit_scrapes_from_the_monitoring_namespace_only() -> None:
    docs = k8s_docs()
    for service in SERVICES:
        policy = by_kind_name(docs, "NetworkPolicy", JOBS[service])
        rules = [
            rule
            for rule in policy["spec"]["ingress"]
            if {"protocol": "TCP", "port": METRICS_PORTS[service]} in rule.get("ports", [])
        ]
        assert len(rules) == 1, service
        assert rules[0]["from"] == [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
                }
            }
        ]
        assert rules[0]["ports"] == [{"protocol": "TCP", "port": METRICS_PORTS[service]}]
    config = load_yaml(PROMETHEUS_KUBERNETES)
    (job,) = config["scrape_configs"]
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery["role"] == "pod" and discovery["namespaces"]["names"] == ["gantry"]
    job_rule = [r for r in job["relabel_configs"] if r.get("target_label") == "job"]
    assert job_rule[0]["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
    assert (PROMETHEUS / "alerts.yml").is_file() and config["rule_files"] == [ALERTS.name]


def test_deploy_readme_documents_the_observability_profile() -> None:
    readme = README.read_text()
    assert "docker compose --profile observability up -d" in readme
    assert "GANTRY_OTLP_TRACES_ENDPOINT=http://jaeger:4317" in readme
    assert "secrets/grafana_admin_password" in readme
    for name in ("alerts.yml", "gantry-dashboard.json", "prometheus-kubernetes.yml"):
        assert name in readme, name
