"""Reading deploy/prometheus, deploy/grafana and docs/operations for the observability tests.

Two sources of metric names, and the PromQL they are checked against:
- the instruments, read from the services' source (every `create_counter`, `duration_histogram`,
  `observable_gauge`, ... whose first argument is a `gantry_*` literal) and mapped to the names
  the OpenTelemetry Prometheus exporter gives them (counters `_total`, histograms
  `_bucket/_sum/_count`);
  `tests/integration/test_deploy_metrics_names.py` proves that mapping against a real scrape;
- the metric names and label names an alert or dashboard expression uses, by a small PromQL
  reader (strings, selectors, ranges and grouping clauses taken out, then identifiers that are not
  functions or keywords are metric names). `promtool`, where installed, parses them for real.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.unit.deploy_manifests_support import DEPLOY, REPO, Problems

PROMETHEUS = DEPLOY / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
PROMETHEUS_COMPOSE = PROMETHEUS / "prometheus.yml"
PROMETHEUS_KUBERNETES = PROMETHEUS / "prometheus-kubernetes.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "gantry-dashboard.json"
RUNBOOKS = REPO / "docs" / "operations"
INSTRUMENT_SOURCES = (REPO / "libs" / "gantry", REPO / "services")

SEVERITIES = frozenset({"critical", "warning", "info"})
# Series Prometheus makes itself for every target, not exposed by any service.
PROMETHEUS_SERIES = frozenset({"up"})
# Labels every scraped series gets from its target (prometheus.yml, prometheus-kubernetes.yml).
TARGET_LABELS = frozenset({"job", "instance", "namespace"})
# Named in alerts.yml and the dashboard before any service exposes it. Each entry must go once
# the instrument exists (test_pending_metrics_are_still_pending says so).
# Metrics the rules or the dashboard read before a service exposes them: none today. An entry
# names the labels the pending metric will carry; the static tests accept exactly those.
PENDING_METRICS: dict[str, frozenset[str]] = {}

# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = re.compile(r"\$\{?__(?:rate_interval|interval|range)\}?")

_COUNTER_FACTORIES = frozenset({"create_counter", "create_observable_counter"})
_HISTOGRAM_FACTORIES = frozenset({"create_histogram", "duration_histogram"})
_GAUGE_FACTORIES = frozenset(
    {"create_observable_gauge", "observable_gauge", "create_gauge", "create_up_down_counter"}
)
_UNIT_SUFFIXES = {"s": "_seconds", "By": "_bytes"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*(?:"(?:[^"\\]|\\.)*"|\'[^\']*\')')
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+")
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left"}
    | {"group_right", "offset", "inf", "nan", "atan2"}
)
FUNCTIONS = frozenset(
    {"sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk"}
    | {"quantile", "count_values", "rate", "irate", "increase", "delta", "idelta", "deriv"}
    | {"histogram_quantile", "clamp_min", "clamp_max", "clamp", "abs", "absent"}
    | {"absent_over_time", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time"}
    | {"count_over_time", "last_over_time", "changes", "resets", "label_replace", "vector"}
    | {"scalar", "time", "sort", "sort_desc", "round", "ceil", "floor", "timestamp"}
)


# ---- the instruments ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instrument:
    name: str
    kind: str  # counter, histogram, gauge
    unit: str
    source: str  # the file that creates it, relative to the repository

    def family(self) -> str:
        """The Prometheus family name: the instrument name and its unit suffix."""
        suffix = _UNIT_SUFFIXES.get(self.unit, "")
        return self.name if self.name.endswith(suffix) else self.name + suffix

    def sample_names(self) -> frozenset[str]:
        family = self.family()
        if self.kind == "counter":
            return frozenset({f"{family}_total"})
        if self.kind == "histogram":
            return frozenset({f"{family}_bucket", f"{family}_sum", f"{family}_count"})
        return frozenset({family})


def _string_argument(call: ast.Call, index: int, keyword: str) -> str | None:
    if len(call.args) > index and isinstance(call.args[index], ast.Constant):
        value = call.args[index].value  # type: ignore[attr-defined]
        return value if isinstance(value, str) else None
    for kw in call.keywords:
        if kw.arg == keyword and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    return None


def _instruments_of(path: Path) -> Iterator[Instrument]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        factory = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if factory in _COUNTER_FACTORIES:
            kind, index = "counter", 0
        elif factory in _HISTOGRAM_FACTORIES:
            kind, index = "histogram", 1 if factory == "duration_histogram" else 0
        elif factory in _GAUGE_FACTORIES:
            kind, index = "gauge", 1 if factory == "observable_gauge" else 0
        else:
            continue
        name = _string_argument(node, index, "name")
        if name is None or not name.startswith("gantry_"):
            continue
        unit = "s" if factory == "duration_histogram" else _string_argument(node, 99, "unit")
        yield Instrument(name, kind, unit or "", str(path.relative_to(REPO)))


def instruments() -> dict[str, Instrument]:
    """Every `gantry_*` instrument the libs and services create, by instrument name."""
    found: dict[str, Instrument] = {}
    for root in INSTRUMENT_SOURCES:
        for path in sorted(root.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")) or "tests" in path.parts:
                continue
            for instrument in _instruments_of(path):
                found.setdefault(instrument.name, instrument)
    return found


def exposed_sample_names() -> dict[str, Instrument]:
    """Sample name (as Prometheus stores it) -> the instrument it comes from."""
    return {name: i for i in instruments().values() for name in i.sample_names()}


# ---- PromQL ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryUse:
    """What one expression reads: metric names, label names per selector, grouping labels."""

    metrics: frozenset[str]
    selector_labels: frozenset[tuple[str, str]]  # (metric, label)
    grouping_labels: frozenset[str]
    functions: frozenset[str]


def grafana_to_promql(expr: str) -> str:
    return GRAFANA_VARIABLES.sub("5m", expr)


def read_query(expr: str) -> QueryUse:
    selector_labels = {
        (match.group(1) or "", matcher.group(1))
        for match in _SELECTOR.finditer(expr)
        for matcher in _MATCHER.finditer(match.group(2))
    }
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", expr)
    text = _STRING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    grouping: set[str] = set()
    for match in _GROUPING.finditer(text):
        grouping |= {label.strip() for label in match.group(2).split(",") if label.strip()}
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    metrics: set[str] = set()
    functions: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word, call = match.group(1), match.group(2)
        if call:
            functions.add(word)
        elif word.lower() not in KEYWORDS:
            metrics.add(word)
    return QueryUse(
        frozenset(metrics),
        frozenset((metric, label) for metric, label in selector_labels if metric != "__name__"),
        frozenset(grouping),
        frozenset(functions),
    )


def syntax_problems(where: str, expr: str) -> Problems:
    """What a parser would refuse without knowing the names: unbalanced brackets, unknown
    functions, nothing to read."""
    problems: Problems = []
    bare = _STRING.sub('""', expr)
    depth: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in bare:
        if char in "([{":
            depth.append(char)
        elif char in pairs:
            if not depth or depth.pop() != pairs[char]:
                problems.append(f"{where}: unbalanced {char!r} in {expr!r}")
                return problems
    if depth:
        problems.append(f"{where}: unclosed {depth[-1]!r} in {expr!r}")
        return problems
    use = read_query(expr)
    for function in sorted(use.functions - FUNCTIONS):
        problems.append(f"{where}: unknown function {function}()")
    if not use.metrics:
        problems.append(f"{where}: reads no metric: {expr!r}")
    return problems


def name_problems(where: str, expr: str, known: set[str] | frozenset[str]) -> Problems:
    """Metric names in `expr` that neither a service nor Prometheus exposes (pending aside)."""
    allowed = set(known) | PROMETHEUS_SERIES | set(PENDING_METRICS)
    return [
        f"{where}: unknown metric {metric}" for metric in sorted(read_query(expr).metrics - allowed)
    ]


# ---- the files ---------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alert_rules(doc: Any | None = None) -> list[dict[str, Any]]:
    doc = load_yaml(ALERTS) if doc is None else doc
    return [rule for group in doc.get("groups") or [] for rule in group.get("rules") or []]


def rule_problems(rule: dict[str, Any], *, repo: Path = REPO) -> Problems:
    name = rule.get("alert") or rule.get("record") or "?"
    problems: Problems = []
    if "alert" not in rule:
        problems.append(f"{name}: not an alerting rule")
    for key in ("expr", "for"):
        if not rule.get(key):
            problems.append(f"{name}: no {key}")
    severity = (rule.get("labels") or {}).get("severity")
    if severity not in SEVERITIES:
        problems.append(f"{name}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
    annotations = rule.get("annotations") or {}
    for key in ("summary", "description", "runbook_url"):
        if not annotations.get(key):
            problems.append(f"{name}: no annotations.{key}")
    runbook = str(annotations.get("runbook_url") or "")
    if runbook:
        path = repo / runbook
        if not runbook.startswith("docs/operations/") or not path.is_file():
            problems.append(f"{name}: runbook {runbook} is not a file under docs/operations/")
        elif f"`{name}`" not in path.read_text():
            problems.append(f"{name}: runbook {runbook} does not name the alert")
    return problems


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def dashboard_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that queries (rows and the panels nested in collapsed rows included)."""
    panels: list[dict[str, Any]] = []
    for panel in dashboard.get("panels") or []:
        if panel.get("type") == "row":
            panels += panel.get("panels") or []
        else:
            panels.append(panel)
    return panels


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title/refId, PromQL as Prometheus receives it) for every target."""
    return [
        (f"{panel.get('title')}/{target.get('refId')}", grafana_to_promql(target["expr"]))
        for panel in dashboard_panels(dashboard)
        for target in panel.get("targets") or []
        if "expr" in target
    ]


def dashboard_problems(dashboard: dict[str, Any]) -> Problems:
    problems: Problems = []
    variables = [v for v in (dashboard.get("templating") or {}).get("list") or []]
    datasource = [v for v in variables if v.get("type") == "datasource"]
    if [(v.get("name"), v.get("query")) for v in datasource] != [("datasource", "prometheus")]:
        problems.append("no Prometheus datasource variable named `datasource`")
    if not 36 <= int(dashboard.get("schemaVersion") or 0) <= 41:
        problems.append(
            f"schemaVersion {dashboard.get('schemaVersion')} is not a Grafana 10/11 one"
        )
    ids = [panel.get("id") for panel in dashboard.get("panels") or []]
    if len(ids) != len(set(ids)):
        problems.append("panel ids are not unique")
    panels = dashboard_panels(dashboard)
    if not panels:
        problems.append("no panels")
    for panel in panels:
        title = panel.get("title") or "?"
        if (panel.get("datasource") or {}).get("uid") != "${datasource}":
            problems.append(f"{title}: datasource is not the $datasource variable")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{title}: no targets")
        refs = [target.get("refId") for target in targets]
        if len(refs) != len(set(refs)):
            problems.append(f"{title}: refIds are not unique")
        for target in targets:
            if (target.get("datasource") or {}).get("uid") != "${datasource}":
                problems.append(
                    f"{title}/{target.get('refId')}: target datasource is not $datasource"
                )
            if not str(target.get("expr") or "").strip():
                problems.append(f"{title}/{target.get('refId')}: no expr")
    for where, expr in dashboard_queries(dashboard):
        problems += syntax_problems(where, expr)
    return problems


# Pages in docs/operations/ that are not an alert's runbook.
NOT_RUNBOOKS = frozenset({"README.md", "guide.md"})


def runbook_files() -> set[str]:
    return {p.name for p in RUNBOOKS.glob("*.md") if p.name not in NOT_RUNBOOKS}
