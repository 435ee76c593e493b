"""Static checks on deploy/: Dockerfiles, compose.yaml and the Kubernetes manifests.

No Docker engine or cluster is needed: the files are parsed and their security properties are
asserted (ARCHITECTURE.md, "Security" and "Scale-out"). Each check returns a list of problems;
the last tests feed deliberately bad inputs to show that the checks can fail.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
IMAGES = DEPLOY / "images"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"

SERVICES = ("controlplane", "scheduler", "worker")
NO_ML_SERVICES = ("controlplane", "scheduler")
GRPC_PORTS = {"controlplane": 50051, "scheduler": 50052}
# The gRPC ports are TLS, which the kubelet's gRPC probe cannot speak: each server also answers
# plaintext grpc.health.v1 (and nothing else) on its health port (`--health-listen`).
HEALTH_PORTS = {"controlplane": 50061, "scheduler": 50062}
ML_NAMES = frozenset({"torch", "transformers", "sentence-transformers"})
APP_UID = 10001
# A password written into a URL (`scheme://user:password@host`): never in a manifest.
URL_CREDENTIALS = re.compile(r"://[^/@:\s]+:[^/@\s]+@")
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|CREDENTIAL")
POD_KINDS = {"Pod", "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}

Problems = list[str]


# ---------------------------------------------------------------------------------------------
# Dockerfiles
# ---------------------------------------------------------------------------------------------


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


def user_is_root(user: str) -> bool:
    name = user.split(":", 1)[0].strip()
    return name in ("", "root", "0")


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
    match = re.fullmatch(r"(?:\./|/src/)?((?:libs|services/[\w-]+)/?)(?:\[([\w,\s-]+)\])?", token)
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


# ---------------------------------------------------------------------------------------------
# docker compose
# ---------------------------------------------------------------------------------------------


def tmpfs_paths(value: Any) -> list[str]:
    entries = [value] if isinstance(value, str) else list(value or [])
    return [str(entry).split(":", 1)[0] for entry in entries]


def compose_service_problems(name: str, service: dict[str, Any]) -> Problems:
    problems: Problems = []
    user = str(service.get("user", ""))
    if user_is_root(user):
        problems.append(f"{name}: user {user!r} is root or unset")
    if service.get("read_only") is not True:
        problems.append(f"{name}: read_only is not true")
    if "ALL" not in (service.get("cap_drop") or []):
        problems.append(f"{name}: cap_drop lacks ALL")
    if service.get("cap_add"):
        problems.append(f"{name}: cap_add {service['cap_add']}")
    security_opt = [str(o).replace("=", ":") for o in service.get("security_opt") or []]
    if not {"no-new-privileges", "no-new-privileges:true"} & set(security_opt):
        problems.append(f"{name}: security_opt lacks no-new-privileges")
    if "/tmp" not in tmpfs_paths(service.get("tmpfs")):
        problems.append(f"{name}: no tmpfs /tmp")
    if service.get("privileged"):
        problems.append(f"{name}: privileged")
    for key in ("network_mode", "pid", "ipc", "userns_mode"):
        if service.get(key) == "host":
            problems.append(f"{name}: {key}: host")
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(str(e).partition("=")[::2] for e in environment)
    for key, value in environment.items():
        if SECRET_NAME.search(key) and not key.endswith("_FILE"):
            problems.append(f"{name}: secret in environment {key}={value!r}")
    for key in ("entrypoint", "command"):
        value = service.get(key) or []
        tokens = [value] if isinstance(value, str) else [str(v) for v in value]
        if any(URL_CREDENTIALS.search(token) for token in tokens):
            problems.append(f"{name}: password in {key}")
    if name == "worker":
        for key in ("ports", "expose"):
            if service.get(key):
                problems.append(f"worker: {key} {service[key]}")
    return problems


def secret_sources(service: dict[str, Any]) -> list[str]:
    return [s if isinstance(s, str) else s.get("source") for s in service.get("secrets") or []]


def dependencies(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """depends_on in its long form (the short list form means `service_started`)."""
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {name: {"condition": "service_started"} for name in value}
    return {name: dict(spec or {}) for name, spec in value.items()}


def compose_problems(doc: dict[str, Any]) -> Problems:
    problems: Problems = []
    services = doc.get("services") or {}
    for missing in sorted({"postgres", "migrate", *SERVICES} - set(services)):
        problems.append(f"service {missing} missing")
    declared = set(doc.get("secrets") or {})
    networks = set(doc.get("networks") or {})
    for name, service in services.items():
        problems += compose_service_problems(name, service)
        for source in secret_sources(service):
            if source not in declared:
                problems.append(f"{name}: secret {source} is not declared")
        for network in service.get("networks") or []:
            if network not in networks:
                problems.append(f"{name}: network {network} is not declared")
        for dependency in dependencies(service):
            if dependency not in services:
                problems.append(f"{name}: depends on unknown service {dependency}")
    for name, secret in (doc.get("secrets") or {}).items():
        if "file" not in secret:
            problems.append(f"secret {name} is not file based")
    return problems


def option_value(args: list[Any], option: str) -> str | None:
    """The value after `option` in an argument list (or `option=value`), else None."""
    tokens = [str(a) for a in args]
    for i, token in enumerate(tokens):
        if token == option and i + 1 < len(tokens):
            return tokens[i + 1]
        if token.startswith(f"{option}="):
            return token.partition("=")[2]
    return None


def compose_migrate_problems(doc: dict[str, Any]) -> Problems:
    """`migrate` is a one-shot run of the control plane image that gates the control plane."""
    services = doc.get("services") or {}
    migrate, controlplane = services.get("migrate"), services.get("controlplane")
    if migrate is None or controlplane is None:
        return ["migrate or controlplane service missing"]
    problems: Problems = []
    command = [str(c) for c in migrate.get("command") or []]
    if command[:1] != ["migrate"]:
        problems.append(f"migrate: command {command} does not run `gantry migrate`")
    if migrate.get("image") != controlplane.get("image"):
        problems.append("migrate: not the control plane image")
    if migrate.get("pull_policy") not in ("never", "build") and "build" not in migrate:
        problems.append("migrate: the control plane image would be pulled, not built")
    url = option_value(command, "--database-url")
    if url is None or url != option_value(controlplane.get("command") or [], "--database-url"):
        problems.append(f"migrate: --database-url {url!r} differs from the control plane's")
    for key in ("entrypoint", "environment", "env_file", "user"):
        if migrate.get(key) != controlplane.get(key):
            problems.append(f"migrate: {key} differs from the control plane's")
    if "postgres_password" not in secret_sources(migrate):
        problems.append("migrate: no postgres_password secret")
    if not set(secret_sources(migrate)) <= set(secret_sources(controlplane)):
        problems.append("migrate: secrets the control plane does not have")
    if not set(migrate.get("networks") or []) & set(services["postgres"].get("networks") or []):
        problems.append("migrate: shares no network with postgres")
    if str(migrate.get("restart")) != "no":
        problems.append(f"migrate: restart {migrate.get('restart')!r}, expected 'no'")
    for key in ("ports", "expose", "healthcheck"):
        if migrate.get(key):
            problems.append(f"migrate: {key} on a one-shot service")
    if dependencies(migrate).get("postgres", {}).get("condition") != "service_healthy":
        problems.append("migrate: does not wait for a healthy postgres")
    gate = dependencies(controlplane).get("migrate", {})
    if gate.get("condition") != "service_completed_successfully":
        problems.append("controlplane: does not wait for migrate to complete successfully")
    return problems


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def test_compose_services_are_hardened(compose: dict[str, Any]) -> None:
    assert compose_problems(compose) == []


def test_compose_control_plane_starts_after_a_successful_migration(
    compose: dict[str, Any],
) -> None:
    assert compose_migrate_problems(compose) == []
    migrate = compose["services"]["migrate"]
    assert migrate["command"][:2] == ["migrate", "--database-url"]
    assert migrate["restart"] == "no"
    # The password reaches PGPASSWORD from the secret file inside the container, never argv.
    assert "/run/secrets/postgres_password" in " ".join(migrate["entrypoint"])


def test_compose_worker_publishes_nothing_and_mounts_artifacts_read_only(
    compose: dict[str, Any],
) -> None:
    worker = compose["services"]["worker"]
    assert "ports" not in worker and "expose" not in worker
    artifacts = [
        v for v in worker.get("volumes", []) if isinstance(v, dict) and v["target"] == "/artifacts"
    ]
    assert artifacts and artifacts[0].get("read_only") is True
    assert worker["user"].split(":")[0] == str(APP_UID)
    assert all(compose["networks"][n].get("internal") for n in worker["networks"])


def test_compose_gantry_services_use_their_images_and_tokens(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in SERVICES:
        assert services[name]["build"]["dockerfile"] == f"deploy/images/{name}.Dockerfile"
        assert (DEPLOY / services[name]["build"]["context"] / "proto").is_dir()
    controlplane = " ".join(map(str, services["controlplane"]["command"]))
    assert "--scheduler-token-file /run/secrets/scheduler.token" in controlplane
    assert "--bootstrap-operator-token-file /run/secrets/operator.token" in controlplane
    scheduler = " ".join(map(str, services["scheduler"]["command"]))
    assert "--service-token-file /run/secrets/scheduler.token" in scheduler
    assert "--credential-file /run/secrets/node.credential" in " ".join(
        services["worker"]["command"]
    )
    assert (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]


# ---------------------------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------------------------


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
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


def worker_problems(doc: dict[str, Any]) -> Problems:
    problems: Problems = []
    if doc.get("kind") != "DaemonSet":
        problems.append(f"worker is a {doc.get('kind')}, not a DaemonSet")
    spec = pod_spec(doc) or {}
    if spec.get("hostNetwork", False) is not False:
        problems.append("worker: hostNetwork is not false")
    if not spec.get("nodeSelector"):
        problems.append("worker: no nodeSelector for GPU nodes")
    for container in all_containers(spec):
        if container.get("ports"):
            problems.append(f"worker/{container['name']}: ports {container['ports']}")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if any(k in (container.get(probe) or {}) for k in ("grpc", "httpGet", "tcpSocket")):
                problems.append(f"worker/{container['name']}: {probe} implies a listening port")
    limits = [c.get("resources", {}).get("limits", {}) for c in spec.get("containers") or []]
    if not any(int(lim.get("nvidia.com/gpu", 0)) >= 1 for lim in limits):
        problems.append("worker: no nvidia.com/gpu limit")
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
    return problems


def grpc_probe_problems(name: str, doc: dict[str, Any], port: int) -> Problems:
    problems: Problems = []
    containers = (pod_spec(doc) or {}).get("containers") or []
    for probe in ("livenessProbe", "readinessProbe"):
        if not any((c.get(probe) or {}).get("grpc", {}).get("port") == port for c in containers):
            problems.append(f"{name}: no grpc {probe} on {port}")
    return problems


@pytest.fixture(scope="module")
def docs() -> list[tuple[str, dict[str, Any]]]:
    loaded = k8s_docs()
    assert loaded, "no Kubernetes manifests found"
    return loaded


def by_kind_name(docs: list[tuple[str, dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


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


def test_k8s_worker_daemonset(docs: list[tuple[str, dict[str, Any]]]) -> None:
    worker = by_kind_name(docs, "DaemonSet", "gantry-worker")
    assert worker_problems(worker) == []
    assert (pod_spec(worker) or {}).get("hostNetwork") is False
    labels = worker["spec"]["template"]["metadata"]["labels"]
    for _, doc in docs:
        if doc["kind"] == "Service":
            selector = doc["spec"].get("selector") or {}
            assert not selector or not selector.items() <= labels.items(), "a Service hits workers"


@pytest.mark.parametrize("service", NO_ML_SERVICES)
def test_k8s_grpc_services(docs: list[tuple[str, dict[str, Any]]], service: str) -> None:
    port = GRPC_PORTS[service]
    deployment = by_kind_name(docs, "Deployment", f"gantry-{service}")
    assert grpc_probe_problems(service, deployment, HEALTH_PORTS[service]) == []
    svc = by_kind_name(docs, "Service", f"gantry-{service}")
    assert [p["port"] for p in svc["spec"]["ports"]] == [port]
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


def test_k8s_scheduler_is_a_single_recreated_replica(
    docs: list[tuple[str, dict[str, Any]]],
) -> None:
    scheduler = by_kind_name(docs, "Deployment", "gantry-scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"]["type"] == "Recreate"


def test_k8s_references_resolve_and_secrets_are_documented(
    docs: list[tuple[str, dict[str, Any]]],
) -> None:
    defined = {(d["kind"], d["metadata"]["name"]) for _, d in docs}
    readme = (DEPLOY / "README.md").read_text()
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
        for container in all_containers(spec):
            where = f"{doc['metadata']['name']}/{container['name']}"
            assert env_reference_problems(where, container) == []
            for env in container.get("env") or []:
                ref = env.get("valueFrom") or {}
                if "secretKeyRef" in ref:
                    secret_names.add(ref["secretKeyRef"]["name"])
                if "configMapKeyRef" in ref:
                    assert ("ConfigMap", ref["configMapKeyRef"]["name"]) in defined
    assert secret_names, "workloads reference no Secrets"
    undocumented = sorted(s for s in secret_names if f"create secret generic {s}" not in readme)
    assert undocumented == []


def test_kustomization_lists_exactly_the_manifests() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    missing = [r for r in resources if not (K8S / r).is_file()]
    assert missing == []
    unlisted = sorted({p.name for p in k8s_files()} - set(resources))
    assert unlisted == []


# ---------------------------------------------------------------------------------------------
# TLS: every gRPC channel, with certificates and keys mounted from Secrets
# ---------------------------------------------------------------------------------------------

# Per service: the TLS options that must name a file, and whether the server demands mTLS.
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


def compose_tls_problems(doc: dict[str, Any], service: str) -> Problems:
    """Each TLS option names a compose secret mounted into that service."""
    entry = doc["services"][service]
    targets = {
        f"/run/secrets/{s}"
        if isinstance(s, str)
        else f"/run/secrets/{s.get('target', s['source'])}"
        for s in entry.get("secrets") or []
    }
    problems: Problems = []
    for option in TLS_OPTIONS[service]:
        path = option_value(entry.get("command") or [], option)
        if path is None:
            problems.append(f"{service}: no {option}")
        elif path not in targets:
            problems.append(f"{service}: {option} {path} is not one of its secrets")
    return problems


@pytest.mark.parametrize("service", SERVICES)
def test_k8s_channels_use_tls_from_secret_mounts(
    docs: list[tuple[str, dict[str, Any]]], service: str
) -> None:
    kind = "DaemonSet" if service == "worker" else "Deployment"
    assert k8s_tls_problems(service, by_kind_name(docs, kind, f"gantry-{service}")) == []


@pytest.mark.parametrize("service", SERVICES)
def test_compose_channels_use_tls_from_secrets(compose: dict[str, Any], service: str) -> None:
    assert compose_tls_problems(compose, service) == []


def test_compose_health_checks_reach_the_plaintext_health_listener(
    compose: dict[str, Any],
) -> None:
    for service in NO_ML_SERVICES:
        entry = compose["services"][service]
        listen = option_value(entry["command"], "--health-listen")
        assert listen is not None and listen.startswith("127.0.0.1:"), service
        assert entry["environment"]["GANTRY_HEALTH_TARGET"] == listen
    # The comment that once promised a TLS option that did not exist.
    assert "(enable TLS)" not in COMPOSE.read_text()


def test_tls_checks_reject_plaintext_and_certificates_outside_secrets(
    docs: list[tuple[str, dict[str, Any]]], compose: dict[str, Any]
) -> None:
    doc = next(yaml.safe_load_all((K8S / "scheduler.yaml").read_text()))
    container = doc["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    args[args.index("--tls-key") + 1] = "/tmp/tls.key"
    del args[args.index("--tls-client-ca") : args.index("--tls-client-ca") + 2]
    problems = " | ".join(k8s_tls_problems("scheduler", doc))
    assert "no --tls-client-ca" in problems and "/tmp/tls.key is not on a Secret" in problems
    worker = compose["services"]["worker"]
    plaintext = {**compose, "services": {"worker": {**worker, "secrets": ["node_credential"]}}}
    assert "is not one of its secrets" in " | ".join(compose_tls_problems(plaintext, "worker"))


# ---------------------------------------------------------------------------------------------
# The checks themselves: each must reject a bad input.
# ---------------------------------------------------------------------------------------------

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


def test_compose_check_rejects_a_bad_service() -> None:
    bad = {"user": "root", "ports": ["50051:50051"], "environment": {"PGPASSWORD": "x"}}
    problems = " | ".join(compose_service_problems("worker", bad))
    for expected in (
        "is root",
        "read_only",
        "cap_drop",
        "no-new-privileges",
        "tmpfs /tmp",
        "worker: ports",
        "secret in environment",
    ):
        assert expected in problems
    assert compose_problems({"services": {}}) != []
    bad_cmd = {"command": ["controlplane", "--database-url", "postgresql://gantry:hunter2@db/x"]}
    assert "password in command" in " | ".join(compose_service_problems("cp", bad_cmd))


def test_compose_migrate_check_rejects_a_bad_migration() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    services["migrate"].update(
        command=["controlplane", "--database-url", "postgresql+asyncpg://other@db/x"],
        image="gantry/scheduler:0.1.0",
        restart="on-failure",
        secrets=["node_credential"],
        networks=["control"],
        depends_on=["postgres"],
        entrypoint=["gantry"],
    )
    del services["migrate"]["pull_policy"]
    services["controlplane"]["depends_on"]["migrate"] = {"condition": "service_started"}
    problems = " | ".join(compose_migrate_problems(doc))
    for expected in (
        "does not run `gantry migrate`",
        "not the control plane image",
        "would be pulled",
        "--database-url",
        "entrypoint differs",
        "no postgres_password secret",
        "secrets the control plane does not have",
        "no network with postgres",
        "restart 'on-failure'",
        "healthy postgres",
        "complete successfully",
    ):
        assert expected in problems
    del services["migrate"]
    services["controlplane"]["depends_on"]["ghost"] = {"condition": "service_healthy"}
    services["controlplane"]["networks"].append("nowhere")
    problems = " | ".join(compose_problems(doc))
    for expected in ("service migrate missing", "unknown service ghost", "network nowhere"):
        assert expected in problems


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
    bad_worker = {"kind": "Deployment", "spec": {"template": {"spec": bad_spec}}}
    worker = " | ".join(worker_problems(bad_worker))
    for expected in ("not a DaemonSet", "hostNetwork", "nodeSelector", "ports", "nvidia.com/gpu"):
        assert expected in worker
    assert grpc_probe_problems("cp", bad_worker, 50051) != []


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
