"""deploy/ runs on a CPU-only host; the NVIDIA GPU request is an overlay, for compose and for k8s.

The files are parsed and the overlays applied here by a small merge (compose's merge of mappings,
kustomize's strategic merge with containers keyed by name); where `docker compose` or `kubectl`
is installed, tests/integration/test_deploy_gpu_overlays_render.py has the real tools render them.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from tests.unit.deploy_manifests_support import (
    COMPOSE,
    DEPLOY,
    k8s_docs,
    load_compose,
    pod_spec,
    worker_workloads,
)
from tests.unit.test_deploy_k8s_workers import gpu_limits, worker_problems

COMPOSE_GPU = DEPLOY / "compose.gpu.yaml"
K8S_GPU = DEPLOY / "k8s-gpu"
WORKER_SELECTOR = ("app.kubernetes.io/component", "worker")


def merge(base: Any, patch: Any) -> Any:
    """Mappings merge key by key; a list of named mappings (containers) merges by name; any
    other value in the patch replaces the base's (as compose and strategic merge do here)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    named = isinstance(base, list) and isinstance(patch, list)
    if named and all(isinstance(i, dict) and "name" in i for i in [*base, *patch]):
        by_name = {item["name"]: item for item in base}
        extra = [copy.deepcopy(p) for p in patch if p["name"] not in by_name]
        return [
            merge(item, next((p for p in patch if p["name"] == item["name"]), {})) for item in base
        ] + extra
    return copy.deepcopy(patch)


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = ((service.get("deploy") or {}).get("resources") or {}).get("reservations")
    return [
        d
        for d in (reservations or {}).get("devices") or []
        if d.get("driver") == "nvidia" or "gpu" in (d.get("capabilities") or [])
    ]


def test_compose_default_requests_no_gpu() -> None:
    services = load_compose()["services"]
    for name, service in services.items():
        assert gpu_devices(service) == [], f"{name} requests a GPU in {COMPOSE.name}"


def test_compose_gpu_overlay_adds_the_request_to_the_worker_only() -> None:
    overlay = yaml.safe_load(COMPOSE_GPU.read_text())
    assert set(overlay) == {"services"}
    assert set(overlay["services"]) == {"worker"}
    merged = merge(load_compose(), overlay)
    (device,) = gpu_devices(merged["services"]["worker"])
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    # The overlay adds and keeps: the worker's hardening and credential survive the merge.
    worker = merged["services"]["worker"]
    assert worker["read_only"] is True
    assert worker["user"] == load_compose()["services"]["worker"]["user"]
    others = {n: gpu_devices(s) for n, s in merged["services"].items() if n != "worker"}
    assert others == {n: [] for n in others}


def test_the_merge_can_fail() -> None:
    """The checks above see a GPU request left in the default, and a patch that replaces."""
    compose = load_compose()
    compose["services"]["worker"]["deploy"] = yaml.safe_load(COMPOSE_GPU.read_text())["services"][
        "worker"
    ]["deploy"]
    assert gpu_devices(compose["services"]["worker"])
    assert merge({"a": [{"name": "w", "x": 1}]}, {"a": [{"name": "w", "y": 2}]}) == {
        "a": [{"name": "w", "x": 1, "y": 2}]
    }


def _kustomize_overlay() -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    kustomization = yaml.safe_load((K8S_GPU / "kustomization.yaml").read_text())
    (patch_ref,) = kustomization["patches"]
    patch = yaml.safe_load((K8S_GPU / patch_ref["path"]).read_text())
    return kustomization["resources"], patch_ref["target"], patch


def test_k8s_base_workers_are_cpu_only() -> None:
    workers = worker_workloads(k8s_docs())
    assert workers
    for worker in workers:
        assert gpu_limits(worker) == []
        assert worker_problems(worker) == []
        spec = pod_spec(worker) or {}
        assert "nvidia.com/gpu.present" not in (spec.get("nodeSelector") or {})


def test_k8s_gpu_overlay_patches_every_worker() -> None:
    resources, target, patch = _kustomize_overlay()
    assert resources == ["../k8s"]
    assert target["kind"] == "Deployment"
    key, value = WORKER_SELECTOR
    assert target["labelSelector"] == f"{key}={value}"
    workers = worker_workloads(k8s_docs())
    for worker in workers:
        # The selector reaches every worker, so a worker-<node>.yaml added later is patched too.
        assert worker["metadata"]["labels"][key] == value
        patched = merge(worker, {"spec": patch["spec"]})
        assert worker_problems(patched, gpu=True) == []
        assert gpu_limits(patched) == [1]
        spec = pod_spec(patched) or {}
        assert (
            spec["nodeSelector"]["kubernetes.io/hostname"]
            == (pod_spec(worker) or {})["nodeSelector"]["kubernetes.io/hostname"]
        )
        assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations") or [])
    # Without the overlay the GPU check fails: the check can fail.
    assert "no nvidia.com/gpu limit" in " | ".join(worker_problems(workers[0], gpu=True))
