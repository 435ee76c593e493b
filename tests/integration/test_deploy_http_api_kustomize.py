"""deploy/'s kustomizations render with the control plane's OpenAI-compatible HTTP API served.

Where kubectl is installed, `kubectl kustomize` renders each kustomization and the rendered
documents pass the same check as the files do (tests/unit/test_deploy_http_api.py): kept here
because it runs kubectl, a process, which the unit suite's guard refuses.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.unit.deploy_manifests_support import DEPLOY, Docs
from tests.unit.test_deploy_http_api import k8s_http_api_problems


def _kustomize(directory: str) -> Docs:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        ["kubectl", "kustomize", directory],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=DEPLOY,
    )
    assert done.returncode == 0, done.stderr
    return [("rendered", d) for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize("directory", ["k8s", "k8s-gpu"])
def test_kubectl_kustomize_renders_the_http_api(directory: str) -> None:
    rendered = _kustomize(directory)
    assert k8s_http_api_problems(rendered) == []
