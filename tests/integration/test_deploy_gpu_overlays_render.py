"""The GPU overlays rendered by the real tools, where installed: `kubectl kustomize` and
`docker compose config` give a CPU-only default and a GPU request on the worker only.

The overlays are merged and checked statically in tests/unit/test_deploy_gpu_overlays.py; these run
the tools, processes, which the unit guard refuses.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.unit.deploy_manifests_support import (
    DEPLOY,
    Doc,
    worker_workloads,
)
from tests.unit.test_deploy_gpu_overlays import gpu_devices
from tests.unit.test_deploy_k8s_workers import gpu_limits, worker_problems


def _tool(*argv: str) -> subprocess.CompletedProcess[str] | None:
    if shutil.which(argv[0]) is None:
        return None
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=DEPLOY)


def _rendered_workers(directory: str) -> list[Doc]:
    done = _tool("kubectl", "kustomize", directory)
    if done is None:
        pytest.skip("kubectl is not installed")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    return worker_workloads([("rendered", d) for d in docs])


def test_kubectl_kustomize_renders_cpu_base_and_gpu_overlay() -> None:
    base = _rendered_workers("k8s")
    overlay = _rendered_workers("k8s-gpu")
    assert base and len(base) == len(overlay)
    assert all(gpu_limits(w) == [] for w in base)
    assert all(gpu_limits(w) == [1] for w in overlay)
    assert all(worker_problems(w, gpu=True) == [] for w in overlay)


def test_docker_compose_config_renders_cpu_default_and_gpu_overlay() -> None:
    version = _tool("docker", "compose", "version")
    if version is None or version.returncode != 0:
        pytest.skip("docker compose is not installed")
    # `config` parses, merges and validates without an engine.
    default = _tool("docker", "compose", "-f", "compose.yaml", "config", "--no-interpolate")
    gpu = _tool("docker", "compose", "-f", "compose.yaml", "-f", "compose.gpu.yaml", "config")
    assert default is not None and gpu is not None
    assert default.returncode == 0, default.stderr
    assert gpu.returncode == 0, gpu.stderr
    assert gpu_devices(yaml.safe_load(default.stdout)["services"]["worker"]) == []
    assert gpu_devices(yaml.safe_load(gpu.stdout)["services"]["worker"])
