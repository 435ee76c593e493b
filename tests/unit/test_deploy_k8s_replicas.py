"""Static checks on deploy/k8s's replicas: the control plane as three rolling replicas behind a
PodDisruptionBudget, a ClusterIP Service for clients and a headless one for workers (whose
`--control-plane` is its DNS name), the scheduler as two named pods (active and standby) the
control planes are given both of, and every flag a manifest passes known to its service's parser.

Each check returns a list of problems; the last tests feed each a bad manifest to show it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
from collections.abc import Callable
from typing import Any

import pytest

from gantry.common.client_config import split_addresses
from gantry.controlplane.main import build_parser as controlplane_parser
from gantry.scheduler.settings import build_parser as scheduler_parser
from gantry.worker.control_planes import parse_control_planes
from gantry.worker.settings import build_parser as worker_parser
from tests.unit.deploy_manifests_support import (
    GRPC_PORTS,
    Doc,
    Docs,
    Problems,
    by_kind_name,
    k8s_docs,
    option_value,
    pod_spec,
    service_workload,
    worker_workloads,
)

NAMESPACE_DOMAIN = "gantry.svc.cluster.local"
CONTROL_PLANE_REPLICAS = 3
SCHEDULER_REPLICAS = 2  # active and standby
WORKERS_SERVICE = "gantry-controlplane-workers"
CLIENTS_SERVICE = "gantry-controlplane"
# How many pods of each a voluntary disruption (a drain) must leave running.
KEEP_RUNNING = {"controlplane": 2, "scheduler": 1}
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "controlplane": controlplane_parser,
    "scheduler": scheduler_parser,
    "worker": worker_parser,
}


@pytest.fixture(scope="module")
def docs() -> Docs:
    return k8s_docs()


def _container(doc: Doc, name: str) -> dict[str, Any]:
    return next(c for c in (pod_spec(doc) or {}).get("containers") or [] if c["name"] == name)


def _selects(service_or_budget: Doc, workload: Doc) -> bool:
    spec = service_or_budget["spec"]
    selector = spec.get("selector") or {}
    selector = selector.get("matchLabels", selector)  # a PDB's selector is a label selector
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return bool(selector) and selector.items() <= labels.items()


def rolling_replica_problems(doc: Doc) -> Problems:
    """Three replicas; an update adds a new pod before it takes an old one away; each pod says
    when it is ready to be sent traffic."""
    spec = doc["spec"]
    problems: Problems = []
    if spec.get("replicas") != CONTROL_PLANE_REPLICAS:
        problems.append(f"replicas {spec.get('replicas')}, not {CONTROL_PLANE_REPLICAS}")
    strategy = spec.get("strategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    if strategy.get("type") != "RollingUpdate":
        problems.append(f"strategy {strategy.get('type')}, not RollingUpdate")
    if (rolling.get("maxUnavailable"), rolling.get("maxSurge")) != (0, 1):
        problems.append(f"rollingUpdate {rolling}: not maxUnavailable 0, maxSurge 1")
    if not _container(doc, "controlplane").get("readinessProbe"):
        problems.append("no readinessProbe")
    return problems


def disruption_budget_problems(docs: Docs, workload: Doc, keep: int) -> Problems:
    """One PodDisruptionBudget selects the workload's pods, lets a drain evict one at a time and
    keeps `keep` running."""
    name = workload["metadata"]["name"]
    budgets = [d for _, d in docs if d["kind"] == "PodDisruptionBudget" and _selects(d, workload)]
    if len(budgets) != 1:
        return [f"{name}: {len(budgets)} PodDisruptionBudgets select its pods, not 1"]
    spec, replicas = budgets[0]["spec"], workload["spec"]["replicas"]
    if "maxUnavailable" in spec:
        evictable = spec["maxUnavailable"]
    else:
        evictable = replicas - spec.get("minAvailable", replicas)
    if not isinstance(evictable, int) or not 1 <= evictable <= replicas - keep:
        return [f"{name}: its budget {spec} does not evict one at a time keeping {keep}"]
    return []


def control_plane_service_problems(docs: Docs, workload: Doc) -> Problems:
    """A ClusterIP Service for clients, a headless one for workers, both on the gRPC port; every
    worker dials the headless one's name in the form that opens a stream per replica."""
    problems: Problems = []
    clients = by_kind_name(docs, "Service", CLIENTS_SERVICE)
    if clients["spec"].get("clusterIP") == "None" or clients["spec"].get("type") != "ClusterIP":
        problems.append(f"{CLIENTS_SERVICE}: not a ClusterIP Service")
    workers = by_kind_name(docs, "Service", WORKERS_SERVICE)
    if workers["spec"].get("clusterIP") != "None":
        problems.append(f"{WORKERS_SERVICE}: not headless (clusterIP: None)")
    for service in (clients, workers):
        ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
        if not _selects(service, workload) or ports.get("grpc") != GRPC_PORTS["controlplane"]:
            problems.append(f"{service['metadata']['name']}: not the replicas' gRPC port")
    port = GRPC_PORTS["controlplane"]
    expected = f"dns:///{WORKERS_SERVICE}.{NAMESPACE_DOMAIN}:{port}"
    for worker in worker_workloads(docs):
        dialled = option_value(_container(worker, "worker").get("args") or [], "--control-plane")
        if dialled != expected or not parse_control_planes(dialled).resolves:
            problems.append(f"{worker['metadata']['name']}: --control-plane {dialled}")
    return problems


def scheduler_pair_problems(docs: Docs, scheduler: Doc, control_plane: Doc) -> Problems:
    """Two scheduler pods with stable names under a headless Service, and every control plane
    given both names (not a load-balanced one, which would split the replicas' work)."""
    spec = scheduler["spec"]
    problems: Problems = []
    if spec.get("replicas") != SCHEDULER_REPLICAS:
        problems.append(f"scheduler replicas {spec.get('replicas')}, not {SCHEDULER_REPLICAS}")
    governing = by_kind_name(docs, "Service", spec.get("serviceName") or "")
    if governing["spec"].get("clusterIP") != "None" or not _selects(governing, scheduler):
        problems.append(f"scheduler: Service {spec.get('serviceName')} is not its headless one")
    name, port = scheduler["metadata"]["name"], GRPC_PORTS["scheduler"]
    expected = [
        f"{name}-{ordinal}.{spec.get('serviceName')}.{NAMESPACE_DOMAIN}:{port}"
        for ordinal in range(spec.get("replicas") or 0)
    ]
    given = option_value(_container(control_plane, "controlplane")["args"], "--scheduler") or ""
    if list(split_addresses(given)) != expected:
        problems.append(f"controlplane --scheduler {given}, not {','.join(expected)}")
    return problems


def unknown_flag_problems(service: str, args: list[Any]) -> Problems:
    """What the service's own parser refuses in a container's args (after the role word)."""
    words = [str(word) for word in args]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            PARSERS[service]().parse_args(words[1:])
    except SystemExit:
        return [f"{service}: {errors.getvalue().strip().splitlines()[-1]}"]
    return [] if words[:1] == [service] else [f"{service}: args start {words[:1]}"]


def test_the_control_plane_runs_three_rolling_replicas(docs: Docs) -> None:
    assert rolling_replica_problems(service_workload(docs, "controlplane")) == []


@pytest.mark.parametrize("service", sorted(KEEP_RUNNING))
def test_a_drain_takes_one_replica_at_a_time(docs: Docs, service: str) -> None:
    workload = service_workload(docs, service)
    assert disruption_budget_problems(docs, workload, KEEP_RUNNING[service]) == []


def test_clients_and_workers_reach_the_replicas_through_their_own_services(docs: Docs) -> None:
    assert control_plane_service_problems(docs, service_workload(docs, "controlplane")) == []


def test_the_control_planes_are_given_both_schedulers_by_name(docs: Docs) -> None:
    scheduler = service_workload(docs, "scheduler")
    control_plane = service_workload(docs, "controlplane")
    assert scheduler_pair_problems(docs, scheduler, control_plane) == []


def test_every_flag_in_the_manifests_is_one_its_service_takes(docs: Docs) -> None:
    containers = [
        (service, _container(service_workload(docs, service), service))
        for service in ("controlplane", "scheduler")
    ]
    containers += [("worker", _container(w, "worker")) for w in worker_workloads(docs)]
    problems = [p for service, c in containers for p in unknown_flag_problems(service, c["args"])]
    assert problems == []


# The checks themselves: each must reject a bad input.


def test_the_replica_checks_reject_a_single_recreated_control_plane(docs: Docs) -> None:
    bad = copy.deepcopy(service_workload(docs, "controlplane"))
    bad["spec"]["replicas"] = 1
    bad["spec"]["strategy"] = {"type": "Recreate"}
    del _container(bad, "controlplane")["readinessProbe"]
    problems = " | ".join(rolling_replica_problems(bad))
    for expected in ("replicas 1", "strategy Recreate", "not maxUnavailable 0", "readinessProbe"):
        assert expected in problems
    unbudgeted = [(n, d) for n, d in docs if d["kind"] != "PodDisruptionBudget"]
    assert "0 PodDisruptionBudgets" in " ".join(disruption_budget_problems(unbudgeted, bad, 2))
    strict = copy.deepcopy(docs)
    for _, doc in strict:
        if doc["kind"] == "PodDisruptionBudget":
            doc["spec"] = {"minAvailable": 3, "selector": doc["spec"]["selector"]}
    workload = service_workload(strict, "controlplane")
    assert "does not evict one at a time" in " ".join(
        disruption_budget_problems(strict, workload, 2)
    )


def test_the_service_checks_reject_one_load_balanced_address_for_workers(docs: Docs) -> None:
    bad = copy.deepcopy(docs)
    by_kind_name(bad, "Service", WORKERS_SERVICE)["spec"]["clusterIP"] = "10.0.0.9"
    for worker in worker_workloads(bad):
        args = _container(worker, "worker")["args"]
        args[args.index("--control-plane") + 1] = f"{CLIENTS_SERVICE}.{NAMESPACE_DOMAIN}:50051"
    problems = " | ".join(
        control_plane_service_problems(bad, service_workload(bad, "controlplane"))
    )
    assert "not headless" in problems and "--control-plane gantry-controlplane." in problems


def test_the_scheduler_check_rejects_one_address_for_two_schedulers(docs: Docs) -> None:
    bad = copy.deepcopy(docs)
    scheduler, control_plane = (service_workload(bad, s) for s in ("scheduler", "controlplane"))
    scheduler["spec"]["replicas"] = 1
    args = _container(control_plane, "controlplane")["args"]
    args[args.index("--scheduler") + 1] = f"gantry-scheduler.{NAMESPACE_DOMAIN}:50052"
    problems = " | ".join(scheduler_pair_problems(bad, scheduler, control_plane))
    assert "scheduler replicas 1" in problems and "controlplane --scheduler" in problems


def test_the_flag_check_rejects_a_flag_the_service_does_not_have() -> None:
    given = ["scheduler", "--service-token-file", "/t", "--standby-of", "x"]
    [problem] = unknown_flag_problems("scheduler", given)
    assert "--standby-of" in problem
    assert unknown_flag_problems("worker", ["controlplane"]) != []
