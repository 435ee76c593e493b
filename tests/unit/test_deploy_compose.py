"""Static checks on deploy/compose.yaml: hardening, TLS, the migration gate, node credentials.

The file is parsed, not run (no Docker engine here). Each check returns a list of problems; the
last tests feed deliberately bad services to show that the checks can fail.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.unit.deploy_manifests_support import (
    APP_UID,
    COMPOSE,
    DEPLOY,
    NO_ML_SERVICES,
    SECRET_NAME,
    SERVICES,
    TLS_OPTIONS,
    URL_CREDENTIALS,
    Problems,
    load_compose,
    option_value,
    user_is_root,
)


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
    return load_compose()


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
    # Adopted endpoints' credentials stay readable across restarts: a key from a secret, which
    # only the control plane mounts.
    assert "--endpoint-key-file /run/secrets/endpoint.key" in controlplane
    assert secret_targets(services["controlplane"])["endpoint_key"] == "/run/secrets/endpoint.key"
    assert compose["secrets"]["endpoint_key"]["file"] == "./secrets/endpoint.key"
    assert [n for n, s in services.items() if "endpoint_key" in secret_targets(s)] == [
        "controlplane"
    ]
    scheduler = " ".join(map(str, services["scheduler"]["command"]))
    assert "--service-token-file /run/secrets/scheduler.token" in scheduler
    assert "--credential-file /run/secrets/node.credential" in " ".join(
        services["worker"]["command"]
    )
    # Everything in secrets/ is ignored but the ignore file and the README that says what goes
    # there (compose.yaml's secrets point at it).
    ignored = (DEPLOY / "secrets" / ".gitignore").read_text().splitlines()[1:]
    assert ignored == ["*", "!.gitignore", "!README"]
    listed = (DEPLOY / "secrets" / "README").read_text()
    assert "operator.token" in listed and "endpoint.key" in listed


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


def secret_targets(service: dict[str, Any]) -> dict[str, str]:
    """Secret name -> the file it becomes inside that service's containers."""
    targets = {}
    for secret in service.get("secrets") or []:
        if isinstance(secret, str):
            targets[secret] = f"/run/secrets/{secret}"
        else:
            targets[secret["source"]] = f"/run/secrets/{secret.get('target', secret['source'])}"
    return targets


def runs_the_worker(service: dict[str, Any]) -> bool:
    command = [str(c) for c in service.get("command") or []]
    return command[:1] == ["worker"] or str(service.get("image", "")).startswith("gantry/worker")


def node_credential_problems(doc: dict[str, Any]) -> Problems:
    """Each worker reads its own node's credential file and none of the other services' secrets.

    A node credential is a declared secret whose file ends in `.credential`.
    """
    declared = doc.get("secrets") or {}
    credentials = {n for n, s in declared.items() if str(s.get("file", "")).endswith(".credential")}
    services = doc.get("services") or {}
    workers = {name: s for name, s in services.items() if runs_the_worker(s)}
    problems: Problems = []
    if not workers:
        problems.append("no worker service")
    others = {
        source
        for name, service in services.items()
        if name not in workers
        for source in secret_targets(service)
    }
    owner: dict[str, str] = {}
    for name, service in workers.items():
        targets = secret_targets(service)
        mine = sorted(credentials & set(targets))
        if len(mine) != 1:
            problems.append(f"{name}: mounts {len(mine)} node credentials {mine}, expected 1")
            continue
        if mine[0] in owner:
            problems.append(f"{name}: shares node credential {mine[0]} with {owner[mine[0]]}")
        owner[mine[0]] = name
        path = option_value(service.get("command") or [], "--credential-file")
        if path != targets[mine[0]]:
            problems.append(f"{name}: --credential-file {path} is not its {mine[0]} secret")
        for source in sorted((set(targets) & others) - {"gantry_ca"}):
            problems.append(f"{name}: mounts {source}, a secret of another service")
    for name, service in services.items():
        if name not in workers:
            problems += [
                f"{name}: mounts node credential {s}"
                for s in sorted(credentials & set(secret_targets(service)))
            ]
    return problems


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


def test_compose_worker_reads_only_its_own_node_credential(compose: dict[str, Any]) -> None:
    assert node_credential_problems(compose) == []
    worker = compose["services"]["worker"]
    assert set(secret_targets(worker)) == {"node_credential", "gantry_ca"}
    assert compose["secrets"]["node_credential"]["file"] == "./secrets/node.credential"


# The checks themselves: each must reject a bad input.


def test_compose_tls_check_rejects_plaintext(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    plaintext = {**compose, "services": {"worker": {**worker, "secrets": ["node_credential"]}}}
    assert "is not one of its secrets" in " | ".join(compose_tls_problems(plaintext, "worker"))


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


def test_node_credential_check_rejects_shared_and_foreign_secrets() -> None:
    doc = load_compose()
    services = doc["services"]
    services["worker-2"] = dict(services["worker"])  # a second worker on the same credential
    services["worker"]["secrets"] = [*services["worker"]["secrets"], "operator_token"]
    services["controlplane"]["secrets"].append("node_credential")
    problems = " | ".join(node_credential_problems(doc))
    for expected in (
        "worker-2: shares node credential node_credential with worker",
        "worker: mounts operator_token, a secret of another service",
        "controlplane: mounts node credential node_credential",
    ):
        assert expected in problems
    services["worker-2"]["secrets"] = ["gantry_ca"]
    services["worker-2"]["command"] = ["worker", "--credential-file", "/run/secrets/other"]
    assert "worker-2: mounts 0 node credentials" in " | ".join(node_credential_problems(doc))
    services["worker"]["command"] = ["worker", "--credential-file", "/tmp/node.credential"]
    problems = " | ".join(node_credential_problems(doc))
    assert "--credential-file /tmp/node.credential is not its node_credential secret" in problems
