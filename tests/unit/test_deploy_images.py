"""Static checks on deploy/images: hardened multi-stage Dockerfiles, ML stack only in the worker.

Dockerfiles are parsed, not built (no Docker engine here). Each check returns a list of problems;
the last tests feed deliberately bad Dockerfiles to show that the checks can fail. Each image's
protoc step is run in tests/integration/test_deploy_images_protoc.py.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.deploy_manifests_support import (
    APP_UID,
    GRPC_PORTS,
    IMAGES,
    NO_ML_SERVICES,
    REPO,
    SERVICES,
    Problems,
    user_is_root,
)

ML_NAMES = frozenset({"torch", "transformers", "sentence-transformers"})


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs; comments dropped, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops comment lines, even inside a continuation
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    if pending.strip():
        keyword, _, args = pending.strip().partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    return instructions


def dockerfile_stages(text: str) -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """Global ARG defaults and the instructions of each stage (each starts with its FROM)."""
    global_args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in parse_dockerfile(text):
        if keyword == "FROM":
            stages.append([(keyword, args)])
        elif stages:
            stages[-1].append((keyword, args))
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            global_args[name.strip()] = default.strip().strip("\"'")
    return global_args, stages


def expand(value: str, variables: dict[str, str]) -> str:
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)",
        lambda m: variables.get(m.group(1) or m.group(2), m.group(0)),
        value,
    )


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage:
        if keyword != "ENV":
            continue
        tokens = shlex.split(args)
        if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            env[key] = value
    return env


def install_segments(run_args: str) -> Iterator[list[str]]:
    """Argument lists of the `pip install` commands inside one RUN."""
    for segment in re.split(r"&&|\|\||;|\n", run_args):
        try:
            tokens = shlex.split(segment)
        except ValueError:
            tokens = segment.split()
        for i, token in enumerate(tokens[:-1]):
            if re.search(r"(^|/)(pip3?|uv)$", token) or token == "pip":
                rest = tokens[i + 1 :]
                if rest and rest[0] == "pip":  # `uv pip install`
                    rest = rest[1:]
                if rest and rest[0] == "install":
                    yield rest[1:]
                break


def requirement_name(token: str) -> str:
    return re.split(r"[\[<>=!~;@ ]", token, maxsplit=1)[0].lower().replace("_", "-")


def is_ml_requirement(requirement: str) -> bool:
    name = requirement_name(requirement.strip())
    return name in ML_NAMES or name.startswith("nvidia")


def local_project(token: str) -> tuple[Path, list[str]] | None:
    """`./services/worker[ml]` -> (repo path, extras) when the token names a repo project."""
    project = r"(?:libs|cli|services/[\w-]+)"
    match = re.fullmatch(rf"(?:\./|/src/)?({project}/?)(?:\[([\w,\s-]+)\])?", token)
    if not match:
        return None
    extras = [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]
    return REPO / match.group(1).rstrip("/"), extras


def project_requirements(path: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    requirements = list(project.get("dependencies", []))
    for extra in extras:
        requirements += project.get("optional-dependencies", {}).get(extra, [])
    return requirements


def ml_installs(text: str) -> Problems:
    """Everything in a Dockerfile's pip installs that is, or pulls in, the ML stack."""
    problems: Problems = []
    for keyword, args in parse_dockerfile(text):
        if keyword != "RUN":
            continue
        for install_args in install_segments(args):
            tokens = iter(install_args)
            for token in tokens:
                if token in ("-r", "--requirement", "-c", "--constraint"):
                    req_file = REPO / re.sub(r"^(\./|/src/)", "", next(tokens, ""))
                    if not req_file.is_file():
                        problems.append(f"installs from unverifiable requirements file {token}")
                        continue
                    lines = [ln.split("#")[0].strip() for ln in req_file.read_text().splitlines()]
                    problems += [
                        f"{req_file.name} pulls {ln}"
                        for ln in lines
                        if ln and is_ml_requirement(ln)
                    ]
                    continue
                if token.startswith("-"):
                    continue
                project = local_project(token)
                if project is not None:
                    path, extras = project
                    if path.name == "worker":
                        problems.append(f"installs the worker package: {token}")
                    if (path / "pyproject.toml").is_file():
                        problems += [
                            f"{token} depends on {req}"
                            for req in project_requirements(path, extras)
                            if is_ml_requirement(req)
                        ]
                elif is_ml_requirement(token):
                    problems.append(f"installs {token}")
    return problems


def dockerfile_problems(text: str, service: str) -> Problems:
    problems: Problems = []
    global_args, stages = dockerfile_stages(text)
    if len(stages) < 2:
        problems.append("not multi-stage")
    if not stages:
        return [*problems, "no FROM"]
    stage_names = {args.split()[-1] for _, args in (s[0] for s in stages) if " as " in args.lower()}
    for stage in stages:
        base = expand(stage[0][1].split()[0], global_args)
        if base not in stage_names and base != "python:3.11-slim":
            problems.append(f"base image {base!r} is not python:3.11-slim")
    final = stages[-1]
    users = [args for keyword, args in final if keyword == "USER"]
    if not users:
        problems.append("final stage has no USER (would run as root)")
    elif user_is_root(users[-1]):
        problems.append(f"final USER is root: {users[-1]!r}")
    elif users[-1].split(":", 1)[0] != str(APP_UID):
        problems.append(f"final USER is {users[-1]!r}, expected uid {APP_UID}")
    runs = " ".join(args for stage in stages for keyword, args in stage if keyword == "RUN")
    if "grpc_tools.protoc" not in runs or "proto/gantry/v1/*.proto" not in runs:
        problems.append("does not generate the gRPC stubs at build time")
    exposes = [args for stage in stages for keyword, args in stage if keyword == "EXPOSE"]
    healthchecks = [args for keyword, args in final if keyword == "HEALTHCHECK"]
    if service == "worker":
        if exposes:
            problems.append(f"worker image EXPOSEs {exposes}")
        env = env_of(final)
        for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            if env.get(key) != "1":
                problems.append(f"worker image lacks ENV {key}=1")
    else:
        problems += [f"{service} image: {p}" for p in ml_installs(text)]
        if str(GRPC_PORTS[service]) not in " ".join(exposes):
            problems.append(f"{service} image does not EXPOSE {GRPC_PORTS[service]}")
        if not any("grpc_health" in hc and "CMD" in hc for hc in healthchecks):
            problems.append(f"{service} image has no grpc_health HEALTHCHECK")
    return problems


def dockerfile_path(service: str) -> Path:
    return IMAGES / f"{service}.Dockerfile"


@pytest.mark.parametrize("service", SERVICES)
def test_dockerfile_is_hardened(service: str) -> None:
    assert dockerfile_problems(dockerfile_path(service).read_text(), service) == []


@pytest.mark.parametrize("service", NO_ML_SERVICES)
def test_control_plane_and_scheduler_images_install_no_ml_stack(service: str) -> None:
    text = dockerfile_path(service).read_text()
    installs = [
        tok for _, args in parse_dockerfile(text) for seg in install_segments(args) for tok in seg
    ]
    assert f"./services/{service}" in installs, "the service itself must be installed"
    assert ml_installs(text) == []
    assert "services/worker" not in text


def test_worker_image_installs_the_ml_extra_with_pinned_torch() -> None:
    text = dockerfile_path("worker").read_text()
    installs = [
        tok for _, args in parse_dockerfile(text) for seg in install_segments(args) for tok in seg
    ]
    assert "./services/worker[ml]" in installs
    assert "torch==2.13.0" in installs
    assert not [t for t in installs if requirement_name(t) == "torch" and t != "torch==2.13.0"]
    assert "download.pytorch.org/whl/cpu" in text, "the CPU wheel index is documented"
    assert not [args for keyword, args in parse_dockerfile(text) if keyword == "EXPOSE"]


@pytest.mark.parametrize("service", SERVICES)
def test_dockerignore_keeps_local_stubs_and_venv_out(service: str) -> None:
    ignore = (IMAGES / f"{service}.Dockerfile.dockerignore").read_text().splitlines()
    rules = [ln for ln in ignore if ln and not ln.startswith("#")]
    assert rules[0] == "*", "allow-list: exclude everything first"
    assert f"!services/{service}/" in rules
    assert [ln for ln in rules if ln.startswith("!services/")] == [f"!services/{service}/"]
    assert {"**/*.egg-info", "libs/gantry/v1/*_pb2.py", "libs/gantry/v1/*_pb2_grpc.py"} <= set(
        rules
    )


# The checks themselves: each must reject a bad input.

BAD_DOCKERFILE = """\
FROM python:3.11-slim
RUN pip install -U "torch==2.13.0" ./services/worker nvidia-ml-py \\
 && pip install transformers
EXPOSE 50051
USER root
"""


def test_dockerfile_check_rejects_a_bad_image() -> None:
    problems = " | ".join(dockerfile_problems(BAD_DOCKERFILE, "controlplane"))
    for expected in (
        "not multi-stage",
        "final USER is root",
        "installs torch==2.13.0",
        "installs the worker package",
        "installs nvidia-ml-py",
        "installs transformers",
        "does not generate the gRPC stubs",
        "no grpc_health HEALTHCHECK",
    ):
        assert expected in problems
    worker = " | ".join(dockerfile_problems(BAD_DOCKERFILE.replace("USER root", ""), "worker"))
    for expected in ("EXPOSEs", "no USER", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        assert expected in worker


def test_ml_check_follows_requirement_files_and_extras() -> None:
    assert ml_installs("FROM x\nRUN pip install -r requirements-dev.txt\n")
    assert ml_installs("FROM x\nRUN uv pip install './services/worker[ml]'\n")
    assert ml_installs("FROM x\nRUN pip install sentence_transformers\n")
    assert not ml_installs("FROM x\nRUN pip install ./libs ./services/scheduler grpcio\n")
