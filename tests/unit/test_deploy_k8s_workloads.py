"""Static checks on deploy/k8s: every pod hardened, no secret values, the control plane's steps.

The manifests are parsed, not applied (no cluster here). The worker Deployments, one per node,
have their own module (test_deploy_k8s_workers.py), as do TLS (test_deploy_k8s_tls.py) and the
replicas (test_deploy_k8s_replicas.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.unit.deploy_manifests_support import (
    CLUSTER_SCOPED,
    GRPC_PORTS,
    K8S,
    NO_ML_SERVICES,
    README,
    SECRET_NAME,
    URL_CREDENTIALS,
    Docs,
    Problems,
    all_containers,
    by_kind_name,
    k8s_docs,
    k8s_files,
    option_value,
    pod_spec,
    secret_references,
    service_workload,
)
from tests.unit.test_deploy_http_api import HTTP_PORT

# The gRPC ports are TLS, which the kubelet's gRPC probe cannot speak: each server also answers
# plaintext grpc.health.v1 (and nothing else) on its health port (`--health-listen`).
HEALTH_PORTS = {"controlplane": 50061, "scheduler": 50062}
# Each Service's ports by name: the gRPC port, and the control plane's OpenAI-compatible HTTP API
# (test_deploy_http_api.py). Health and metrics ports stay off the Services.
SERVICE_PORTS = {
    "controlplane": {"grpc": GRPC_PORTS["controlplane"], "http": HTTP_PORT},
    "scheduler": {"grpc": GRPC_PORTS["scheduler"]},
}
# A Secret name in a README recipe stands for one per node where it says `$NODE`.
NODE_PLACEHOLDER = re.escape("$NODE")
KUBERNETES_NAME = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"


def pod_problems(name: str, spec: dict[str, Any]) -> Problems:
    problems: Problems = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"{name}: {key} true")
    pod_ctx = spec.get("securityContext") or {}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    containers = all_containers(spec)
    if not containers:
        problems.append(f"{name}: no containers")
    for container in containers:
        where = f"{name}/{container.get('name')}"
        ctx = container.get("securityContext") or {}
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) in (0, None):
            problems.append(f"{where}: runAsUser is root or unset")
        if ctx.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: readOnlyRootFilesystem is not true")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if ctx.get("privileged"):
            problems.append(f"{where}: privileged")
        capabilities = ctx.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: capabilities.drop lacks ALL")
        if capabilities.get("add"):
            problems.append(f"{where}: capabilities.add {capabilities['add']}")
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts") or []}
        tmp = mounts.get("/tmp")
        if tmp is None or "emptyDir" not in volumes.get(tmp["name"], {}):
            problems.append(f"{where}: /tmp is not an emptyDir mount")
        for mount in mounts.values():
            volume = volumes.get(mount["name"], {})
            if "hostPath" in volume and mount.get("readOnly") is not True:
                problems.append(f"{where}: hostPath {mount['mountPath']} is writable")
    return problems


def container_secret_problems(where: str, container: dict[str, Any]) -> Problems:
    """Secret material written into a container spec instead of referenced from a Secret."""
    problems: Problems = []
    for env in container.get("env") or []:
        if "value" in env and SECRET_NAME.search(env["name"]):
            problems.append(f"{where}: literal value for {env['name']}")
        if URL_CREDENTIALS.search(str(env.get("value", ""))):
            problems.append(f"{where}: password in env {env['name']}")
    for key in ("command", "args"):
        if any(URL_CREDENTIALS.search(str(a)) for a in container.get(key) or []):
            problems.append(f"{where}: password in {key}")
    return problems


def env_reference_problems(where: str, container: dict[str, Any]) -> Problems:
    """Every `$(VAR)` in command/args names an env var of that container (else it stays literal)."""
    names = {e["name"] for e in container.get("env") or []}
    used = {
        m
        for key in ("command", "args")
        for a in container.get(key) or []
        for m in re.findall(r"(?<!\$)\$\((\w+)\)", str(a))
    }
    return [f"{where}: $({name}) is not in env" for name in sorted(used - names)]


def controlplane_init_problems(doc: dict[str, Any]) -> Problems:
    """The control plane pod runs `gantry migrate` to completion before the control plane."""
    spec = pod_spec(doc) or {}
    containers = spec.get("containers") or []
    main = next((c for c in containers if c.get("name") == "controlplane"), None)
    if main is None:
        return ["no controlplane container"]
    inits = [
        c for c in spec.get("initContainers") or [] if (c.get("args") or [])[:1] == ["migrate"]
    ]
    if len(inits) != 1:
        return [f"expected one init container running `migrate`, found {len(inits)}"]
    init = inits[0]
    where = f"init/{init.get('name')}"
    problems: Problems = []
    if init.get("command") not in (None, main.get("command")):
        problems.append(f"{where}: command overrides the image entrypoint")
    for key in ("image", "imagePullPolicy", "env", "envFrom", "securityContext"):
        if init.get(key) != main.get(key):
            problems.append(f"{where}: {key} differs from the control plane's")
    url = option_value(init.get("args") or [], "--database-url")
    if url is None or url != option_value(main.get("args") or [], "--database-url"):
        problems.append(f"{where}: --database-url {url!r} differs from the control plane's")
    env = {e["name"]: e for e in init.get("env") or []}
    if "secretKeyRef" not in (env.get("PGPASSWORD") or {}).get("valueFrom", {}):
        problems.append(f"{where}: PGPASSWORD is not from a Secret")
    main_mounts = [(m["name"], m["mountPath"]) for m in main.get("volumeMounts") or []]
    for mount in init.get("volumeMounts") or []:
        if (mount["name"], mount["mountPath"]) not in main_mounts:
            problems.append(f"{where}: mounts {mount['mountPath']}, the control plane does not")
    if init.get("restartPolicy") == "Always":
        problems.append(f"{where}: restartPolicy Always makes it a sidecar, not a step")
    for key in ("ports", "livenessProbe", "readinessProbe", "startupProbe"):
        if init.get(key):
            problems.append(f"{where}: {key} on a run-to-completion step")
    return problems


def grpc_probe_problems(name: str, doc: dict[str, Any], port: int) -> Problems:
    problems: Problems = []
    containers = (pod_spec(doc) or {}).get("containers") or []
    for probe in ("livenessProbe", "readinessProbe"):
        if not any((c.get(probe) or {}).get("grpc", {}).get("port") == port for c in containers):
            problems.append(f"{name}: no grpc {probe} on {port}")
    return problems


@pytest.fixture(scope="module")
def docs() -> Docs:
    loaded = k8s_docs()
    assert loaded, "no Kubernetes manifests found"
    return loaded


def documented_secret(readme: str, name: str) -> bool:
    """The README creates Secret `name`: literally, or in a per-node recipe (`$NODE`)."""
    for match in re.finditer(r'create secret generic "?([^\s"]+)"?', readme):
        pattern = re.escape(match.group(1)).replace(NODE_PLACEHOLDER, KUBERNETES_NAME)
        if re.fullmatch(pattern, name):
            return True
    return False


def test_every_k8s_doc_has_identity(docs: list[tuple[str, dict[str, Any]]]) -> None:
    for filename, doc in docs:
        assert isinstance(doc, dict), filename
        assert doc.get("apiVersion"), filename
        assert doc.get("kind"), filename
        assert (doc.get("metadata") or {}).get("name"), filename
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == "gantry", (filename, doc["kind"])


def test_no_secret_values_in_manifests(docs: list[tuple[str, dict[str, Any]]]) -> None:
    secrets = [d for _, d in docs if d["kind"] == "Secret"]
    assert not [s for s in secrets if s.get("data") or s.get("stringData")]
    problems = [
        p
        for _, doc in docs
        if (spec := pod_spec(doc)) is not None
        for c in all_containers(spec)
        for p in container_secret_problems(f"{doc['metadata']['name']}/{c['name']}", c)
    ]
    assert problems == []
    config = [
        f"{d['metadata']['name']}/{key}"
        for _, d in docs
        if d["kind"] == "ConfigMap"
        for key, value in (d.get("data") or {}).items()
        if SECRET_NAME.search(key.upper().replace("-", "_")) or URL_CREDENTIALS.search(str(value))
    ]
    assert config == []


def test_every_k8s_workload_is_hardened(docs: list[tuple[str, dict[str, Any]]]) -> None:
    workloads = [(f"{d['kind']}/{d['metadata']['name']}", pod_spec(d)) for _, d in docs]
    workloads = [(name, spec) for name, spec in workloads if spec is not None]
    assert len(workloads) >= 3
    problems = [p for name, spec in workloads for p in pod_problems(name, spec)]
    assert problems == []


@pytest.mark.parametrize("service", NO_ML_SERVICES)
def test_k8s_grpc_services(docs: list[tuple[str, dict[str, Any]]], service: str) -> None:
    deployment = service_workload(docs, service)
    assert grpc_probe_problems(service, deployment, HEALTH_PORTS[service]) == []
    svc = by_kind_name(docs, "Service", f"gantry-{service}")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == SERVICE_PORTS[service]
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= template_labels.items()
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.split(":")[0] == f"gantry/{service}"


def test_k8s_control_plane_migrates_in_an_init_container(
    docs: list[tuple[str, dict[str, Any]]],
) -> None:
    deployment = by_kind_name(docs, "Deployment", "gantry-controlplane")
    assert controlplane_init_problems(deployment) == []
    spec = pod_spec(deployment) or {}
    (init,) = spec["initContainers"]
    assert init["args"] == ["migrate", "--database-url", "$(GANTRY_DATABASE_URL)"]
    env = {e["name"]: e["valueFrom"] for e in init["env"]}
    assert env["GANTRY_DATABASE_URL"]["configMapKeyRef"]["key"] == "database-url"
    assert env["PGPASSWORD"]["secretKeyRef"] == {"name": "gantry-postgres", "key": "password"}
    # Hardened like every container (test_every_k8s_workload_is_hardened covers it too).
    assert pod_problems("controlplane", {**spec, "containers": []}) == []


def test_k8s_references_resolve_and_secrets_are_documented(
    docs: list[tuple[str, dict[str, Any]]],
) -> None:
    defined = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    readme = README.read_text()
    secret_names: set[str] = set()
    for _, doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        for volume in spec.get("volumes") or []:
            if "secret" in volume:
                secret_names.add(volume["secret"]["secretName"])
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in defined, claim
        if spec.get("serviceAccountName"):
            assert ("ServiceAccount", spec["serviceAccountName"]) in defined
        for container in all_containers(spec):
            where = f"{doc['metadata']['name']}/{container['name']}"
            assert env_reference_problems(where, container) == []
            for env in container.get("env") or []:
                ref = env.get("valueFrom") or {}
                if "secretKeyRef" in ref:
                    secret_names.add(ref["secretKeyRef"]["name"])
                if "configMapKeyRef" in ref:
                    assert ("ConfigMap", ref["configMapKeyRef"]["name"]) in defined
        # Every way a pod reads a Secret (envFrom, projected volumes too) is documented.
        secret_names |= secret_references(spec)
    assert secret_names, "workloads reference no Secrets"
    undocumented = sorted(s for s in secret_names if not documented_secret(readme, s))
    assert undocumented == []


def test_the_secret_documentation_check_knows_per_node_recipes() -> None:
    readme = 'kubectl create secret generic gantry-ca\ncreate secret generic "gantry-node-$NODE"\n'
    assert documented_secret(readme, "gantry-ca")
    assert documented_secret(readme, "gantry-node-gpu-node-2")
    assert not documented_secret(readme, "gantry-node-")
    assert not documented_secret(readme, "gantry-ca-2")
    assert not documented_secret(readme, "gantry-postgres")


def test_kustomization_lists_exactly_the_manifests() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    missing = [r for r in resources if not (K8S / r).is_file()]
    assert missing == []
    unlisted = sorted({p.name for p in k8s_files()} - set(resources))
    assert unlisted == []


# The checks themselves: each must reject a bad input.


def test_k8s_checks_reject_a_bad_pod() -> None:
    bad_spec = {
        "hostNetwork": True,
        "containers": [
            {
                "name": "w",
                "ports": [{"containerPort": 8080}],
                "securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}},
                "volumeMounts": [{"name": "a", "mountPath": "/artifacts"}],
            }
        ],
        "volumes": [{"name": "a", "hostPath": {"path": "/srv/artifacts"}}],
    }
    problems = " | ".join(pod_problems("bad", bad_spec))
    for expected in (
        "hostNetwork true",
        "runAsNonRoot",
        "runAsUser is root",
        "readOnlyRootFilesystem",
        "allowPrivilegeEscalation",
        "capabilities.drop lacks ALL",
        "capabilities.add",
        "/tmp is not an emptyDir",
        "hostPath /artifacts is writable",
    ):
        assert expected in problems
    # test_deploy_k8s_workers.py feeds the same pod to the worker checks.
    bad_deployment = {"kind": "Deployment", "spec": {"template": {"spec": bad_spec}}}
    assert grpc_probe_problems("cp", bad_deployment, 50051) != []


def test_k8s_checks_cover_init_containers() -> None:
    doc = next(yaml.safe_load_all((K8S / "controlplane.yaml").read_text()))
    spec = doc["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    init["securityContext"] = {"runAsUser": 0, "readOnlyRootFilesystem": False}
    init["volumeMounts"] = [{"name": "tmp", "mountPath": "/data"}]
    init["image"] = "gantry/scheduler:0.1.0"
    init["env"] = [{"name": "PGPASSWORD", "value": "hunter2"}]
    init["args"] = ["migrate", "--database-url", "$(DATABASE_URL)"]
    init["readinessProbe"] = {"grpc": {"port": 50051}}
    hardening = " | ".join(pod_problems("cp", spec))
    for expected in (
        f"cp/{init['name']}: runAsUser is root",
        f"cp/{init['name']}: readOnlyRootFilesystem",
        f"cp/{init['name']}: allowPrivilegeEscalation",
        f"cp/{init['name']}: capabilities.drop lacks ALL",
        f"cp/{init['name']}: /tmp is not an emptyDir",
    ):
        assert expected in hardening
    assert "literal value for PGPASSWORD" in " | ".join(container_secret_problems("cp", init))
    assert env_reference_problems("cp", init) == ["cp: $(DATABASE_URL) is not in env"]
    problems = " | ".join(controlplane_init_problems(doc))
    for expected in (
        "image differs",
        "env differs",
        "securityContext differs",
        "--database-url",
        "PGPASSWORD is not from a Secret",
        "mounts /data",
        "readinessProbe",
    ):
        assert expected in problems
    spec["initContainers"] = []
    assert "found 0" in " | ".join(controlplane_init_problems(doc))
