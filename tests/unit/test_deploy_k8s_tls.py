"""Static checks on deploy/k8s TLS: every TLS option names a file on a read-only Secret mount."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.deploy_manifests_support import (
    K8S,
    SERVICES,
    TLS_OPTIONS,
    Docs,
    Problems,
    by_kind_name,
    k8s_docs,
    option_value,
    pod_spec,
    service_workload,
    worker_workloads,
)


@pytest.fixture(scope="module")
def docs() -> Docs:
    return k8s_docs()


def k8s_tls_problems(service: str, doc: dict[str, Any]) -> Problems:
    """Each TLS option names a file on a read-only mount of a Secret volume."""
    spec = pod_spec(doc) or {}
    container = next(c for c in spec["containers"] if c["name"] == service)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = container.get("volumeMounts") or []
    problems: Problems = []
    for option in TLS_OPTIONS[service]:
        path = option_value(container.get("args") or [], option)
        if path is None:
            problems.append(f"{service}: no {option}")
            continue
        mount = next((m for m in mounts if path.startswith(m["mountPath"].rstrip("/") + "/")), None)
        if mount is None or "secret" not in volumes.get(mount["name"], {}):
            problems.append(f"{service}: {option} {path} is not on a Secret mount")
        elif mount.get("readOnly") is not True:
            problems.append(f"{service}: {option} {path} is on a writable mount")
    return problems


def workloads_of(docs: Docs, service: str) -> list[dict[str, Any]]:
    """The control plane's Deployment, the scheduler's StatefulSet; every worker Deployment (one
    per node)."""
    if service == "worker":
        return worker_workloads(docs)
    return [service_workload(docs, service)]


@pytest.mark.parametrize("service", SERVICES)
def test_k8s_channels_use_tls_from_secret_mounts(docs: Docs, service: str) -> None:
    workloads = workloads_of(docs, service)
    assert workloads
    for workload in workloads:
        assert k8s_tls_problems(service, workload) == []


def test_k8s_tls_check_rejects_plaintext_and_certificates_outside_secrets() -> None:
    doc = next(yaml.safe_load_all((K8S / "scheduler.yaml").read_text()))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    args[args.index("--tls-key") + 1] = "/tmp/tls.key"
    del args[args.index("--tls-client-ca") : args.index("--tls-client-ca") + 2]
    problems = " | ".join(k8s_tls_problems("scheduler", doc))
    assert "no --tls-client-ca" in problems and "/tmp/tls.key is not on a Secret" in problems


def test_k8s_control_plane_reads_its_endpoint_key_from_a_read_only_secret(docs: Docs) -> None:
    """Adopted endpoints' credentials stay readable across restarts: the sealing key is a Secret
    (gantry-endpoint-key, documented in deploy/README.md), never minted in the pod."""
    spec = pod_spec(by_kind_name(docs, "Deployment", "gantry-controlplane")) or {}
    container = next(c for c in spec["containers"] if c["name"] == "controlplane")
    path = option_value(container.get("args") or [], "--endpoint-key-file")
    assert path == "/run/secrets/endpoint-key/endpoint.key"
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "gantry-endpoint-key"
