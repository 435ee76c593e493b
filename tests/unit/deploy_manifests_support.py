"""Loading and walking deploy/ for the static deploy tests: paths, YAML loaders, pod specs.

No Docker engine or cluster is needed: the files are parsed and the `test_deploy_*` modules assert
their security properties (ARCHITECTURE.md, "Security" and "Scale-out"). Each check there returns
a list of problems, so a test can also feed it a deliberately bad input to show it can fail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
IMAGES = DEPLOY / "images"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
README = DEPLOY / "README.md"

SERVICES = ("controlplane", "scheduler", "worker")
NO_ML_SERVICES = ("controlplane", "scheduler")
GRPC_PORTS = {"controlplane": 50051, "scheduler": 50052}
# Plaintext Prometheus /metrics (`--metrics-address`): the worker's only listening port.
METRICS_PORTS = {"controlplane": 9464, "scheduler": 9465, "worker": 9466}
# Where Prometheus runs in Kubernetes: the one namespace the NetworkPolicies admit scrapes from.
MONITORING_NAMESPACE = "monitoring"
APP_UID = 10001
# A password written into a URL (`scheme://user:password@host`): never in a manifest.
URL_CREDENTIALS = re.compile(r"://[^/@:\s]+:[^/@\s]+@")
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|CREDENTIAL")
POD_KINDS = {"Pod", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}

# Per service: the TLS options that must name a file mounted from a secret.
TLS_OPTIONS = {
    "controlplane": (
        "--tls-cert",
        "--tls-key",
        "--scheduler-tls-ca",
        "--scheduler-tls-cert",
        "--scheduler-tls-key",
    ),
    "scheduler": ("--tls-cert", "--tls-key", "--tls-client-ca"),
    "worker": ("--tls-ca",),
}

Problems = list[str]
Doc = dict[str, Any]
Docs = list[tuple[str, Doc]]


def user_is_root(user: str) -> bool:
    name = user.split(":", 1)[0].strip()
    return name in ("", "root", "0")


def option_value(args: list[Any], option: str) -> str | None:
    """The value after `option` in an argument list (or `option=value`), else None."""
    tokens = [str(a) for a in args]
    for i, token in enumerate(tokens):
        if token == option and i + 1 < len(tokens):
            return tokens[i + 1]
        if token.startswith(f"{option}="):
            return token.partition("=")[2]
    return None


def load_compose(path: Path = COMPOSE) -> Doc:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def k8s_files(directory: Path = K8S) -> list[Path]:
    return sorted(p for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_docs(directory: Path = K8S) -> Docs:
    docs = []
    for path in k8s_files(directory):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def pod_spec(doc: Doc) -> dict[str, Any] | None:
    kind = doc.get("kind")
    if kind not in POD_KINDS:
        return None
    if kind == "Pod":
        return doc["spec"]
    if kind == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for key in ("initContainers", "containers", "ephemeralContainers")
        for c in spec.get(key) or []
    ]


def by_kind_name(docs: Docs, kind: str, name: str) -> Doc:
    found = [d for _, d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


# The kind of each service's workload: the control plane's replicas are interchangeable (a
# Deployment); each scheduler pod needs a stable name the control planes dial (a StatefulSet).
WORKLOAD_KINDS = {"controlplane": "Deployment", "scheduler": "StatefulSet"}


def service_workload(docs: Docs, service: str) -> Doc:
    """The control plane's or the scheduler's workload (`gantry-<service>`, of its kind)."""
    return by_kind_name(docs, WORKLOAD_KINDS[service], f"gantry-{service}")


def secret_references(spec: dict[str, Any]) -> set[str]:
    """Every Secret a pod can read: secret and projected volumes, env and envFrom references."""
    names: set[str] = set()
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                names.add(source["secret"]["name"])
    for container in all_containers(spec):
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for env_from in container.get("envFrom") or []:
            if "secretRef" in env_from:
                names.add(env_from["secretRef"]["name"])
    return names


def runs_the_worker(doc: Doc) -> bool:
    """A workload whose pods run `gantry worker`, whatever its kind or name."""
    spec = pod_spec(doc)
    if spec is None:
        return False
    return any(
        str(c.get("image", "")).split(":")[0] == "gantry/worker"
        or [str(a) for a in c.get("args") or []][:1] == ["worker"]
        for c in all_containers(spec)
    )


def worker_workloads(docs: Docs) -> list[Doc]:
    return [doc for _, doc in docs if runs_the_worker(doc)]
