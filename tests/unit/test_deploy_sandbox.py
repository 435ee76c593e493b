"""Every shipped worker requires the whole model host sandbox, and its container can apply it.

The worker's own flag parser reads each manifest's command line (compose, its GPU overlay,
every Kubernetes worker and the k8s-gpu patch over it, the image's default command), so a flag the
worker would not accept fails here as it would fail there. A container that could not enter the
sandbox (privileged, or seccomp unconfined) is a problem too; what the kernel and the runtime must
offer is written in deploy/README.md, "The model host sandbox". What a worker does when a host
falls short is `sandbox.shortfall`'s, checked last against the level the manifests require.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gantry.worker import settings as worker_settings
from gantry.worker.model_host import sandbox
from gantry.worker.model_host.landlock import Isolation, IsolationLevel
from gantry.worker.model_host.sandbox import REQUIRE_CHOICES, IsolationRequirement
from tests.unit.deploy_manifests_support import (
    IMAGES,
    README,
    Problems,
    all_containers,
    k8s_docs,
    load_compose,
    pod_spec,
    worker_workloads,
)
from tests.unit.test_deploy_gpu_overlays import COMPOSE_GPU, K8S_GPU, merge

# The whole sandbox: Landlock's filesystem and TCP rules, and the seccomp socket filter.
REQUIRED = "fs-net-seccomp"
FULL = IsolationRequirement(level=IsolationLevel.LANDLOCK_FS_NET, seccomp_net=True)
UNCONFINED = re.compile(r"seccomp[=:]unconfined", re.I)


def required_isolation(argv: list[Any]) -> tuple[IsolationRequirement | None, str]:
    """What `gantry worker ARGS` would require of its model hosts, read by the worker's own flag
    parser (which reads no file); (None, why) when the worker would refuse the command line."""
    words = [str(word) for word in argv]
    if words[:1] != ["worker"]:
        return None, f"not a worker command: {words[:1]}"
    try:
        flags = worker_settings.build_parser().parse_args(words[1:])
    except SystemExit as exit_:
        return None, f"the worker refuses its arguments (exit {exit_.code})"
    return REQUIRE_CHOICES[flags.require_isolation], flags.require_isolation


def requirement_problems(argv: list[Any]) -> Problems:
    requirement, said = required_isolation(argv)
    if requirement is None:
        return [said]
    if requirement != FULL:
        return [f"--require-isolation is {said!r}, not {REQUIRED!r}: a host may load unsandboxed"]
    return []


def compose_container_problems(service: dict[str, Any]) -> Problems:
    """A compose service that could not apply the sandbox: privileged, or seccomp off."""
    problems = []
    if service.get("privileged"):
        problems.append("privileged")
    problems += [
        f"security_opt {o!r}" for o in service.get("security_opt") or [] if UNCONFINED.search(o)
    ]
    return problems


def k8s_container_problems(spec: dict[str, Any], container: dict[str, Any]) -> Problems:
    """A pod container that could not apply the sandbox: privileged, or a seccomp profile that is
    not the runtime's default (which allows the Landlock calls) or a node-local one."""
    context = container.get("securityContext") or {}
    profile = context.get("seccompProfile") or (spec.get("securityContext") or {}).get(
        "seccompProfile"
    )
    problems = ["privileged"] if context.get("privileged") else []
    kind = (profile or {}).get("type")
    if kind not in ("RuntimeDefault", "Localhost"):
        problems.append(f"seccompProfile {kind!r}, not RuntimeDefault")
    return problems


def _compose_worker(gpu: bool) -> dict[str, Any]:
    compose = load_compose()
    if gpu:
        compose = merge(compose, yaml.safe_load(COMPOSE_GPU.read_text()))
    return compose["services"]["worker"]


def _k8s_workers(gpu: bool) -> list[dict[str, Any]]:
    workers = worker_workloads(k8s_docs())
    if not gpu:
        return workers
    kustomization = yaml.safe_load((K8S_GPU / "kustomization.yaml").read_text())
    (patch_ref,) = kustomization["patches"]
    patch = yaml.safe_load((K8S_GPU / patch_ref["path"]).read_text())
    return [merge(worker, {"spec": patch["spec"]}) for worker in workers]


def _image_command() -> list[str]:
    text = (IMAGES / "worker.Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.M)
    return json.loads(cmd)


@pytest.mark.parametrize("gpu", [False, True], ids=["compose", "compose+gpu"])
def test_the_compose_worker_requires_the_whole_sandbox_and_can_apply_it(gpu: bool) -> None:
    worker = _compose_worker(gpu)
    assert requirement_problems(worker["command"]) == []
    assert compose_container_problems(worker) == []


@pytest.mark.parametrize("gpu", [False, True], ids=["k8s", "k8s-gpu"])
def test_every_k8s_worker_requires_the_whole_sandbox_and_can_apply_it(gpu: bool) -> None:
    workers = _k8s_workers(gpu)
    assert workers
    for worker in workers:
        spec = pod_spec(worker) or {}
        for container in all_containers(spec):
            assert requirement_problems(container.get("args") or []) == []
            assert k8s_container_problems(spec, container) == []


def test_the_worker_images_default_command_requires_the_whole_sandbox() -> None:
    assert requirement_problems(_image_command()) == []


def test_the_readme_says_what_a_node_needs_for_the_sandbox() -> None:
    text = README.read_text()
    assert "## The model host sandbox" in text
    for needed in (f"--require-isolation\n{REQUIRED}", "Linux 6.7", "/sys/kernel/security/lsm"):
        assert needed.replace("\n", " ") in text.replace("\n", " "), needed


def test_the_checks_can_fail() -> None:
    base = _compose_worker(gpu=False)["command"]
    without = [w for w in base if w not in ("--require-isolation", REQUIRED)]
    assert "'none'" in " ".join(requirement_problems(without))  # the worker's default
    weaker = [*without, "--require-isolation", "fs-net"]
    assert "'fs-net'" in " ".join(requirement_problems(weaker))
    misspelt = [*without, "--require-isolation", "fs+net+seccomp"]
    assert "refuses its arguments" in " ".join(requirement_problems(misspelt))
    assert compose_container_problems({"security_opt": ["seccomp=unconfined"], "privileged": True})
    spec = {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}
    assert k8s_container_problems(spec, {"securityContext": {"privileged": True}}) == [
        "privileged",
        "seccompProfile 'Unconfined', not RuntimeDefault",
    ]


@pytest.mark.parametrize(
    ("reached", "said"),
    [
        (
            Isolation(
                level=IsolationLevel.NONE,
                seccomp_net=True,
                reason="Landlock unavailable: landlock_create_ruleset(...) failed: errno 38 ENOSYS",
            ),
            "reached only NONE+SECCOMP_NET: Landlock unavailable",
        ),
        (
            Isolation(
                level=IsolationLevel.LANDLOCK_FS,
                seccomp_net=True,
                reason="Landlock ABI 3: filesystem allow-list only (TCP rules need ABI 4; ...)",
            ),
            "reached only LANDLOCK_FS+SECCOMP_NET: Landlock ABI 3",
        ),
        (
            Isolation(
                level=IsolationLevel.LANDLOCK_FS_NET,
                reason="Landlock ABI 6: ...; seccomp socket filter not installed: errno 1 EPERM",
            ),
            "reached only LANDLOCK_FS_NET: Landlock ABI 6",
        ),
    ],
)
def test_a_host_short_of_the_shipped_requirement_is_refused_naming_why(
    reached: Isolation, said: str
) -> None:
    refusal = sandbox.shortfall(REQUIRE_CHOICES[REQUIRED], reached, deployment_id="dep-1")
    assert refusal is not None and refusal.reason == "RUNTIME_ENVIRONMENT_UNAVAILABLE"
    assert "requires model host isolation LANDLOCK_FS_NET+SECCOMP_NET but" in refusal.message
    assert said in refusal.message and reached.reason in refusal.message
    assert refusal.metadata == {
        "required_isolation": "LANDLOCK_FS_NET+SECCOMP_NET",
        "isolation": reached.wire,
        "deployment_id": "dep-1",
    }
    full = Isolation(level=IsolationLevel.LANDLOCK_FS_NET, seccomp_net=True, reason="all")
    assert sandbox.shortfall(REQUIRE_CHOICES[REQUIRED], full) is None
