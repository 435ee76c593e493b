"""Static checks on the Kubernetes workers: one Deployment per node, each with its own credential.

A worker pod must be able to act as its own node and no other (ARCHITECTURE.md, "Security"): it
mounts exactly one node Secret, `gantry-node-<node>`, that no other workload mounts, none of the
control plane's Secrets, and has no Kubernetes API token through which it could read the rest.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import pytest

from tests.unit.deploy_manifests_support import (
    METRICS_PORTS,
    MONITORING_NAMESPACE,
    Doc,
    Docs,
    Problems,
    all_containers,
    by_kind_name,
    k8s_docs,
    option_value,
    pod_spec,
    runs_the_worker,
    secret_references,
    worker_workloads,
)

NODE_SECRET_PREFIX = "gantry-node-"
WORKER_PREFIX = "gantry-worker-"
NODE_SECRET_KEY = "credential"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# The CA certificate (no key): public, the same for every worker.
SHARED_WORKER_SECRETS = frozenset({"gantry-ca"})
EXAMPLE_NODE = "node-a"
# The one port a worker container may declare: Prometheus /metrics.
WORKER_METRICS = ("metrics", METRICS_PORTS["worker"])


@pytest.fixture(scope="module")
def docs() -> Docs:
    return k8s_docs()


def name_of(doc: Doc) -> str:
    return str((doc.get("metadata") or {}).get("name", "?"))


def node_secrets(spec: dict[str, Any]) -> list[str]:
    return sorted(s for s in secret_references(spec) if s.startswith(NODE_SECRET_PREFIX))


def gpu_limits(doc: Doc) -> list[int]:
    spec = pod_spec(doc) or {}
    limits = [c.get("resources", {}).get("limits", {}) for c in spec.get("containers") or []]
    return [int(lim["nvidia.com/gpu"]) for lim in limits if "nvidia.com/gpu" in lim]


def worker_problems(doc: Doc, *, gpu: bool = False) -> Problems:
    """One pod per node, pinned to it, listening on nothing but /metrics, no API access; CPU-only
    as deploy/k8s writes it, GPU-bound (`gpu=True`) once the deploy/k8s-gpu overlay applied."""
    problems: Problems = []
    name = name_of(doc)
    if doc.get("kind") != "Deployment":
        problems.append(f"worker is a {doc.get('kind')}, not a Deployment")
    workload = doc.get("spec") or {}
    # Two pods with one credential fence each other: one replica, replaced by Recreate.
    if workload.get("replicas") != 1:
        problems.append(f"{name}: replicas {workload.get('replicas')}, expected 1")
    if (workload.get("strategy") or {}).get("type") != "Recreate":
        problems.append(f"{name}: strategy is not Recreate")
    spec = pod_spec(doc) or {}
    if spec.get("hostNetwork", False) is not False:
        problems.append("worker: hostNetwork is not false")
    selector = spec.get("nodeSelector") or {}
    if not selector:
        problems.append("worker: no nodeSelector")
    elif HOSTNAME_LABEL not in selector:
        problems.append(f"{name}: nodeSelector does not pin it to one node ({HOSTNAME_LABEL})")
    for container in all_containers(spec):
        ports = container.get("ports") or []
        if [(p.get("name"), p.get("containerPort")) for p in ports] not in ([], [WORKER_METRICS]):
            problems.append(f"worker/{container['name']}: ports {ports}")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if any(k in (container.get(probe) or {}) for k in ("grpc", "httpGet", "tcpSocket")):
                problems.append(f"worker/{container['name']}: {probe} implies a listening port")
    gpus = gpu_limits(doc)
    if gpu and not any(count >= 1 for count in gpus):
        problems.append("worker: no nvidia.com/gpu limit")
    if not gpu and gpus:
        problems.append(f"{name}: nvidia.com/gpu {gpus} without the GPU overlay (CPU-only hosts)")
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    artifact_mounts = [
        (m, volumes.get(m["name"], {}))
        for c in spec.get("containers") or []
        for m in c.get("volumeMounts") or []
        if m["mountPath"] == "/artifacts"
    ]
    if not artifact_mounts:
        problems.append("worker: /artifacts not mounted")
    for mount, volume in artifact_mounts:
        if mount.get("readOnly") is not True:
            problems.append("worker: /artifacts mount is writable")
        pvc = volume.get("persistentVolumeClaim")
        if pvc is not None and pvc.get("readOnly") is not True:
            problems.append("worker: artifacts PVC is not readOnly")
        if pvc is None and "hostPath" not in volume:
            problems.append("worker: artifacts are neither a PVC nor a hostPath")
    if spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{name}: automountServiceAccountToken is not false")
    if spec.get("serviceAccountName") in (None, "", "default"):
        problems.append(f"{name}: runs as the namespace's default service account")
    return [*problems, *node_credential_problems(doc)]


def node_credential_problems(doc: Doc) -> Problems:
    """The worker reads one node Secret, named for the node it is pinned to, and no other."""
    name = name_of(doc)
    spec = pod_spec(doc) or {}
    mounted = node_secrets(spec)
    if len(mounted) != 1:
        return [f"{name}: mounts {len(mounted)} node Secrets {mounted}, expected 1"]
    (secret,) = mounted
    node = secret.removeprefix(NODE_SECRET_PREFIX)
    problems: Problems = []
    if name != f"{WORKER_PREFIX}{node}":
        problems.append(f"{name}: mounts {secret}, the Secret of another node")
    pinned = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    if pinned != node:
        problems.append(f"{name}: pinned to {pinned!r} but mounts {secret}")
    for other in sorted(secret_references(spec) - {secret} - SHARED_WORKER_SECRETS):
        problems.append(f"{name}: can read Secret {other}")
    secret_volumes = {
        v["name"]
        for v in spec.get("volumes") or []
        if v.get("secret", {}).get("secretName") == secret
    }
    for container in spec.get("containers") or []:
        path = option_value(container.get("args") or [], "--credential-file")
        if path is None:
            continue
        expected = [
            f"{m['mountPath'].rstrip('/')}/{NODE_SECRET_KEY}"
            for m in container.get("volumeMounts") or []
            if m["name"] in secret_volumes and m.get("readOnly") is True
        ]
        if path not in expected:
            problems.append(
                f"{name}: --credential-file {path} is not the credential key of {secret}"
            )
    if not secret_volumes:
        problems.append(f"{name}: {secret} is not mounted as a volume")
    return problems


def node_secret_sharing_problems(docs: Docs) -> Problems:
    """No node Secret in two workloads, no two workers on one node, no worker Secret elsewhere.

    "Elsewhere" is any workload that is not a worker: the control plane and the scheduler.
    """
    problems: Problems = []
    readers: dict[str, list[str]] = defaultdict(list)
    pinned: dict[str, list[str]] = defaultdict(list)
    others: dict[str, set[str]] = {}
    for _, doc in docs:
        spec = pod_spec(doc)
        if spec is None:
            continue
        for secret in node_secrets(spec):
            readers[secret].append(name_of(doc))
        if runs_the_worker(doc):
            node = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
            pinned[str(node)].append(name_of(doc))
        else:
            others[name_of(doc)] = secret_references(spec)
    for secret, names in sorted(readers.items()):
        if len(names) > 1:
            problems.append(f"{secret} is mounted by {sorted(names)}")
    for node, names in sorted(pinned.items()):
        if len(names) > 1:
            problems.append(f"workers {sorted(names)} all run on node {node}")
    for worker in worker_workloads(docs):
        mounted = secret_references(pod_spec(worker) or {})
        for other, secrets in sorted(others.items()):
            for secret in sorted(mounted & secrets):
                problems.append(f"{name_of(worker)} mounts {secret}, a Secret of {other}")
    for other, secrets in sorted(others.items()):
        for secret in sorted(s for s in secrets if s.startswith(NODE_SECRET_PREFIX)):
            problems.append(f"{other} mounts node Secret {secret}")
    return problems


def api_access_problems(docs: Docs) -> Problems:
    """Worker pods run as a service account that exists, mounts no token and nothing binds."""
    problems: Problems = []
    accounts = {name_of(d): d for _, d in docs if d.get("kind") == "ServiceAccount"}
    bindings = [d for _, d in docs if d.get("kind") in ("RoleBinding", "ClusterRoleBinding")]
    for worker in worker_workloads(docs):
        spec = pod_spec(worker) or {}
        account = spec.get("serviceAccountName") or "default"
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{name_of(worker)}: automountServiceAccountToken is not false")
        if account not in accounts:
            problems.append(f"{name_of(worker)}: service account {account} is not in the manifests")
        elif accounts[account].get("automountServiceAccountToken") is not False:
            problems.append(f"ServiceAccount/{account}: automountServiceAccountToken is not false")
        for binding in bindings:
            for subject in binding.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount" and subject.get("name") == account:
                    problems.append(f"{binding['kind']}/{name_of(binding)} grants {account}")
    return problems


def test_k8s_workers_are_one_pinned_deployment_per_node(docs: Docs) -> None:
    workers = worker_workloads(docs)
    assert workers, "no worker workload"
    for worker in workers:
        assert worker_problems(worker) == []
        assert (pod_spec(worker) or {}).get("hostNetwork") is False
        labels = worker["spec"]["template"]["metadata"]["labels"]
        for _, doc in docs:
            if doc["kind"] == "Service":
                selector = doc["spec"].get("selector") or {}
                assert not selector or not selector.items() <= labels.items(), "a Service hits it"
    example = by_kind_name(docs, "Deployment", f"{WORKER_PREFIX}{EXAMPLE_NODE}")
    assert secret_references(pod_spec(example) or {}) == {
        f"{NODE_SECRET_PREFIX}{EXAMPLE_NODE}",
        "gantry-ca",
    }


def test_each_node_secret_is_mounted_by_exactly_one_worker(docs: Docs) -> None:
    assert node_secret_sharing_problems(docs) == []
    for worker in worker_workloads(docs):
        assert len(node_secrets(pod_spec(worker) or {})) == 1, name_of(worker)


def test_no_worker_mounts_the_control_planes_secrets(docs: Docs) -> None:
    controlplane = secret_references(
        pod_spec(by_kind_name(docs, "Deployment", "gantry-controlplane")) or {}
    )
    assert {"gantry-operator-token", "gantry-postgres", "gantry-controlplane-tls"} <= controlplane
    for worker in worker_workloads(docs):
        assert not secret_references(pod_spec(worker) or {}) & controlplane, name_of(worker)
    assert not [s for s in controlplane if s.startswith(NODE_SECRET_PREFIX)]


def test_worker_pods_have_no_kubernetes_api_access(docs: Docs) -> None:
    assert api_access_problems(docs) == []
    for worker in worker_workloads(docs):
        assert (pod_spec(worker) or {})["automountServiceAccountToken"] is False


def test_every_worker_is_under_the_worker_network_policy(docs: Docs) -> None:
    policy = by_kind_name(docs, "NetworkPolicy", "gantry-worker")
    selected = policy["spec"]["podSelector"]["matchLabels"]
    # Nothing may connect in but Prometheus, from its own namespace, to /metrics.
    assert policy["spec"]["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": MONITORING_NAMESPACE}
                    }
                }
            ],
            "ports": [{"protocol": "TCP", "port": METRICS_PORTS["worker"]}],
        }
    ]
    for worker in worker_workloads(docs):
        labels = worker["spec"]["template"]["metadata"]["labels"]
        assert selected.items() <= labels.items(), name_of(worker)


def test_worker_selectors_match_only_their_own_pods(docs: Docs) -> None:
    workers = worker_workloads(docs)
    for worker in workers:
        selector = worker["spec"]["selector"]["matchLabels"]
        for other in workers:
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert (selector.items() <= labels.items()) == (other is worker), name_of(other)


# The checks themselves: each must reject a bad input.


def test_worker_check_rejects_a_bad_worker() -> None:
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
    bad_worker = {"kind": "DaemonSet", "spec": {"template": {"spec": bad_spec}}}
    worker = " | ".join(worker_problems(bad_worker, gpu=True))
    for expected in (
        "not a Deployment",
        "hostNetwork",
        "nodeSelector",
        "ports",
        "nvidia.com/gpu",
        "replicas None, expected 1",
        "strategy is not Recreate",
        "automountServiceAccountToken is not false",
        "default service account",
        "mounts 0 node Secrets",
    ):
        assert expected in worker


def example_worker() -> Doc:
    return copy.deepcopy(by_kind_name(k8s_docs(), "Deployment", f"{WORKER_PREFIX}{EXAMPLE_NODE}"))


def test_node_credential_check_rejects_foreign_and_misplaced_secrets() -> None:
    worker = example_worker()
    spec = worker["spec"]["template"]["spec"]
    spec["nodeSelector"][HOSTNAME_LABEL] = "node-b"
    spec["containers"][0]["envFrom"] = [{"secretRef": {"name": "gantry-operator-token"}}]
    args = spec["containers"][0]["args"]
    args[args.index("--credential-file") + 1] = "/run/secrets/node/node-a"
    problems = " | ".join(node_credential_problems(worker))
    for expected in (
        "pinned to 'node-b' but mounts gantry-node-node-a",
        "can read Secret gantry-operator-token",
        "--credential-file /run/secrets/node/node-a is not the credential key",
    ):
        assert expected in problems
    worker["metadata"]["name"] = "gantry-worker-node-b"
    assert "the Secret of another node" in " | ".join(node_credential_problems(worker))
    # The old layout: one Secret with every node's credential is not a node Secret of its own.
    spec["volumes"].append({"name": "all", "secret": {"secretName": "gantry-node-credentials"}})
    assert "mounts 2 node Secrets" in " | ".join(node_credential_problems(worker))


def test_sharing_check_rejects_a_copied_worker_and_a_reader_in_the_control_plane() -> None:
    docs = k8s_docs()
    copied = example_worker()
    copied["metadata"]["name"] = "gantry-worker-node-a-copy"
    controlplane = by_kind_name(docs, "Deployment", "gantry-controlplane")
    cp_spec = controlplane["spec"]["template"]["spec"]
    cp_spec["volumes"].append({"name": "n", "secret": {"secretName": "gantry-node-node-a"}})
    worker_spec = copied["spec"]["template"]["spec"]
    worker_spec["volumes"].append({"name": "p", "secret": {"secretName": "gantry-postgres"}})
    problems = " | ".join(node_secret_sharing_problems([*docs, ("copy.yaml", copied)]))
    for expected in (
        "gantry-node-node-a is mounted by ['gantry-controlplane', 'gantry-worker-node-a', "
        "'gantry-worker-node-a-copy']",
        "all run on node node-a",
        "gantry-worker-node-a-copy mounts gantry-postgres, a Secret of gantry-controlplane",
        "gantry-controlplane mounts node Secret gantry-node-node-a",
    ):
        assert expected in problems


def test_api_access_check_rejects_tokens_and_bindings() -> None:
    docs = k8s_docs()
    account = by_kind_name(docs, "ServiceAccount", "gantry-worker")
    account["automountServiceAccountToken"] = True
    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "read-secrets", "namespace": "gantry"},
        "subjects": [{"kind": "ServiceAccount", "name": "gantry-worker", "namespace": "gantry"}],
        "roleRef": {"kind": "Role", "name": "secret-reader"},
    }
    worker = by_kind_name(docs, "Deployment", f"{WORKER_PREFIX}{EXAMPLE_NODE}")
    del worker["spec"]["template"]["spec"]["automountServiceAccountToken"]
    problems = " | ".join(api_access_problems([*docs, ("rbac.yaml", binding)]))
    for expected in (
        "gantry-worker-node-a: automountServiceAccountToken is not false",
        "ServiceAccount/gantry-worker: automountServiceAccountToken is not false",
        "RoleBinding/read-secrets grants gantry-worker",
    ):
        assert expected in problems
    worker["spec"]["template"]["spec"]["serviceAccountName"] = "ghost"
    assert "service account ghost is not in the manifests" in " | ".join(api_access_problems(docs))
