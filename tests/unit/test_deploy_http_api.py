"""deploy/ serves the control plane's OpenAI-compatible HTTP API, in compose and in Kubernetes.

`--http-listen HOST:PORT` makes the control plane serve it with the gRPC port's TLS settings
(`--tls-cert/--tls-key`: HTTPS with the same certificate; openai_http/server.py). Compose must
publish the port it listens on, as it publishes 50051; Kubernetes must name that port on the
container and the Service and admit it in the control plane's NetworkPolicy as 50051 is. The files
are parsed, not run (tests/integration/test_deploy_http_api_kustomize.py renders the kustomizations
where kubectl is installed). Each check returns a list of problems, and the last tests feed it bad
files to show that it can fail.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gantry.controlplane.serving.openai_http import HttpListenError
from gantry.controlplane.serving.openai_http.server import parse_listen
from tests.unit.deploy_manifests_support import (
    GRPC_PORTS,
    README,
    Doc,
    Docs,
    Problems,
    by_kind_name,
    k8s_docs,
    load_compose,
    option_value,
    pod_spec,
)

HTTP_PORT = 8080
ANY_ADDRESS = ("0.0.0.0", "::")
# The options that make the control plane's listeners TLS; the HTTP API takes the same ones.
SERVER_TLS_OPTIONS = ("--tls-cert", "--tls-key")


def http_listen(args: list[Any], where: str) -> tuple[tuple[str, int] | None, Problems]:
    """The (host, port) of the control plane's `--http-listen`, parsed as the server parses it."""
    value = option_value(args, "--http-listen")
    if value is None:
        return None, [f"{where}: no --http-listen: the HTTP API is not served"]
    try:
        host, port = parse_listen(value)
    except HttpListenError as exc:
        return None, [f"{where}: {exc}"]
    problems: Problems = []
    if host not in ANY_ADDRESS:
        problems.append(
            f"{where}: --http-listen {value} is not reachable from outside the container"
        )
    for option in SERVER_TLS_OPTIONS:
        if option_value(args, option) is None:
            problems.append(f"{where}: no {option}: the HTTP API would be plaintext")
    return (host, port), problems


def published_ports(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of each TCP port a compose service publishes."""
    published = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):
            if entry.get("protocol", "tcp") == "tcp":
                target = int(entry["target"])
                host_port = int(str(entry.get("published") or target))
                published.append((str(entry.get("host_ip", "")), host_port, target))
            continue
        spec, _, protocol = str(entry).partition("/")
        if protocol not in ("", "tcp"):
            continue
        # The address may be a variable with a default (`${VAR:-127.0.0.1}`): split from the end.
        parts = spec.rsplit(":", 2)
        if len(parts) == 3:
            published.append((parts[0], int(parts[1]), int(parts[2])))
        elif len(parts) == 2:
            published.append(("", int(parts[0]), int(parts[1])))
    return published


def compose_http_api_problems(doc: dict[str, Any]) -> Problems:
    services = doc.get("services") or {}
    controlplane = services.get("controlplane")
    if controlplane is None:
        return ["no controlplane service"]
    listen, problems = http_listen(controlplane.get("command") or [], "controlplane")
    if listen is None:
        return problems
    port = listen[1]
    published = published_ports(controlplane)
    http = [p for p in published if p[2] == port]
    grpc = [p for p in published if p[2] == GRPC_PORTS["controlplane"]]
    if not http:
        problems.append(f"controlplane: the HTTP API's port {port} is not published")
    elif grpc and {p[0] for p in http} != {p[0] for p in grpc}:
        problems.append(
            f"controlplane: the HTTP API is published on {sorted({p[0] for p in http})}, "
            f"the gRPC port on {sorted({p[0] for p in grpc})}"
        )
    networks = doc.get("networks") or {}
    if all((networks.get(n) or {}).get("internal") for n in controlplane.get("networks") or []):
        problems.append("controlplane: only internal networks, so no published port reaches it")
    return problems


def _policy_peers(policy: Doc, port: int) -> list[Any]:
    """The `from` of each ingress rule of `policy` that admits TCP `port` (absent: anyone)."""
    return [
        rule.get("from")
        for rule in (policy.get("spec") or {}).get("ingress") or []
        if any(
            p.get("port") == port and p.get("protocol", "TCP") == "TCP"
            for p in rule.get("ports") or []
        )
    ]


def k8s_http_api_problems(docs: Docs) -> Problems:
    deployment = by_kind_name(docs, "Deployment", "gantry-controlplane")
    spec = pod_spec(deployment) or {}
    container = next(c for c in spec.get("containers") or [] if c.get("name") == "controlplane")
    listen, problems = http_listen(container.get("args") or [], "controlplane")
    if listen is None:
        return problems
    port = listen[1]
    named = [p for p in container.get("ports") or [] if p.get("containerPort") == port]
    if len(named) != 1:
        problems.append(f"controlplane: {len(named)} container ports for the HTTP API's {port}")
        return problems
    container_port = named[0]
    service = by_kind_name(docs, "Service", "gantry-controlplane")
    targets = (container_port.get("name"), port)
    service_ports = [
        p for p in service["spec"].get("ports") or [] if p.get("targetPort") in targets
    ]
    if len(service_ports) != 1:
        problems.append(f"Service gantry-controlplane: {len(service_ports)} ports reach {port}")
    else:
        (service_port,) = service_ports
        if service_port.get("port") != port:
            problems.append(
                f"Service gantry-controlplane: the HTTP API on {service_port.get('port')}, "
                f"the container on {port}"
            )
        if service_port.get("name") != "http":
            problems.append(f"Service gantry-controlplane: port {port} is not named http")
    policy = by_kind_name(docs, "NetworkPolicy", "gantry-controlplane")
    http_peers = _policy_peers(policy, port)
    if not http_peers:
        problems.append(f"NetworkPolicy gantry-controlplane: does not admit {port}")
    elif http_peers != _policy_peers(policy, GRPC_PORTS["controlplane"]):
        problems.append(
            f"NetworkPolicy gantry-controlplane: admits {port} from other peers than "
            f"{GRPC_PORTS['controlplane']}"
        )
    return problems


@pytest.fixture
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture
def docs() -> Docs:
    return k8s_docs()


def test_compose_serves_and_publishes_the_http_api(compose: dict[str, Any]) -> None:
    assert compose_http_api_problems(compose) == []
    controlplane = compose["services"]["controlplane"]
    assert option_value(controlplane["command"], "--http-listen") == f"0.0.0.0:{HTTP_PORT}"
    # Published like 50051: loopback unless GANTRY_PUBLISH_ADDR says otherwise.
    assert published_ports(controlplane) == [
        ("${GANTRY_PUBLISH_ADDR:-127.0.0.1}", 50051, 50051),
        ("${GANTRY_PUBLISH_ADDR:-127.0.0.1}", HTTP_PORT, HTTP_PORT),
    ]


def test_k8s_serves_exposes_and_admits_the_http_api(docs: Docs) -> None:
    assert k8s_http_api_problems(docs) == []
    spec = pod_spec(by_kind_name(docs, "Deployment", "gantry-controlplane")) or {}
    (container,) = spec["containers"]
    assert option_value(container["args"], "--http-listen") == f"0.0.0.0:{HTTP_PORT}"
    assert {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"} in container["ports"]
    service = by_kind_name(docs, "Service", "gantry-controlplane")
    assert {
        "name": "http",
        "port": HTTP_PORT,
        "targetPort": "http",
        "protocol": "TCP",
        "appProtocol": "https",
    } in service["spec"]["ports"]


def test_deploy_readme_reaches_the_http_api_on_the_ports_deploy_serves(
    compose: dict[str, Any], docs: Docs
) -> None:
    """The curl recipe itself runs in test_deploy_readme_recipes.py; Kubernetes is prose."""
    readme = README.read_text().replace("\n", " ")
    service = by_kind_name(docs, "Service", "gantry-controlplane")
    (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http"]
    assert f"port-forward svc/gantry-controlplane {port}:{port}" in readme
    assert f"`--http-listen 0.0.0.0:{HTTP_PORT}`" in readme
    assert f"`127.0.0.1:{HTTP_PORT}`" in readme


# The checks themselves: each must reject a bad input.


def test_compose_http_api_check_rejects_an_unserved_or_unpublished_api(
    compose: dict[str, Any],
) -> None:
    def problems(change: Any) -> str:
        doc = copy.deepcopy(compose)
        change(doc["services"]["controlplane"], doc)
        return " | ".join(compose_http_api_problems(doc))

    def without(args: list[Any], option: str) -> None:
        index = args.index(option)
        del args[index : index + 2]

    def set_option(args: list[Any], option: str, value: str) -> None:
        args[args.index(option) + 1] = value

    assert "no --http-listen" in problems(lambda cp, _: without(cp["command"], "--http-listen"))
    assert "not HOST:PORT" in problems(
        lambda cp, _: set_option(cp["command"], "--http-listen", "8080")
    )
    assert "not reachable from outside the container" in problems(
        lambda cp, _: set_option(cp["command"], "--http-listen", "127.0.0.1:8080")
    )
    assert "--tls-key: the HTTP API would be plaintext" in problems(
        lambda cp, _: without(cp["command"], "--tls-key")
    )
    assert "port 9000 is not published" in problems(
        lambda cp, _: set_option(cp["command"], "--http-listen", "0.0.0.0:9000")
    )
    assert "port 8080 is not published" in problems(
        lambda cp, _: cp.update(ports=[cp["ports"][0], "127.0.0.1:8080:8081"])
    )
    assert "the gRPC port on" in problems(
        lambda cp, _: cp.update(ports=[cp["ports"][0], "0.0.0.0:8080:8080"])
    )
    assert "only internal networks" in problems(lambda cp, _: cp.update(networks=["db"]))
    # The long syntax is read too.
    long_form = problems(
        lambda cp, _: cp.update(
            ports=[
                {"target": 50051, "published": 50051, "host_ip": "127.0.0.1"},
                {"target": 8080, "published": 18080, "host_ip": "127.0.0.1"},
            ]
        )
    )
    assert long_form == ""


def test_k8s_http_api_check_rejects_an_unexposed_or_unadmitted_api(docs: Docs) -> None:
    def problems(change: Any) -> str:
        changed = copy.deepcopy(docs)
        by = {(d["kind"], d["metadata"]["name"]): d for _, d in changed}
        deployment = by["Deployment", "gantry-controlplane"]
        container = (pod_spec(deployment) or {})["containers"][0]
        change(
            container,
            by["Service", "gantry-controlplane"]["spec"],
            by["NetworkPolicy", "gantry-controlplane"]["spec"],
        )
        return " | ".join(k8s_http_api_problems(changed))

    def no_http_listen(container: Doc, *_: Any) -> None:
        args = container["args"]
        del args[args.index("--http-listen") : args.index("--http-listen") + 2]

    def drop_container_port(container: Doc, *_: Any) -> None:
        container["ports"] = [p for p in container["ports"] if p["name"] != "http"]

    def retarget_service(_: Doc, service: Doc, __: Doc) -> None:
        for port in service["ports"]:
            if port["name"] == "http":
                port["targetPort"] = "grpc"

    def move_service_port(_: Doc, service: Doc, __: Doc) -> None:
        for port in service["ports"]:
            if port["name"] == "http":
                port.update(name="web", port=80)

    def unadmit(_: Doc, __: Doc, policy: Doc) -> None:
        for rule in policy["ingress"]:
            rule["ports"] = [p for p in rule["ports"] if p["port"] != HTTP_PORT]

    def admit_from_monitoring_only(_: Doc, __: Doc, policy: Doc) -> None:
        unadmit(_, __, policy)
        monitoring = next(r for r in policy["ingress"] if "from" in r)
        monitoring["ports"].append({"protocol": "TCP", "port": HTTP_PORT})

    assert "no --http-listen" in problems(no_http_listen)
    assert "0 container ports for the HTTP API's 8080" in problems(drop_container_port)
    assert "0 ports reach 8080" in problems(retarget_service)
    moved = problems(move_service_port)
    assert "the HTTP API on 80, the container on 8080" in moved
    assert "not named http" in moved
    assert "does not admit 8080" in problems(unadmit)
    assert "from other peers than 50051" in problems(admit_from_monitoring_only)
