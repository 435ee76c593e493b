"""Static checks on the Kubernetes workers' probes: `gantry worker --check` on the heartbeat file
the worker itself writes, under the one writable path, and nothing that needs a listening port."""

from __future__ import annotations

import pytest

from tests.unit.deploy_manifests_support import (
    Doc,
    Problems,
    k8s_docs,
    option_value,
    pod_spec,
    worker_workloads,
)

WRITABLE = "/tmp/"


def probe_problems(doc: Doc) -> Problems:
    problems: Problems = []
    name = doc["metadata"]["name"]
    for container in (pod_spec(doc) or {}).get("containers") or []:
        heartbeat = option_value(container.get("args") or [], "--heartbeat-file")
        if heartbeat is None or not heartbeat.startswith(WRITABLE):
            problems.append(f"{name}: --heartbeat-file {heartbeat} is not under {WRITABLE}")
        for kind in ("startupProbe", "livenessProbe"):
            command = ((container.get(kind) or {}).get("exec") or {}).get("command") or []
            if command[:3] != ["gantry", "worker", "--check"]:
                problems.append(f"{name}: {kind} is not `gantry worker --check`: {command}")
            elif option_value(command, "--heartbeat-file") != heartbeat:
                problems.append(f"{name}: {kind} reads another heartbeat file than the worker's")
            if (container.get(kind) or {}).get("timeoutSeconds", 1) < 5:
                problems.append(f"{name}: {kind} gives a Python start under 5 s")
    return problems


@pytest.mark.parametrize("doc", worker_workloads(k8s_docs()), ids=lambda d: d["metadata"]["name"])
def test_each_worker_is_probed_by_gantry_worker_check_on_its_own_heartbeat_file(doc: Doc) -> None:
    assert probe_problems(doc) == []


def test_a_probe_reading_another_file_is_caught() -> None:
    (doc, *_) = worker_workloads(k8s_docs())
    container = pod_spec(doc)["containers"][0]  # type: ignore[index]
    container["livenessProbe"]["exec"]["command"][-1] = "/tmp/elsewhere"
    assert probe_problems(doc) == [
        f"{doc['metadata']['name']}: livenessProbe reads another heartbeat file than the worker's"
    ]
