"""The deploy README's recipes run as pasted: tokens the services accept, a node's own credential,
a call to the OpenAI-compatible HTTP API.

The node and HTTP API recipes run for real in bash against a copy of deploy/, with grpcurl,
kubectl and curl replaced by stubs that record their arguments (no cluster or control plane
here); the stubbed grpcurl answers what the RPC would, rendered from the generated messages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import yaml
from google.protobuf import json_format

from gantry.common import tokens
from gantry.controlplane.endpoints.sealing import CredentialSealer
from gantry.controlplane.serving.openai_http.requests import embedding_call, json_object
from gantry.controlplane.serving.openai_http.server import parse_listen
from gantry.v1 import control_plane_pb2 as cp
from tests.unit.deploy_manifests_support import (
    COMPOSE,
    K8S,
    README,
    by_kind_name,
    k8s_docs,
    load_compose,
    option_value,
    pod_spec,
    secret_references,
    worker_workloads,
)
from tests.unit.test_deploy_k8s_workers import node_secret_sharing_problems, worker_problems

NODE_ID = "9eef26ac-af03-459a-91d8-450e53558069"
STUB_HOSTNAME = "gpu-host-1"
STUBS = {
    "grpcurl": 'printf "%s\\n" "$@" > "$STUB_LOG/grpcurl.args"\ncat "$STUB_LOG/response.json"\n',
    "kubectl": 'echo "$*" >> "$STUB_LOG/kubectl.log"\ncat > /dev/null\n',
    "hostname": f"echo {STUB_HOSTNAME}\n",
    "curl": 'printf "%s\\n" "$@" > "$STUB_LOG/curl.args"\necho \'{"object": "list"}\'\n',
}


def _recipe(target: str) -> str:
    text = README.read_text().replace("\\\n", "")
    match = re.search(rf'python3 -c "([^"]+)"\s*>\s*secrets/{re.escape(target)}', text)
    assert match, f"no recipe for secrets/{target} in {README}"
    return match.group(1)


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout


def test_the_operator_token_recipe_makes_an_operator_token():
    token = _run(_recipe("operator.token"))
    assert tokens.parse_token(token, kind=tokens.OPERATOR_TOKEN) is not None


def test_the_scheduler_token_recipe_makes_a_service_token():
    token = _run(_recipe("scheduler.token"))
    assert tokens.parse_token(token, kind=tokens.SERVICE_TOKEN) is not None


def test_the_endpoint_key_recipe_makes_a_key_the_control_plane_seals_with(tmp_path: Path):
    key_file = tmp_path / "endpoint.key"
    key_file.write_text(_run(_recipe("endpoint.key")))
    key_file.chmod(0o640)  # as the compose recipe leaves it: group 10001 reads it
    sealer = CredentialSealer.from_key_file(key_file)
    assert sealer.open(sealer.seal("sk-x"), endpoint_id="e") == "sk-x"
    assert "gantry-endpoint-key" in README.read_text()


# Node credentials: registration, one Secret per node, rotation.


def _shell_block(*needles: str) -> str:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if all(n in b for n in needles)]
    assert len(found) == 1, f"expected one sh block with {needles}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class RecipeRun:
    grpcurl_args: list[str]
    kubectl: list[str]
    curl_args: list[str]


def _lines(path: Path) -> list[str]:
    """What a stub recorded; nothing if the recipe never called it."""
    return path.read_text().splitlines() if path.exists() else []


def _checkout(tmp_path: Path) -> Path:
    """deploy/ as the recipes expect it: the manifests, the operator token, the CA."""
    deploy = tmp_path / "deploy"
    shutil.copytree(K8S, deploy / "k8s")
    (deploy / "secrets" / "tls").mkdir(parents=True)
    (deploy / "secrets" / "operator.token").write_text(f"gop_{NODE_ID}_operator")
    (deploy / "secrets" / "tls" / "ca.pem").write_text("CA")
    return deploy


def _run_recipe(script: str, cwd: Path, response: cp.RegisterNodeResponse) -> RecipeRun:
    log = cwd / ".stub-log"
    stubs = cwd / ".stubs"
    log.mkdir(exist_ok=True)
    stubs.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}")
        (stubs / name).chmod(0o755)
    (stubs / "python3").unlink(missing_ok=True)
    (stubs / "python3").symlink_to(sys.executable)
    (log / "response.json").write_text(
        json_format.MessageToJson(response, preserving_proto_field_name=True)
    )
    (log / "kubectl.log").write_text("")
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(log)}
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return RecipeRun(
        grpcurl_args=_lines(log / "grpcurl.args"),
        kubectl=_lines(log / "kubectl.log"),
        curl_args=_lines(log / "curl.args"),
    )


def _called(run: RecipeRun, method: str) -> dict[str, str]:
    """The RPC grpcurl was asked for exists and takes the fields sent; returns the request."""
    service = cp.DESCRIPTOR.services_by_name["ControlPlane"]
    assert f"gantry.v1.ControlPlane/{method}" in run.grpcurl_args
    request = json.loads(option_value(run.grpcurl_args, "-d") or "{}")
    fields = {f.name for f in service.methods_by_name[method].input_type.fields}
    assert set(request) <= fields, (method, request)
    assert "credential" in service.methods_by_name[method].output_type.fields_by_name
    assert run.grpcurl_args[-2].endswith(":50051"), "dials the control plane's port"
    return request


def _registered(name: str) -> cp.RegisterNodeResponse:
    credential = tokens.mint_token(tokens.NODE_CREDENTIAL, NODE_ID)
    return cp.RegisterNodeResponse(node=cp.Node(node_id=NODE_ID, name=name), credential=credential)


CONTROL_PLANE_CLIENTS = "gantry-controlplane.gantry.svc.cluster.local"
CONTROL_PLANE_WORKERS = "gantry-controlplane-workers.gantry.svc.cluster.local"


def _control_plane_host(worker: dict[str, object]) -> str:
    """The host the worker's --control-plane names (`dns:///NAME:PORT` or `NAME:PORT`)."""
    args = (pod_spec(worker) or {})["containers"][0]["args"]
    address = str(option_value(args, "--control-plane")).removeprefix("dns:///")
    return address.rsplit(":", 1)[0]


def _kustomized(k8s: Path) -> list[str]:
    return yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]


def _add_node_recipe(node: str | None = None) -> tuple[str, str]:
    script = _shell_block("RegisterNode", "NODE=")
    example = re.search(r"^NODE=(\S+)", script, re.M)
    assert example, "the recipe sets NODE"
    if node is None:
        return script, example.group(1)
    return script.replace(example.group(0), f"NODE={node}", 1), node


def test_the_add_a_node_recipe_gives_a_new_node_its_own_worker_and_secret(tmp_path: Path):
    script, node = _add_node_recipe()
    deploy = _checkout(tmp_path)
    response = _registered(node)
    run = _run_recipe(script, tmp_path, response)
    assert _called(run, "RegisterNode") == {"name": node}

    # Its worker: a new manifest, listed once, a sound worker next to the example's.
    manifest = f"worker-{node}.yaml"
    assert _kustomized(deploy / "k8s").count(manifest) == 1
    docs = k8s_docs(deploy / "k8s")
    worker = by_kind_name(docs, "Deployment", f"gantry-worker-{node}")
    assert worker_problems(worker) == []
    assert len(worker_workloads(docs)) == 2
    assert node_secret_sharing_problems(docs) == []
    # The recipe registers through the clients' Service; the worker dials the headless one, which
    # lists every replica (both names are on the control plane's certificate).
    assert option_value(run.grpcurl_args, "-authority") == CONTROL_PLANE_CLIENTS
    assert _control_plane_host(worker) == CONTROL_PLANE_WORKERS

    # Its credential, kept private, becomes the one Secret that worker mounts.
    credential = deploy / "secrets" / f"{node}.credential"
    assert credential.read_text() == response.credential
    assert stat.S_IMODE(credential.stat().st_mode) == 0o600
    secret = f"gantry-node-{node}"
    assert secret_references(pod_spec(worker) or {}) == {secret, "gantry-ca"}
    assert run.kubectl == [
        f"-n gantry create secret generic {secret} "
        f"--from-file=credential=deploy/secrets/{node}.credential",
        "apply -k deploy/k8s",
    ]

    # Pasted again: the manifest is still listed once.
    _run_recipe(script, tmp_path, response)
    assert _kustomized(deploy / "k8s").count(manifest) == 1


def test_the_add_a_node_recipe_leaves_the_example_node_as_shipped(tmp_path: Path):
    script, node = _add_node_recipe("node-a")
    deploy = _checkout(tmp_path)
    run = _run_recipe(script, tmp_path, _registered(node))
    for name in ("worker-node-a.yaml", "kustomization.yaml"):
        assert (deploy / "k8s" / name).read_bytes() == (K8S / name).read_bytes()
    # The Secret it creates is the one the shipped example mounts, and nothing else does.
    example = by_kind_name(k8s_docs(), "Deployment", "gantry-worker-node-a")
    (created,) = [line.split()[5] for line in run.kubectl if " create secret " in line]
    assert created in secret_references(pod_spec(example) or {})
    assert created == "gantry-node-node-a"


def test_the_rotation_recipe_replaces_only_that_nodes_secret_and_restarts_its_worker(
    tmp_path: Path,
):
    script = _shell_block("RotateNodeCredential")
    script = re.sub(r"^NODE=\S+", "NODE=node-a", script, count=1, flags=re.M)
    deploy = _checkout(tmp_path)
    old = tokens.mint_token(tokens.NODE_CREDENTIAL, NODE_ID)
    (deploy / "secrets" / "node-a.credential").write_text(old)
    response = _registered("node-a")
    run = _run_recipe(script, tmp_path, response)
    assert _called(run, "RotateNodeCredential") == {"node_id": NODE_ID}
    assert (deploy / "secrets" / "node-a.credential").read_text() == response.credential
    # Both ends of the pipe run at once, so the stub logs them in either order.
    assert sorted(run.kubectl) == [
        "-n gantry create secret generic gantry-node-node-a "
        "--from-file=credential=deploy/secrets/node-a.credential --dry-run=client -o yaml",
        "-n gantry rollout restart deploy/gantry-worker-node-a",
        "apply -f -",
    ]
    # Both name what the manifests define: the example worker and the Secret it mounts.
    example = by_kind_name(k8s_docs(), "Deployment", "gantry-worker-node-a")
    assert "gantry-node-node-a" in secret_references(pod_spec(example) or {})


def test_the_compose_recipe_registers_this_host_and_writes_the_workers_secret(tmp_path: Path):
    block = _shell_block("cd deploy", "RegisterNode")
    start = block.index("grpcurl ")
    end = block.index("sudo chgrp 10001 secrets/node.credential")
    deploy = _checkout(tmp_path)
    response = _registered(STUB_HOSTNAME)
    run = _run_recipe(f"umask 077\n{block[start:end]}", deploy, response)
    assert _called(run, "RegisterNode") == {"name": STUB_HOSTNAME}
    compose = load_compose()
    written = COMPOSE.parent / compose["secrets"]["node_credential"]["file"]
    assert written.resolve() == (COMPOSE.parent / "secrets" / "node.credential").resolve()
    assert (deploy / "secrets" / "node.credential").read_text() == response.credential
    worker_command = compose["services"]["worker"]["command"]
    host = str(option_value(worker_command, "--control-plane")).rsplit(":", 1)[0]
    assert option_value(run.grpcurl_args, "-authority") == host


def _all_values(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def test_the_http_api_recipe_calls_the_published_port_over_tls_with_a_client_key(
    tmp_path: Path,
):
    block = _shell_block("/v1/embeddings")
    deploy = _checkout(tmp_path)
    client_key = "gck_tenant_client-key"
    (deploy / "TEAM.key").write_text(client_key)
    run = _run_recipe(block, deploy, _registered(STUB_HOSTNAME))
    assert run.grpcurl_args == [] and run.kubectl == []
    args = run.curl_args
    (url,) = [a for a in args if "://" in a]
    parsed = urllib.parse.urlsplit(url)
    # HTTPS: the control plane serves the HTTP API with its gRPC port's certificate.
    assert (parsed.scheme, parsed.path) == ("https", "/v1/embeddings")
    compose = load_compose()
    controlplane = compose["services"]["controlplane"]
    ca = option_value(args, "--cacert")
    assert ca is not None and (deploy / ca).is_file()
    assert os.path.normpath(ca) == os.path.normpath(compose["secrets"]["gantry_ca"]["file"])
    assert option_value(controlplane["command"], "--tls-cert") is not None
    # --resolve NAME:PORT:ADDRESS: the URL's name and port, dialled at the published address.
    resolve = option_value(args, "--resolve")
    assert resolve is not None
    name, port, address = resolve.split(":")
    assert (name, int(port)) == (parsed.hostname, parsed.port)
    _, listen_port = parse_listen(str(option_value(controlplane["command"], "--http-listen")))
    published = f"${{GANTRY_PUBLISH_ADDR:-{address}}}:{port}:{listen_port}"
    assert published in controlplane["ports"]
    # The name checked is the one the grpcurl recipe checks, which the certificate names.
    worker_command = compose["services"]["worker"]["command"]
    assert name == str(option_value(worker_command, "--control-plane")).rsplit(":", 1)[0]
    # The client key as a Bearer token, and a body the HTTP API's own parser accepts.
    headers = [h.partition(":") for h in _all_values(args, "-H")]
    assert {k.strip().lower(): v.strip() for k, _, v in headers}["authorization"] == (
        f"Bearer {client_key}"
    )
    body = option_value(args, "-d")
    assert body is not None
    call = embedding_call(json_object(body.encode()))
    assert call.request.capability == "minilm"
    assert list(call.request.inputs) == ["Gantry keeps models resident."]
